# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer server (plugins/module_utils/_peer/) as a real detached daemon on 127.0.0.1: files pinned at start,
a swap race against it, FIFOs, the kernels kind read by the kernel_cache HTTP store."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import stat
import threading
import time
import urllib.error
import urllib.request

import pytest
from unit_helpers import KEY, opts, tree, warm_cache

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.harvest import harvest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    SHA_NAME,
    cache_path,
    entry_parts,
    marker_path,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.catalog import Catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import (
    ensure_server,
    server_facts,
    start_server,
    stop_server,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import PeerError
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME

SECRET = b"ROOT-ONLY-SECRET-" * 4096


def _weights_dir(root, files):
    root.mkdir(parents=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
    listed = {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()}
    (root / MANIFEST_NAME).write_text(json.dumps({"repo_id": "lab/Tiny", "files": listed}))
    (root / MANIFEST_NAME).chmod(0o644)
    return root


def _get(url, headers=None):
    """``(status, body)``; HTTP errors are answers too."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


@pytest.fixture
def outside(tmp_path):
    """A root-only file outside the served directory: the oracle of every test below."""
    path = tmp_path / "outside" / "victim"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def served(tmp_path):
    started = []

    def start(directory, kind="weights", name="t"):
        run_dir = str(tmp_path / "run")
        state = start_server(str(directory), "127.0.0.1", 0, ttl=60, run_dir=run_dir, name=name, kind=kind)
        started.append((run_dir, name))
        return state

    yield start
    for run_dir, name in started:
        stop_server(run_dir, name)


def test_swap_race_serves_no_outside_byte(tmp_path, outside, served):
    data = os.urandom(256 << 10)
    root = _weights_dir(tmp_path / "w" / "Tiny", {"model.safetensors": data, "sub/extra.bin": data[:4096]})
    url = served(root)["url"]
    stop = threading.Event()
    swaps = [0]

    def swapper():
        # Swap the listed file for a symlink, then for a hard link to the outside file, and a listed directory
        # for a symlink to the outside directory, as fast as the kernel lets a user do it.
        real, aside = root / "model.safetensors", root / "model.safetensors.aside"
        sub, sub_aside = root / "sub", root / "sub.aside"
        while not stop.is_set():
            os.rename(real, aside)
            os.symlink(outside, real)
            os.unlink(real)
            os.link(outside, real)
            os.unlink(real)
            os.rename(aside, real)
            os.rename(sub, sub_aside)
            os.symlink(outside.parent, sub)
            (outside.parent / "extra.bin").write_bytes(SECRET[:4096])
            os.unlink(sub)
            os.rename(sub_aside, sub)
            swaps[0] += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    statuses = {}
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            for rel, want in (("model.safetensors", data), ("sub/extra.bin", data[:4096])):
                status, body = _get(url + rel)
                assert b"ROOT-ONLY-SECRET" not in body
                assert status != 200 or body == want
                statuses[status] = statuses.get(status, 0) + 1
    finally:
        stop.set()
        thread.join(5)
    assert swaps[0] > 100 and statuses.get(200, 0) > 0 and statuses.get(403, 0) + statuses.get(404, 0) > 0


def test_a_fifo_manifest_fails_fast(tmp_path):
    root = tmp_path / "w" / "Tiny"
    root.mkdir(parents=True)
    os.mkfifo(root / MANIFEST_NAME)
    errors = []

    def start():
        try:
            start_server(str(root), "127.0.0.1", run_dir=str(tmp_path / "run"), name="fifo")
        except PeerError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=start, daemon=True)
    began = time.monotonic()
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - began < 5
    assert len(errors) == 1 and f"{root}/{MANIFEST_NAME}: is a fifo, not a regular file" in errors[0]


def test_only_listed_regular_files_are_served(tmp_path, outside, served):
    root = _weights_dir(tmp_path / "w" / "Tiny", {"config.json": b"{}\n", "a.bin": b"a" * 100, "gone.bin": b"g"})
    (root / "gone.bin").unlink()
    (root / "unlisted.bin").write_bytes(b"not listed")
    os.mkfifo(root / "fifo.bin")
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["files"].update({"fifo.bin": {}, "link.bin": {}, "../victim": {}})
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    os.symlink(outside, root / "link.bin")
    state = served(root)
    url = state["url"]
    assert state["files"] == 3  # config.json, a.bin and the manifest
    for rel in ("unlisted.bin", "fifo.bin", "link.bin", "gone.bin", "..%2Fvictim", "%2e%2e/outside/victim"):
        assert _get(url + rel)[0] == 404, rel
    assert _get(url.rsplit("/", 2)[0] + "/" + "0" * 32 + "/a.bin")[0] == 404
    assert _get(url + "a.bin", {"Range": "bytes=90-"}) == (206, b"a" * 10)
    assert _get(url + "a.bin", {"Range": "bytes=100-"})[0] == 416
    # Replaced after the start (same name and size, another inode): refused, never the new content.
    (root / "a.bin.new").write_bytes(b"b" * 100)
    os.replace(root / "a.bin.new", root / "a.bin")
    assert _get(url + "a.bin")[0] == 403
    assert _get(url + "config.json") == (200, b"{}\n")


def test_state_files_are_private(tmp_path, served):
    root = _weights_dir(tmp_path / "w" / "Tiny", {"a.bin": os.urandom(4 << 20)})
    state = served(root, name="priv")
    assert _get(state["url"] + "a.bin")[0] == 200
    run_dir = tmp_path / "run"
    stats = run_dir / "priv.json.stats"
    deadline = time.monotonic() + 5
    while not stats.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in (run_dir / "priv.json", stats):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert state["token"] not in stats.read_text()
    assert stop_server(str(run_dir), "priv")[1] == 4 << 20


def test_run_dir_of_another_user_and_linked_directory_are_refused(tmp_path):
    root = _weights_dir(tmp_path / "w" / "Tiny", {"a.bin": b"a"})
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1000, 1000)
    with pytest.raises(PeerError, match="belongs to uid 1000"):
        start_server(str(root), "127.0.0.1", run_dir=str(theirs), name="x")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    os.symlink(root, shared / "Tiny")
    with pytest.raises(PeerError, match="symbolic link in a directory that a non-root user can write"):
        start_server(str(shared / "Tiny"), "127.0.0.1", run_dir=str(tmp_path / "run"), name="x")


# ---------------------------------------------------------------------------
# kind kernels: a real kernel store spool, read by the kernel_cache HTTP store


needs_zstd = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


@needs_zstd
def test_kernels_kind_serves_complete_entries_to_the_http_store(tmp_path, served):
    spool = tmp_path / "spool"
    _root, files = warm_cache(str(tmp_path / "peer"))
    harvest(opts(tmp_path / "peer", warmed=True), PathStore(str(spool)))
    entry = spool.joinpath(*entry_parts(KEY))
    # An entry without its manifest is incomplete (a pack in progress, or one that died): nothing of it is served.
    partial = spool / KEY["model_name"] / KEY["mesh"] / KEY["impl_id"] / "deadbee" / "none"
    partial.mkdir(parents=True)
    (partial / ARCHIVE_NAME).write_bytes(b"half")
    (partial / SHA_NAME).write_text("0" * 64 + "  kernels.tar.zst\n")
    (entry / "extra.txt").write_text("not an entry file")
    state = served(spool, kind="kernels")
    assert state["files"] == 3 and state["kind"] == "kernels"
    url = state["url"]
    base = "/".join(entry_parts(KEY))
    for rel in (
        f"{KEY['model_name']}/{KEY['mesh']}/{KEY['impl_id']}/deadbee/none/{ARCHIVE_NAME}",
        f"{base}/extra.txt",
    ):
        assert _get(url + rel)[0] == 404, rel
    archive = (entry / ARCHIVE_NAME).read_bytes()
    assert _get(url + f"{base}/{ARCHIVE_NAME}", {"Range": "bytes=10-19"}) == (206, archive[10:20])

    remote = HttpStore(url, timeout=10)
    got = deploy(opts(tmp_path / "puller"), remote)
    assert got["changed"] and tree(cache_path(str(tmp_path / "puller"), KEY)) == files
    # The path token is the server's secret: neither the result nor the marker (readable by every user) shows it.
    marker = pathlib.Path(marker_path(str(tmp_path / "puller"), KEY)).read_text()
    assert state["token"] not in json.dumps(got) and state["token"] not in marker
    missing = deploy(opts(tmp_path / "other", tt_metal_commit="deadbee", vllm_commit=""), remote)
    assert missing["missing"] and not missing["changed"]


@needs_zstd
def test_kernels_kind_needs_a_complete_entry_and_pins_what_it_found(tmp_path):
    spool = tmp_path / "spool"
    with pytest.raises(PeerError, match="cannot open"):
        Catalog(str(spool), "kernels")
    spool.mkdir()
    with pytest.raises(PeerError, match="holds no complete kernel store entry"):
        Catalog(str(spool), "kernels")
    warm_cache(str(tmp_path / "peer"))
    harvest(opts(tmp_path / "peer", warmed=True), PathStore(str(spool)))
    with Catalog(str(spool), "kernels") as first:
        digest = first.digest
    entry = spool.joinpath(*entry_parts(KEY))
    shutil.copyfile(entry / ARCHIVE_NAME, entry / "new")
    os.replace(entry / "new", entry / ARCHIVE_NAME)
    with Catalog(str(spool), "kernels") as second:
        # A re-packed archive is another inode: a running server for the spool is restarted, not kept.
        assert second.digest != digest and len(second.files) == 3


def test_ensure_server_keeps_a_fresh_server_and_restarts_one_for_changed_files(tmp_path):
    """What weights_server state=started and model_weights serve share: the same files keep the running server (same
    URL, no change), check mode starts nothing, changed files get a new server with a new token."""
    root = _weights_dir(tmp_path / "w", {"a.safetensors": b"A" * 1000})
    run_dir = str(tmp_path / "run")
    changed, first = ensure_server(str(root), "m", bind="127.0.0.1", ttl=60, run_dir=run_dir)
    try:
        assert changed and first is not None
        assert _get(first["url"] + "a.safetensors") == (200, b"A" * 1000)
        assert server_facts(first) == {
            "url": first["url"],
            "port": first["port"],
            "pid": first["pid"],
            "files": 2,  # the file and the manifest
            "address": "127.0.0.1",
        }
        again, kept = ensure_server(str(root), "m", bind="127.0.0.1", ttl=60, run_dir=run_dir)
        assert not again and kept is not None and kept["url"] == first["url"]
        (root / "a.safetensors").write_bytes(b"B" * 2000)  # another size: other files for the catalog
        would, none = ensure_server(str(root), "m", bind="127.0.0.1", ttl=60, run_dir=run_dir, check_mode=True)
        assert would and none is None
        assert _get(first["url"] + "a.safetensors")[0] == 403  # still the old server: check mode stopped nothing
        changed, second = ensure_server(str(root), "m", bind="127.0.0.1", ttl=60, run_dir=run_dir)
        assert changed and second is not None and second["url"] != first["url"]
        assert _get(second["url"] + "a.safetensors") == (200, b"B" * 2000)
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(first["url"] + "a.safetensors", timeout=5)
    finally:
        stop_server(run_dir, "m")
    with pytest.raises(PeerError, match="ttl at least 1"):
        ensure_server(str(root), "m", bind="127.0.0.1", ttl=0, run_dir=run_dir)
