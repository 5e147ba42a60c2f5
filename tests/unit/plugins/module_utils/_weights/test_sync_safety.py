# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights against what the container user (uid 1000) can plant in a volume, on a real filesystem.

Each case puts a root-only victim (file or directory, mode 0600/0700) outside the volume, plants links, FIFOs or
foreign-owned staging where uid 1000 could, runs the root-run code and checks that the victim's content, owner
and mode are unchanged, that nothing blocks, and that the weights come out right and root's. The hub is a small
in-process stand-in for the Hugging Face tree and resolve endpoints.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
from types import MappingProxyType

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import sync as sync_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import identity_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    PART_SUFFIX,
    STAGING_NAME,
    WeightsError,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.place import WRITABLE_SUBDIRS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import list_path_source
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.staging import STAGING_STATE
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

REPO = "ttfleet-lab/Tiny"


SHA = "a" * 40


UID = 1000


FILES = {
    "config.json": b'{"model_type": "llama"}\n',
    "model.safetensors": b"w" * 300_000,
    "sub/tokenizer.json": b'{"v": 1}\n',
}


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the layout and the planted files need root")


def _blob(content):
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class _Response(io.BytesIO):
    status = 200
    headers = MappingProxyType({})


class FakeHub:
    """The Hub endpoints ``list_hf_source`` and ``fetch_hf`` use, serving ``FILES`` (as git blobs)."""

    endpoint = "https://hub.test"
    token = None

    def __init__(self, files=None):
        self.files = FILES if files is None else files
        self.opened = []

    def list_tree(self, repo_id, sha):
        return [{"type": "file", "path": p, "size": len(c), "oid": _blob(c)} for p, c in self.files.items()]

    def file_url(self, repo_id, sha, path):
        return path

    def open(self, url, what, repo_id, headers=None, deadline=None, size=None):
        self.opened.append(url)
        return _Response(self.files[url])


def _volume(tmp_path, owner=UID):
    """A volume as an older release left it: volume and weights owned by the container user."""
    volume = tmp_path / "volume_id_tt_transformers-Tiny-v0.1.0"
    (volume / "weights").mkdir(parents=True)
    for path in (volume, volume / "weights"):
        os.chown(path, owner, owner)
    return volume


def _opts(dest, **extra):
    options = {
        "dest": str(dest),
        "source": "hf",
        "repo_id": REPO,
        "revision": SHA,
        "workers": 2,
        "disk_margin_gb": 0,
        "host": "lab-1",
        "ignore_patterns": [],
    }
    options.update(extra)
    return options


def _assert_weights(dest, files=None, owner=(0, 0)):
    files = FILES if files is None else files
    for rel, content in files.items():
        st = os.lstat(dest / rel)
        assert stat.S_ISREG(st.st_mode), rel
        assert (dest / rel).read_bytes() == content
        assert ((st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode)) == (owner, 0o644), rel
    for path in (dest, dest / "sub"):
        st = os.lstat(path)
        assert ((st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode)) == (owner, 0o755)
    manifest = dest / MANIFEST_NAME
    assert stat.S_ISREG(os.lstat(manifest).st_mode)
    assert set(json.loads(manifest.read_text())["files"]) == set(files)


def _staging(dest):
    return dest.parent / STAGING_NAME / dest.name


def _plant_staging(dest, owner=UID, mode=0o755):
    """Staging of this source as uid 1000 could leave it: its own directories and a matching state file."""
    staging = _staging(dest)
    staging.mkdir(parents=True)
    state = {"identity": identity_of("hf", REPO, SHA), "files": {}}
    (staging / STAGING_STATE).write_text(json.dumps(state))
    for path in (staging.parent, staging, staging / STAGING_STATE):
        os.chown(path, owner, owner, follow_symlinks=False)
    os.chmod(staging.parent, mode)
    os.chmod(staging, mode)
    return staging


# ---------------------------------------------------------------------------
# Staging (Broke 2)


def test_part_file_linked_to_a_root_only_file_is_never_written(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    staging = _plant_staging(dest)
    (staging / ("config.json" + PART_SUFFIX)).symlink_to(victim["file"])
    # A "finished" file the user staged with a state claiming it was checked: never trusted.
    (staging / "model.safetensors").write_bytes(b"evil" * 75_000)
    state = json.loads((staging / STAGING_STATE).read_text())
    state["files"]["model.safetensors"] = {"expected": f"blob:{_blob(FILES['model.safetensors'])}", "size": 300_000}
    (staging / STAGING_STATE).write_text(json.dumps(state))

    plan = sync_weights(_opts(dest), check_mode=True, hub=FakeHub())
    assert plan["plan"]["bytes_staged"] == 0  # a staging directory that is not root's 0700 counts for nothing
    result = sync_weights(_opts(dest), hub=FakeHub())
    assert result["fetched_bytes"] == sum(len(c) for c in FILES.values())
    _assert_weights(dest)
    assert not (dest.parent / STAGING_NAME).exists()


def test_staging_directory_linked_to_a_root_only_directory(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    (dest.parent / STAGING_NAME).symlink_to(victim["dir"])
    sync_weights(_opts(dest), hub=FakeHub())
    _assert_weights(dest)
    assert not os.path.lexists(dest.parent / STAGING_NAME)


def test_links_and_fifos_inside_root_staging_are_replaced_not_followed(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    staging = _plant_staging(dest, owner=0, mode=0o700)
    os.unlink(staging / STAGING_STATE)
    os.mkfifo(staging / STAGING_STATE)
    (staging / ("config.json" + PART_SUFFIX)).symlink_to(victim["file"])
    os.mkfifo(staging / ("model.safetensors" + PART_SUFFIX))
    assert sync_weights(_opts(dest), check_mode=True, hub=FakeHub())["plan"]["bytes_staged"] == 0
    sync_weights(_opts(dest), hub=FakeHub())
    _assert_weights(dest)


def test_resume_keeps_a_root_staging_directory(tmp_path, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"

    class Stop(Exception):
        pass

    def stop(done, total, file):
        if file == "model.safetensors" and done > 100_000:
            raise Stop

    class Slow(FakeHub):
        def open(self, url, what, repo_id, headers=None, deadline=None, size=None):
            resp = super().open(url, what, repo_id, headers)
            resp.read = lambda amount=None, read=resp.read: read(min(amount or 1 << 20, 50_000))
            return resp

    with pytest.raises(Stop):
        sync_weights(_opts(dest), callback=stop, hub=Slow())
    staging = _staging(dest)
    for path in (staging.parent, staging):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    part = staging / ("model.safetensors" + PART_SUFFIX)
    assert stat.S_IMODE(os.lstat(part).st_mode) == 0o600
    assert sync_weights(_opts(dest), check_mode=True, hub=FakeHub())["plan"]["bytes_staged"] > 0
    sync_weights(_opts(dest), hub=FakeHub())
    _assert_weights(dest)


# ---------------------------------------------------------------------------
# The destination (Broke 3)


def test_dest_swapped_for_a_link_to_a_root_only_directory(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    dest.symlink_to(victim["dir"])
    for check_mode in (True, False):
        with pytest.raises(WeightsError, match=r"symbolic link .*not followed; move it away"):
            sync_weights(_opts(dest), check_mode=check_mode, hub=FakeHub())
    with pytest.raises(WeightsError, match="symbolic link"):
        sync_weights(_opts(dest, source="none", container_owner=UID))


def test_weights_directory_swapped_for_a_link(tmp_path, victim, no_hang):
    volume = _volume(tmp_path)
    os.rmdir(volume / "weights")
    (volume / "weights").symlink_to(victim["dir"])
    with pytest.raises(WeightsError, match="symbolic link"):
        sync_weights(_opts(volume / "weights" / "Tiny", container_owner=UID), hub=FakeHub())


def test_a_link_in_place_of_a_directory_inside_dest(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    dest.mkdir()
    os.chown(dest, UID, UID)
    (dest / "sub").symlink_to(victim["dir"])
    with pytest.raises(WeightsError, match="sub is a symlink or file where the model needs a directory"):
        sync_weights(_opts(dest), hub=FakeHub())


def test_fifos_in_place_of_a_weights_file_and_the_manifest(tmp_path, victim, no_hang):
    dest = _volume(tmp_path) / "weights" / "Tiny"
    sync_weights(_opts(dest), hub=FakeHub())
    os.unlink(dest / "config.json")
    os.mkfifo(dest / "config.json")
    os.unlink(dest / MANIFEST_NAME)
    os.mkfifo(dest / MANIFEST_NAME)
    (dest / "tokenizer.model").symlink_to(victim["file"])
    plan = sync_weights(_opts(dest), check_mode=True, hub=FakeHub())
    assert plan["plan"]["to_fetch"] == ["config.json"]
    assert plan["verified"] == "sha256"  # the manifest counts as absent
    assert plan["skipped"] == ["tokenizer.model"]
    result = sync_weights(_opts(dest), hub=FakeHub())
    assert result["fetched_bytes"] == len(FILES["config.json"])
    _assert_weights(dest)
    assert result["skipped"] == ["tokenizer.model"]
    assert os.readlink(dest / "tokenizer.model") == str(victim["file"])


# ---------------------------------------------------------------------------
# A path source (Broke 4)


def _source(tmp_path, owner=(0, 0), mode=0o644):
    src = tmp_path / "src" / "Tiny"
    for rel, content in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(content)
        os.chown(src / rel, *owner)
        os.chmod(src / rel, mode)
    return src


def test_path_source_with_a_link_to_a_root_only_file(tmp_path, victim, no_hang):
    src = _source(tmp_path, owner=(UID, UID))
    (src / "secret.json").symlink_to(victim["file"])
    dest = _volume(tmp_path) / "weights" / "Tiny"
    for check_mode in (True, False):
        with pytest.raises(WeightsError, match=r"holds secret\.json, a symlink: .*never follows a link"):
            sync_weights(_opts(dest, source="path", path=str(src)), check_mode=check_mode)
    assert not dest.exists()
    # Left out by the patterns, the link is harmless.
    sync_weights(_opts(dest, source="path", path=str(src), ignore_patterns=["secret.json"]))
    _assert_weights(dest)


def test_path_source_with_a_fifo_and_a_directory_link(tmp_path, victim, no_hang):
    src = _source(tmp_path)
    os.mkfifo(src / "pipe.bin")
    (src / "more").symlink_to(victim["dir"])
    dest = _volume(tmp_path) / "weights" / "Tiny"
    with pytest.raises(WeightsError, match=r"holds more, a symlink \(and 1 more links or special files\)"):
        sync_weights(_opts(dest, source="path", path=str(src)))


def test_path_source_file_swapped_for_a_link_after_listing(tmp_path, victim, no_hang, monkeypatch):
    src = _source(tmp_path, owner=(UID, UID))
    dest = _volume(tmp_path) / "weights" / "Tiny"
    real = list_path_source

    def listed_then_swapped(*args, **kwargs):
        files = real(*args, **kwargs)
        os.unlink(src / "config.json")
        (src / "config.json").symlink_to(victim["file"])
        return files

    monkeypatch.setattr(sync_module, "list_path_source", listed_then_swapped)
    with pytest.raises(WeightsError, match=r"config\.json.*symbolic link"):
        sync_weights(_opts(dest, source="path", path=str(src)))
    assert not (dest / "config.json").exists()


def test_copies_never_take_the_source_owner_or_mode(tmp_path, no_hang):
    # Same filesystem, but owned by the container user (and group-writable): copied, not linked.
    src = _source(tmp_path, owner=(UID, UID), mode=0o664)
    dest = _volume(tmp_path) / "weights" / "Tiny"
    result = sync_weights(_opts(dest, source="path", path=str(src)))
    assert result["fetched_bytes"] == sum(len(c) for c in FILES.values())
    _assert_weights(dest)
    for rel in FILES:
        assert os.stat(dest / rel).st_ino != os.stat(src / rel).st_ino
        st = os.stat(src / rel)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (UID, 0o664)
    # Root's 0644 files on the same filesystem are shared by hardlinks.
    root_src = tmp_path / "root-src"
    os.rename(src, root_src)
    for rel in FILES:
        os.chown(root_src / rel, 0, 0)
        os.chmod(root_src / rel, 0o644)
    dest2 = tmp_path / "vol2" / "weights" / "Tiny"
    assert sync_weights(_opts(dest2, source="path", path=str(root_src)))["fetched_bytes"] == 0
    assert os.stat(dest2 / "config.json").st_ino == os.stat(root_src / "config.json").st_ino


# ---------------------------------------------------------------------------
# The ownership layout and its migration


def _layout(volume):
    found = {}
    for rel in (".", "weights", "weights/Tiny", "weights/Tiny/config.json", *WRITABLE_SUBDIRS):
        st = os.lstat(volume / rel)
        found[rel] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return found


def test_migration_from_a_volume_of_the_container_user(tmp_path, no_hang):
    volume = _volume(tmp_path)
    dest = volume / "weights" / "Tiny"
    # What an older release wrote: everything the container user's, including the writable directories.
    old = sync_weights(_opts(dest, owner=UID, group=UID), hub=FakeHub())
    assert old["changed"]
    _assert_weights(dest, owner=(UID, UID))
    (volume / "tt_metal_cache").mkdir(mode=0o775)
    os.chmod(volume / "tt_metal_cache", 0o775)
    os.chown(volume / "tt_metal_cache", UID, UID)
    (volume / "tt_metal_cache" / "kernel.bin").write_bytes(b"k")
    os.chmod(volume / "tt_metal_cache" / "kernel.bin", 0o600)
    (dest / "notes.txt").symlink_to("/etc/shadow")

    planned = sync_weights(_opts(dest, container_owner=UID), check_mode=True, hub=FakeHub())
    assert planned["changed"] and planned["fetched_bytes"] == 0
    assert "." in planned["plan"]["attrs"] and "config.json" in planned["plan"]["attrs"]
    assert any(line.startswith(f"{volume}: owner {UID}:{UID}") for line in planned["plan"]["layout"])
    assert f"{volume / 'logs'}: create, owner {UID}:{UID} mode 0755" in planned["plan"]["layout"]
    assert "owner or mode to fix: ." in planned["diff"]["before"]
    assert "volume: " in planned["diff"]["before"] and "volume: laid out" in planned["diff"]["after"]
    _assert_weights(dest, owner=(UID, UID))  # check mode changed nothing
    assert not (volume / "logs").exists()

    migrated = sync_weights(_opts(dest, container_owner=UID), hub=FakeHub())
    assert migrated["changed"] and migrated["fetched_bytes"] == 0 and migrated["hashed"] == []
    assert migrated["skipped"] == ["notes.txt"]
    _assert_weights(dest)
    layout = _layout(volume)
    assert {rel: layout[rel] for rel in (".", "weights", "weights/Tiny")} == dict.fromkeys(
        (".", "weights", "weights/Tiny"), (0, 0, 0o755)
    )
    assert layout["tt_metal_cache"] == (UID, UID, 0o775)  # its mode and contents are the server's
    assert stat.S_IMODE(os.lstat(volume / "tt_metal_cache" / "kernel.bin").st_mode) == 0o600
    for name in ("logs", "model_file_symlinks_map", "huggingface"):
        assert layout[name] == (UID, UID, 0o755)
    assert os.readlink(dest / "notes.txt") == "/etc/shadow"

    again = sync_weights(_opts(dest, container_owner=UID), hub=FakeHub())
    assert not again["changed"]
    assert (again["plan"]["attrs"], again["plan"]["layout"]) == ([], [])
    assert again["diff"]["before"] == again["diff"]["after"]
    assert _layout(volume) == layout


def test_source_none_lays_out_a_factory_volume(tmp_path, no_hang):
    volume = _volume(tmp_path)
    dest = volume / "weights" / "Tiny"
    for rel, content in FILES.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(content)
    (dest / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(dest / "run.sh", 0o775)
    for current, dirs, names in os.walk(volume):
        for name in dirs + names:
            os.chown(os.path.join(current, name), UID, UID)

    result = sync_weights(_opts(dest, source="none", container_owner=UID))
    assert result["changed"] and result["plan"]["to_fetch"] == []
    assert not (dest / MANIFEST_NAME).exists()  # source none records nothing
    st = os.lstat(dest / "run.sh")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert _layout_of_files(dest) == {rel: (0, 0o644) for rel in FILES}
    assert not sync_weights(_opts(dest, source="none", container_owner=UID))["changed"]
    with pytest.raises(WeightsError, match="does not exist; source none only"):
        sync_weights(_opts(volume / "weights" / "Other", source="none"))
    with pytest.raises(WeightsError, match="is not <volume>/weights/<model>"):
        sync_weights(_opts(volume / "Other", source="none", container_owner=UID))


def _layout_of_files(dest):
    return {rel: (os.lstat(dest / rel).st_uid, stat.S_IMODE(os.lstat(dest / rel).st_mode)) for rel in FILES}


def test_a_hardlink_to_a_root_only_file_is_not_made_readable(tmp_path, victim, no_hang):
    volume = _volume(tmp_path)
    dest = volume / "weights" / "Tiny"
    sync_weights(_opts(dest, owner=UID, group=UID), hub=FakeHub())
    # Where fs.protected_hardlinks is off, uid 1000 can link a root-only file into its weights.
    os.link(victim["file"], dest / "stolen")
    with contextlib.suppress(WeightsError):
        sync_weights(_opts(dest, container_owner=UID), hub=FakeHub())
    os.unlink(dest / "stolen")  # the victim fixture then checks mode, owner and link count


def test_an_alias_in_a_root_directory_is_followed_and_one_in_a_user_directory_is_not(tmp_path, victim, no_hang):
    # volume_alias writes relative links (with "..") in the volume root, which only root can change.
    factory = _volume(tmp_path / "home")
    os.chown(tmp_path / "home", UID, UID)
    root = tmp_path / "tt-cache"
    root.mkdir(mode=0o755)
    (root / "volume_id_tt_transformers-Tiny-v0.2.0").symlink_to(os.path.join("..", "home", factory.name))
    dest = root / "volume_id_tt_transformers-Tiny-v0.2.0" / "weights" / "Tiny"
    sync_weights(_opts(dest, container_owner=UID), hub=FakeHub())
    _assert_weights(factory / "weights" / "Tiny")
    assert os.lstat(factory / "tt_metal_cache").st_uid == UID
    # The same link where the container user can write it is never followed.
    user_root = tmp_path / "user-cache"
    user_root.mkdir()
    os.chown(user_root, UID, UID)
    (user_root / "volume_id_tt_transformers-Tiny-v0.2.0").symlink_to(victim["dir"])
    with pytest.raises(WeightsError, match="symbolic link in a directory that a non-root user can write"):
        sync_weights(
            _opts(user_root / "volume_id_tt_transformers-Tiny-v0.2.0" / "weights" / "Tiny"), hub=FakeHub()
        )
