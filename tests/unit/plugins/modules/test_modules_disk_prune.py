# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""disk_prune's run (_plan/prune_host.py and the module) on real directories, with a stand-in of dockerd's API on a
Unix socket: check, apply, check again, apply again; report-only; resumed trash; no engine; a broken engine."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socketserver
import threading
import typing
import urllib.parse

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import TRASH_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import REPORT_ONLY
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune_host import prune
from ansible_collections.ttfleet.inference.plugins.modules import disk_prune

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="top-level entries must be root's, as on a host")

MODEL = "Qwen3-32B"
V14 = f"volume_id_tt_transformers-{MODEL}-v0.14.0"
V17 = f"volume_id_tt_transformers-{MODEL}-v0.17.0"
V18 = f"volume_id_tt_transformers-{MODEL}-v0.18.0"
V19 = f"volume_id_tt_transformers-{MODEL}-v0.19.0"
V20 = f"volume_id_tt_transformers-{MODEL}-v0.20.0"
QB2 = f"volume_id_tt_transformers-{MODEL}-vqb2_launch"
REPO = "ghcr.io/tenstorrent/tt-inference-server/vllm"
KEY = {"model_name": MODEL, "mesh": "P300x2", "impl_id": "tt_transformers", "tt_metal_commit": "b204341"}


def write(path, size=4096):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
    return path


class _Engine(http.server.BaseHTTPRequestHandler):
    answers: typing.ClassVar[dict] = {}
    deleted: typing.ClassVar[list] = []

    def address_string(self):
        return "docker.sock"

    def log_message(self, *_args):
        return

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        status, body = self.answers.get(self.path.split("?")[0], (404, {"message": "no such thing"}))
        self._send(status, body)

    def do_DELETE(self):
        self.deleted.append(urllib.parse.unquote(self.path[len("/images/") :]))
        self._send(200, [{"Untagged": self.path}])


@contextlib.contextmanager
def engine(tmp_path, containers, images, status=200):
    """A stand-in of dockerd's API (containers, images, image removal) on a Unix socket."""
    path = str(tmp_path / "docker.sock")
    handler = type("Handler", (_Engine,), {"answers": {}, "deleted": []})
    handler.answers = {"/containers/json": (status, containers), "/images/json": (status, images)}

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    server = Server(path, handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Engine(path), handler.deleted
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def host(tmp_path):
    """A host after a few upgrades: volumes of several releases (one a hardlinked new-commit volume, one an alias
    mounted by a container), a factory volume, a kernel cache moved aside, stale staging, a spool, releases."""
    vol = tmp_path / "tt-cache"
    weights = write(f"{vol}/{V14}/weights/{MODEL}/model.safetensors", 1 << 20)
    write(f"{vol}/{V14}/tt_metal_cache/cache_{MODEL}/P300x2/k.bin", 200_000)
    write(f"{vol}/{V19}/tt_metal_cache/cache_{MODEL}/P300x2/k.bin", 200_000)
    os.makedirs(f"{vol}/{V19}/weights/{MODEL}")
    os.link(weights, f"{vol}/{V19}/weights/{MODEL}/model.safetensors")
    write(f"{vol}/{V19}/tt_metal_cache/cache_{MODEL}/P300x2.ttfleet-aside-20261201T000000Z/k.bin", 300_000)
    write(f"{vol}/{V17}/tt_metal_cache/cache_{MODEL}/P300x2/k.bin", 100_000)
    os.symlink(V17, f"{vol}/{V18}")
    write(f"{vol}/{QB2}/weights/{MODEL}/model.safetensors", 50_000)
    write(f"{vol}/.ttfleet-staging/{V14}/part", 70_000)
    write(f"{vol}/.ttfleet-staging/{V20}/part", 70_000)
    spool = tmp_path / "spool"
    write(f"{spool}/{MODEL}/P300x2/tt_transformers/b204341/none/kernels.tar.zst", 30_000)
    write(f"{spool}/{MODEL}/P300x2/tt_transformers/0ld0ld0/none/kernels.tar.zst", 40_000)
    rel = tmp_path / "opt-tt"
    for n, tag in enumerate(["v0.14.0", "v0.17.0", "v0.18.0", "v0.19.0"]):
        write(f"{rel}/releases/{tag}/.ttfleet-release.json", 10)
        os.utime(f"{rel}/releases/{tag}/.ttfleet-release.json", (1000 + n, 1000 + n))
        write(f"{rel}/venvs/{tag}/bin/python", 20_000)
    os.symlink("releases/v0.19.0", f"{rel}/current")
    os.symlink("releases/v0.18.0", f"{rel}/previous")
    containers = [{"Id": "c1", "Names": ["/tt-qwen"], "ImageID": "sha-a", "Mounts": [{"Source": f"{vol}/{V18}"}]}]
    images = [
        {"Id": "sha-a", "RepoTags": [f"{REPO}:0.19"], "Size": 1000},
        {"Id": "sha-b", "RepoTags": [f"{REPO}:0.14"], "Size": 2000},
        {"Id": "sha-c", "RepoTags": ["debian:12"], "Size": 3000},
    ]
    options = {
        "volume_root": str(vol),
        "needed_volumes": [V19, V20],
        "remove": [],
        "kinds": ["volumes", "kernel_caches", "staging", "spool", "images", "releases"],
        "spool_dirs": [str(spool)],
        "needed_kernel_keys": [{**KEY, "vllm_commit": None}],
        "release_root": str(rel),
        "release_keep": 1,
        "image_repositories": [REPO],
        "needed_images": [f"{REPO}:0.19"],
        "time_limit": 60,
        "report_file": str(tmp_path / "report" / "report.json"),
    }
    return tmp_path, options, containers, images


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def listing(top):
    found = (os.path.relpath(os.path.join(d, n), top) for d, ds, fs in os.walk(top) for n in ds + fs)
    return sorted(rel for rel in found if rel != "docker.sock")


def test_check_apply_check_apply(host):
    top, options, containers, images = host
    before = listing(top)
    with engine(top, containers, images) as (eng, deleted):
        check = prune(options, check_mode=True, engine=eng)
        assert listing(top) == before and deleted == []
        assert not os.path.exists(options["report_file"])
        items = {(i["kind"], i["name"]): i for i in check["items"]}
        removed = sorted(key for key, i in items.items() if i["action"] == "remove")
        assert removed == [
            ("images", f"{REPO}:0.14"),
            ("kernel_caches", f"{V19}/tt_metal_cache/cache_{MODEL}/P300x2.ttfleet-aside-20261201T000000Z"),
            ("releases", "releases/v0.14.0"),
            ("releases", "releases/v0.17.0"),
            ("releases", "venvs/v0.14.0"),
            ("releases", "venvs/v0.17.0"),
            ("spool", f"{top}/spool:{MODEL}/P300x2/tt_transformers/0ld0ld0/none"),
            ("staging", V14),
            ("volumes", V14),
        ]
        # The alias mounted by a container stays, and so does its target (the mount's directory, by its inode); the
        # factory volume and V20's staging stay.
        mounted = f"in use: container tt-qwen mounts {top}/tt-cache/{V18}"
        assert items[("volumes", V18)]["note"] == items[("volumes", V17)]["note"] == mounted
        assert items[("volumes", QB2)]["action"] == "keep"
        # The old volume's weights are hardlinked into V19: removing it frees only its kernel cache and directories.
        assert 200_000 <= items[("volumes", V14)]["bytes"] < 1 << 20
        assert check["changed"] and check["reclaimed_bytes"] == 0
        assert check["diff"]["before"] != check["diff"]["after"]

        status = top / "status.json"
        applied = prune({**options, "status_file": str(status)}, check_mode=False, engine=eng)
        assert deleted == [f"{REPO}:0.14"]
        progress = read_json(status)
        assert progress["state"] == "done" and progress["done_bytes"] == applied["reclaimed_bytes"] - 2000
        assert applied["reclaimed_bytes"] == check["reclaimable_bytes"] == applied["reclaimable_bytes"]
        assert applied["pending"] == [] and applied["changed"]
        assert not os.path.exists(f"{top}/tt-cache/{V14}") and not os.path.exists(f"{top}/opt-tt/venvs/v0.17.0")
        assert not os.path.exists(f"{top}/spool/{MODEL}/P300x2/tt_transformers/0ld0ld0")
        assert os.path.exists(f"{top}/tt-cache/{V19}/weights/{MODEL}/model.safetensors")
        assert not os.path.exists(f"{top}/tt-cache/{TRASH_NAME}")
        report = read_json(options["report_file"])
        assert (report["reclaimable_bytes"], report["items_count"], report["volume_root"]) == (0, 0, f"{top}/tt-cache")
        assert oct(os.stat(options["report_file"]).st_mode & 0o777) == "0o644"

        images[1:2] = []
        again = prune(options, check_mode=True, engine=eng)
        assert not again["changed"] and again["diff"]["before"] == again["diff"]["after"]
        assert not prune(options, check_mode=False, engine=eng)["changed"]


def test_report_only_removes_nothing_and_reports_what_could_go(host):
    top, options, containers, images = host
    before = listing(top)
    with engine(top, containers, images) as (eng, deleted):
        full = prune(options, check_mode=True, engine=eng)
        result = prune({**options, "kinds": []}, check_mode=False, engine=eng)
    assert listing(top) == sorted([*before, "report", "report/report.json"])
    assert deleted == [] and not result["changed"]
    assert result["reclaimable_bytes"] == full["reclaimable_bytes"] > 0
    assert {i["note"] for i in result["items"] if i["reason"] and i["action"] == "skip"} == {REPORT_ONLY}
    report = read_json(options["report_file"])
    assert report["reclaimable_bytes"] == full["reclaimable_bytes"]
    assert report["items_count"] == 9 and report["by_kind"]["images"] == 2000


def test_trash_left_by_an_earlier_run_is_resumed(host):
    top, options, containers, images = host
    left = f"{top}/tt-cache/{TRASH_NAME}"
    os.mkdir(left, 0o700)
    write(f"{left}/volumes.{V14}.0123456789abcdef/a/b", 10_000)
    with engine(top, containers, images) as (eng, _deleted):
        result = prune({**options, "kinds": ["volumes"]}, check_mode=False, engine=eng)
    resumed = [i for i in result["items"] if i["note"] == "resumed"]
    assert [(i["kind"], i["name"], i["action"]) for i in resumed] == [("volumes", V14, "remove")]
    assert not os.path.exists(left) and result["changed"]


def test_mounted_volume_by_inode_and_a_named_needed_volume_are_refused_with_messages(host):
    top, options, containers, images = host
    # The container mounts a subdirectory of V14 through a path that is not V14's text (a bind of a bind).
    os.symlink(f"{top}/tt-cache/{V14}", f"{top}/elsewhere")
    containers[0]["Mounts"] = [{"Source": f"{top}/elsewhere/weights"}]
    with engine(top, containers, images) as (eng, _deleted):
        result = prune({**options, "remove": [V14, V19, "volume_id_nothing-here-v1.0.0"]}, True, engine=eng)
    items = {i["name"]: i for i in result["items"]}
    assert items[V14]["action"] == "keep" and "mounts" in items[V14]["note"]
    left = result["left_alone"]
    assert any(m.startswith(f"remove names {V19}, but it is kept: needed by a kept release") for m in left)
    assert any("volume_id_nothing-here-v1.0.0, which is not found" in m for m in result["left_alone"])


def test_no_engine_skips_images_and_a_broken_engine_keeps_every_volume(host, tmp_path):
    top, options, _containers, images = host
    result = prune(options, check_mode=True, engine=Engine(str(tmp_path / "absent.sock")))
    assert not [i for i in result["items"] if i["kind"] == "images"]
    assert any("no Docker engine answers" in m and "images are skipped" in m for m in result["left_alone"])
    with engine(top, {"message": "boom"}, images, status=500) as (eng, _deleted):
        result = prune(options, check_mode=True, engine=eng)
    vols = [i for i in result["items"] if i["kind"] == "volumes"]
    assert vols and all(i["action"] == "keep" for i in vols)
    assert any("could not list its containers" in m for m in result["left_alone"])


def test_module_fails_on_bad_input_naming_it(tmp_path, capsys):
    args = {"volume_root": str(tmp_path), "release_root": str(tmp_path), "time_limit": 0}
    with patch_module_args(args), pytest.raises(SystemExit):
        disk_prune.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and "time_limit is 0" in out["msg"]
