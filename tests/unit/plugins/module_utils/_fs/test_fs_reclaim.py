# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_fs/reclaim.py on real directories: sizes with hardlinks, the root-only trash, bounded and resumed removal."""

from __future__ import annotations

import os
import time

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import (
    TRASH_NAME,
    check_top,
    empty,
    freed,
    open_trash,
    to_trash,
    trash_label,
    usage,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import MAX_TREE_DEPTH

ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not ROOT, reason="owners other than the test's own need root")


def write(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
    return path


def blocks(*paths):
    return sum(os.lstat(path).st_blocks * 512 for path in paths)


@pytest.fixture
def top(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def test_a_hardlinked_file_counts_only_when_every_link_is_removed(top):
    path, fd = top
    weights = write(f"{path}/old/weights/model.safetensors", 1 << 20)
    os.makedirs(f"{path}/new/weights")
    os.link(weights, f"{path}/new/weights/model.safetensors")
    kernels = write(f"{path}/old/tt_metal_cache/k.bin", 300_000)
    dirs = [f"{path}/old", f"{path}/old/weights", f"{path}/old/tt_metal_cache"]
    old, new = usage(fd, "old"), usage(fd, "new")
    # Removing the old volume frees its kernel cache and directories, not the weights the new one shares.
    assert old.bytes == blocks(kernels, *dirs)
    assert freed([old, new]) == old.bytes + new.bytes + blocks(weights)
    assert blocks(weights) >= 1 << 20


def test_a_link_is_an_inode_of_its_own_and_never_followed(top):
    path, fd = top
    outside = write(f"{path}/outside/big", 1 << 20)
    os.makedirs(f"{path}/vol")
    os.symlink(outside, f"{path}/vol/link")
    os.symlink(f"{path}/outside", f"{path}/vol/dirlink")
    found = usage(fd, "vol")
    assert found.entries == 3
    assert found.bytes < 1 << 20


def test_a_directory_that_became_a_link_is_refused_naming_its_path(top, monkeypatch):
    path, fd = top
    os.makedirs(f"{path}/vol/a/b")
    real_lstat = os.lstat

    def lstat_then_swap(name, *args, **kwargs):
        found = real_lstat(name, *args, **kwargs)
        # The user's move between the lstat and the open: vol/a/b is a link now.
        if name == "b" and not os.path.islink(f"{path}/vol/a/b"):
            os.rmdir(f"{path}/vol/a/b")
            os.symlink("/", f"{path}/vol/a/b")
        return found

    monkeypatch.setattr(os, "lstat", lstat_then_swap)
    with pytest.raises(SafeFileError, match=f"^{path}/vol/a/b: is a symlink, not a directory"):
        usage(fd, "vol", str(path))


def test_a_tree_deeper_than_the_layer_allows_is_refused_naming_the_path(top):
    path, fd = top
    deep = os.path.join(path, "vol", *["d"] * (MAX_TREE_DEPTH + 2))
    os.makedirs(deep)
    with pytest.raises(SafeFileError, match=f"vol/{'d/' * 10}.*nested more than {MAX_TREE_DEPTH}"):
        usage(fd, "vol")


def test_bounded_removal_leaves_pending_trash_that_the_next_call_finishes(top):
    path, fd = top
    files = [write(f"{path}/vol/d{n % 7}/f{n}", 5000) for n in range(600)]
    expected = usage(fd, "vol").bytes
    trash = open_trash(fd, str(path), create=True)
    try:
        moved = to_trash(fd, "vol", trash, "volumes")
        assert trash_label(moved) == ("volumes", "vol")
        assert not os.path.exists(f"{path}/vol")
        done, pending, first, problems = empty(trash, [moved], time.monotonic())
        assert (done, pending, problems) == ([], [moved], [])
        done, pending, second, problems = empty(trash, [moved], time.monotonic() + 60)
        assert (done, pending, problems) == ([moved], [], [])
        assert first + second == expected
        assert os.listdir(f"{path}/{TRASH_NAME}") == []
        assert not any(os.path.exists(f) for f in files)
    finally:
        os.close(trash)


def test_removal_in_the_trash_frees_a_shared_inode_only_with_its_last_link(top):
    path, fd = top
    shared = write(f"{path}/a/w", 1 << 20)
    os.makedirs(f"{path}/b")
    os.link(shared, f"{path}/b/w")
    trash = open_trash(fd, str(path), create=True)
    try:
        one = to_trash(fd, "a", trash, "volumes")
        _done, _pending, gone, _problems = empty(trash, [one], None)
        assert gone < 1 << 20
        two = to_trash(fd, "b", trash, "volumes")
        _done, _pending, gone, _problems = empty(trash, [two], None)
        assert gone >= 1 << 20
    finally:
        os.close(trash)


def test_the_trash_is_root_only_and_one_open_to_others_is_refused(top):
    path, fd = top
    trash = open_trash(fd, str(path), create=True)
    os.close(trash)
    st = os.lstat(f"{path}/{TRASH_NAME}")
    assert (st.st_mode & 0o777, st.st_uid) == (0o700, os.geteuid())
    os.chmod(f"{path}/{TRASH_NAME}", 0o755)
    with pytest.raises(SafeFileError, match=f"{TRASH_NAME}: is owned by uid .* or open to others"):
        open_trash(fd, str(path), create=True)
    os.rmdir(f"{path}/{TRASH_NAME}")
    os.symlink(f"{path}/elsewhere", f"{path}/{TRASH_NAME}")
    os.makedirs(f"{path}/elsewhere", mode=0o700)
    with pytest.raises(SafeFileError, match="is a symlink, not a directory"):
        open_trash(fd, str(path), create=True)


@root_only
def test_a_trash_that_another_user_made_is_refused(top):
    path, fd = top
    os.mkdir(f"{path}/{TRASH_NAME}", 0o700)
    os.chown(f"{path}/{TRASH_NAME}", 1000, 1000)
    with pytest.raises(SafeFileError, match="is owned by uid 1000"):
        open_trash(fd, str(path), create=True)


def test_check_top_refuses_links_special_files_and_other_owners(top):
    path, fd = top
    os.makedirs(f"{path}/real")
    os.symlink("real", f"{path}/link")
    os.mkfifo(f"{path}/fifo")
    owners = (os.geteuid(),)
    assert check_top(fd, "real", "/w", owners)
    with pytest.raises(SafeFileError, match=r"^/w/link: is a symbolic link where a directory was expected"):
        check_top(fd, "link", "/w", owners)
    with pytest.raises(SafeFileError, match=r"^/w/fifo: is a fifo, not a directory"):
        check_top(fd, "fifo", "/w", owners)
    with pytest.raises(SafeFileError, match=f"^/w/real: is owned by uid {os.geteuid()}, not root"):
        check_top(fd, "real", "/w", (4242,))
