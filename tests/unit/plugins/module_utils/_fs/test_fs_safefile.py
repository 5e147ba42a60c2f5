# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The safe-file layer on a real filesystem: links are never followed where a user could plant them, special
files are never opened, new names are random and exclusive, modes and owners change on descriptors."""

from __future__ import annotations

import contextlib
import os
import stat
import threading

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import create_temp, write_atomic, write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import makedirs, open_dir, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file, read_bytes, read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes, human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import (
    MAX_TREE_DEPTH,
    copy_file,
    own_tree,
    remove_tree,
    walk,
)

ROOT = os.geteuid() == 0


@pytest.fixture()
def tree(tmp_path):
    """A user-writable directory (mode 0777, as a hostile volume is) with a root-only victim beside it."""
    volume = tmp_path / "volume"
    volume.mkdir()
    volume.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret\n")
    victim.chmod(0o600)
    return volume, victim


def _victim_intact(victim):
    st = victim.lstat()
    return victim.read_bytes() == b"secret\n" and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_open_dir_refuses_a_link_in_a_writable_directory(tree):
    volume, victim = tree
    (volume / "weights").symlink_to(victim.parent)
    with pytest.raises(SafeFileError, match="symbolic link in a directory that a non-root user can write"):
        open_dir(str(volume / "weights"))


@pytest.mark.skipif(not ROOT, reason="a root-only directory needs root")
def test_open_dir_follows_a_link_in_a_root_only_directory(tmp_path):
    trusted = tmp_path / "trusted"
    trusted.mkdir(mode=0o755)
    (tmp_path / "real").mkdir()
    (trusted / "alias").symlink_to(tmp_path / "real")
    fd = open_dir(str(trusted / "alias"))
    try:
        assert os.fstat(fd).st_ino == (tmp_path / "real").stat().st_ino
    finally:
        os.close(fd)


def test_open_dir_refuses_dotdot_and_relative_paths():
    for bad in ("relative/path", "/tmp/../etc", "/tmp/\0x"):
        with pytest.raises(SafeFileError):
            open_dir(bad)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "socket"])
def test_open_file_refuses_everything_but_a_regular_file(tree, kind):
    volume, victim = tree
    name = volume / "model.safetensors.index.json"
    if kind == "fifo":
        os.mkfifo(name)
    elif kind == "symlink":
        name.symlink_to(victim)
    elif kind == "directory":
        name.mkdir()
    else:
        import socket

        sock = socket.socket(socket.AF_UNIX)
        # Bound by its name in the volume: a socket path is limited to 107 bytes, which a deep tmp_path can pass.
        with contextlib.chdir(volume):
            sock.bind(name.name)
        sock.close()
    with opened_dir(str(volume)) as dirfd:
        result = {}

        def attempt():
            try:
                read_json(dirfd, name.name)
            except SafeFileError as exc:
                result["error"] = str(exc)

        worker = threading.Thread(target=attempt, daemon=True)
        worker.start()
        worker.join(5)
        assert not worker.is_alive(), "a special file blocked the read"
    assert "not a regular file" in result["error"] or "not followed" in result["error"]
    assert _victim_intact(victim)


def test_read_bytes_caps_size_and_reports_missing(tree):
    volume, _victim = tree
    (volume / "big").write_bytes(b"x" * 100)
    with opened_dir(str(volume)) as dirfd:
        assert read_bytes(dirfd, "absent", 10) is None
        with pytest.raises(SafeFileError, match="larger than 10 bytes"):
            read_bytes(dirfd, "big", 10)


def test_read_json_names_bad_content(tree):
    volume, _victim = tree
    (volume / "list.json").write_text("[1, 2]")
    (volume / "bad.json").write_text("{")
    with opened_dir(str(volume)) as dirfd:
        with pytest.raises(SafeFileError, match=r"list\.json: does not hold a JSON object"):
            read_json(dirfd, "list.json")
        with pytest.raises(SafeFileError, match=r"bad\.json: is not valid JSON"):
            read_json(dirfd, "bad.json")


def test_write_atomic_never_writes_through_a_planted_link(tree):
    volume, victim = tree
    # Every predictable name a careless writer might use points at the victim.
    for pid in range(os.getpid(), os.getpid() + 50):
        (volume / f".ttfleet-tmp-marker.json.{pid}").symlink_to(victim)
    (volume / "marker.json").symlink_to(victim)
    with opened_dir(str(volume)) as dirfd:
        write_json(dirfd, "marker.json", {"a": 1}, mode=0o644, owner=(os.getuid(), os.getgid()))
        assert read_json(dirfd, "marker.json") == {"a": 1}
    assert (volume / "marker.json").is_file() and not (volume / "marker.json").is_symlink()
    assert _victim_intact(victim)
    assert not [p for p in volume.iterdir() if p.name.startswith(".ttfleet-tmp-") and not p.is_symlink()]


def test_write_atomic_refuses_to_replace_a_directory(tree):
    volume, _victim = tree
    (volume / "marker.json").mkdir()
    with opened_dir(str(volume)) as dirfd, pytest.raises(SafeFileError, match="is a directory"):
        write_atomic(dirfd, "marker.json", b"{}")
    assert (volume / "marker.json").is_dir()
    assert [p.name for p in volume.iterdir()] == ["marker.json"]


def test_create_temp_is_random_and_exclusive(tree):
    volume, _victim = tree
    with opened_dir(str(volume)) as dirfd:
        names = set()
        for _attempt in range(20):
            fd, name = create_temp(dirfd, "part")
            os.close(fd)
            names.add(name)
        assert len(names) == 20
        assert all(n.startswith(".ttfleet-tmp-part.") for n in names)


def test_makedirs_refuses_a_link_on_the_way_and_creates_with_owner(tree):
    volume, victim = tree
    (volume / "tt_metal_cache").symlink_to(victim.parent)
    with opened_dir(str(volume)) as dirfd:
        with pytest.raises(SafeFileError, match="tt_metal_cache: is a symlink"):
            makedirs(dirfd, "tt_metal_cache/cache_X/P300x2")
        fd = makedirs(dirfd, "weights/Qwen3-32B", mode=0o750, owner=(os.getuid(), os.getgid()))
        os.close(fd)
    assert stat.S_IMODE((volume / "weights" / "Qwen3-32B").stat().st_mode) == 0o750
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim", "volume"]


def test_walk_reports_links_and_never_enters_them(tree):
    volume, victim = tree
    (volume / "a").mkdir()
    (volume / "a" / "f").write_text("x")
    (volume / "a" / "out").symlink_to(victim.parent)
    with opened_dir(str(volume)) as dirfd:
        seen = {(rel, name): stat.S_IFMT(st.st_mode) for rel, _fd, entries in walk(dirfd) for name, st in entries}
    assert seen[("a", "out")] == stat.S_IFLNK
    assert not any(rel.startswith("a/out") for rel, _name in seen)


def test_remove_tree_removes_links_not_their_targets(tree):
    volume, victim = tree
    (volume / "old" / "sub").mkdir(parents=True)
    (volume / "old" / "sub" / "link").symlink_to(victim)
    (volume / "old" / "dirlink").symlink_to(victim.parent)
    with opened_dir(str(volume)) as dirfd:
        remove_tree(dirfd, "old")
        remove_tree(dirfd, "never-there")
    assert not (volume / "old").exists()
    assert _victim_intact(victim)


def _nest(dirfd, depth, leaf=b"x"):
    """``depth`` directories d/d/d/... below ``dirfd``, made on descriptors (the path may pass PATH_MAX), with a
    file and a link in each."""
    fds = [os.dup(dirfd)]
    try:
        for _level in range(depth):
            os.mkdir("d", dir_fd=fds[-1])
            fd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1])
            fds.append(fd)
            os.symlink("/", "to-root", dir_fd=fd)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as handle:
                handle.write(leaf)
    finally:
        for fd in fds:
            os.close(fd)


def _unnest(dirfd):
    """Remove what ``_nest`` made, bottom up and without recursion: a tree deeper than Python's recursion limit
    left in tmp_path crashes pytest's own clean-up of old base temp dirs (shutil.rmtree recurses) in a later run."""
    fds = [os.dup(dirfd)]
    try:
        while "d" in os.listdir(fds[-1]):
            fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        while len(fds) > 1:
            fd = fds.pop()
            for name in os.listdir(fd):
                os.unlink(name, dir_fd=fd)
            os.close(fd)
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("depth", [1, 50, MAX_TREE_DEPTH])
def test_remove_tree_removes_deep_trees_without_recursion(tree, depth):
    volume, victim = tree
    with opened_dir(str(volume)) as dirfd:
        _nest(dirfd, depth)
        remove_tree(dirfd, "d")
    assert not (volume / "d").exists()
    assert _victim_intact(victim)


def test_remove_tree_refuses_a_tree_deeper_than_its_limit_with_a_clear_error(tree):
    # Deeper than Python's recursion limit: the recursive version crashed with RecursionError.
    volume, victim = tree
    with opened_dir(str(volume)) as dirfd:
        _nest(dirfd, 1200)
        try:
            with pytest.raises(SafeFileError, match=f"nested more than {MAX_TREE_DEPTH} directories deep"):
                remove_tree(dirfd, "d")
            assert (volume / "d").is_dir()
            assert _victim_intact(victim)
            assert len(os.listdir("/proc/self/fd")) < 64, "remove_tree left descriptors open"
        finally:
            _unnest(dirfd)
    assert not (volume / "d").exists()


@pytest.mark.skipif(not ROOT, reason="changing owners needs root")
def test_own_tree_reowns_files_and_dirs_and_leaves_links_and_fifos(tree):
    volume, victim = tree
    weights = volume / "weights"
    (weights / "sub").mkdir(parents=True)
    (weights / "config.json").write_text("{}")
    (weights / "run.sh").write_text("#!/bin/sh\n")
    (weights / "run.sh").chmod(0o700)
    (weights / "link").symlink_to(victim)
    os.mkfifo(weights / "fifo")
    for p in (weights, weights / "sub", weights / "config.json", weights / "run.sh"):
        os.lchown(p, 1000, 1000)
    with opened_dir(str(weights)) as dirfd:
        changed, skipped = own_tree(dirfd, (0, 0), 0o755, 0o644, exec_mode=0o755)
        assert changed == 4
        assert sorted(skipped) == ["fifo", "link"]
        assert own_tree(dirfd, (0, 0), 0o755, 0o644, exec_mode=0o755) == (0, ["fifo", "link"])
    assert (weights / "config.json").stat().st_uid == 0
    assert stat.S_IMODE((weights / "config.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((weights / "run.sh").stat().st_mode) == 0o755
    assert _victim_intact(victim)


@pytest.mark.skipif(not ROOT, reason="a root-owned hard link needs root")
def test_set_attrs_never_widens_a_hardlinked_root_file(tree):
    volume, victim = tree
    os.link(victim, volume / "config.json")
    with opened_dir(str(volume)) as dirfd:
        fd, st = open_file(dirfd, "config.json")
        try:
            with pytest.raises(SafeFileError, match="several hard links"):
                set_attrs(fd, 0o644, (0, 0), st)
        finally:
            os.close(fd)
    assert _victim_intact(victim)


def test_copy_file_refuses_links_and_caps_bytes(tree):
    volume, victim = tree
    (volume / "src").mkdir()
    (volume / "dst").mkdir()
    (volume / "src" / "a").write_bytes(b"abc")
    (volume / "src" / "b").symlink_to(victim)
    with opened_dir(str(volume / "src")) as src, opened_dir(str(volume / "dst")) as dst:
        assert copy_file(src, "a", dst, "a", mode=0o640) == 3
        with pytest.raises(SafeFileError, match="not followed"):
            copy_file(src, "b", dst, "b")
        with pytest.raises(SafeFileError, match="larger than 2 bytes"):
            copy_file(src, "a", dst, "c", limit=2)
    assert (volume / "dst" / "a").read_bytes() == b"abc"
    assert stat.S_IMODE((volume / "dst" / "a").stat().st_mode) == 0o640
    assert sorted(p.name for p in (volume / "dst").iterdir()) == ["a"]
    assert _victim_intact(victim)


def test_human_bytes_and_free_bytes(tmp_path):
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert free_bytes(str(tmp_path / "not" / "yet")) > 0
    with opened_dir(str(tmp_path)) as fd:
        assert free_bytes(fd) > 0
