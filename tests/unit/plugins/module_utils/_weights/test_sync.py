# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the whole step (_weights.sync) and the module, against the real Hub protocol of a real olah server.

The olah tests serve tests/lab/hf_model.py's small real model (safetensors shards as LFS objects, small
files as plain git blobs) from a local mirrors path, fully offline, on a free port of 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, patch_module_args
from http_servers import QuietHandler, serve, url
from unit_helpers import make_tree

from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import fetch as fetch_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import hashing as hashing_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import plan as plan_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import sync as sync_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import hash_file
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import Hub
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_IGNORE_PATTERNS,
    PART_SUFFIX,
    STAGING_NAME,
    WeightsError,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
from ansible_collections.ttfleet.inference.plugins.modules import model_weights as model_weights_module

# Shaped like an HF token, assembled at run time so no token-like string is committed.
TOKEN = "hf_" + "ttfleetTEST" + "token0123456789abcdef"


REPO = "ttfleet-lab/Tiny-Llama-2L"


def _load_lab_module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", "lab", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hf_model = _load_lab_module("hf_model")
# Its free_port picks below the ephemeral range, where no outgoing connection takes the port before olah binds it.
hf_mirror = _load_lab_module("hf_mirror")


def test_module_refuses_and_masks_credentials_in_the_s3_endpoint(tmp_path, capsys):
    args = {
        "dest": str(tmp_path / "weights" / "M"),
        "source": "s3",
        "repo_id": REPO,
        "revision": "c" * 40,
        "s3_endpoint": "http://AKID:s3cr3t@s3.lab:9000",
        "s3_bucket": "models",
        "s3_access_key": "AKID",
        "s3_secret_key": "another-secret",
    }
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_weights_module.main()
    out = capsys.readouterr().out
    assert exc.value.code == 1
    assert "s3cr3t" not in out and "another-secret" not in out
    assert "set s3_access_key and s3_secret_key instead" in json.loads(out)["msg"]
    assert not (tmp_path / "weights").exists()


def test_url_password_is_masked_whatever_order_the_no_log_values_are_replaced_in():
    # ansible-core 2.16 replaces no_log values in set order: "AKID" (the no_log access key) replaced before
    # "AKID:s3cr3t" would leave ":s3cr3t" readable, unless the password is a no_log value of its own.
    from ansible.module_utils.common.parameters import remove_values

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_url_credentials

    module = types.SimpleNamespace(params={"s3_endpoint": "http://AKID:s3cr3t@s3.lab:9000"}, no_log_values={"AKID"})
    assert mask_url_credentials(module, ("s3_endpoint", "peer_url"))
    assert "s3cr3t" in module.no_log_values
    for first in ("AKID", "AKID:s3cr3t"):
        masked = remove_values(module.params["s3_endpoint"], [first, *sorted(module.no_log_values - {first})])
        assert "s3cr3t" not in masked, masked


# ---------------------------------------------------------------------------
# The real protocol, against olah


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    pytest.importorskip("olah")
    base = tmp_path_factory.mktemp("olah")
    model = hf_model.build(str(base / "mirrors"), REPO)
    port = hf_mirror.free_port("127.0.0.1")
    config = base / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{base / "repos"}"\nmirrors-path = ["{base / "mirrors"}"]\n'
        "[accessibility]\noffline = true\n"
    )
    cli = os.path.join(os.path.dirname(sys.executable), "olah-cli")
    log = open(base / "olah.log", "wb")  # noqa: SIM115 - kept open for the server's lifetime
    proc = subprocess.Popen([cli, "-c", str(config)], cwd=base, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/api/models/{REPO}/revision/main", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"olah did not start: {(base / 'olah.log').read_text()[-2000:]}")
        time.sleep(0.2)
    model["endpoint"] = endpoint
    model["fetched"] = {rel: info for rel, info in model["files"].items() if not rel.startswith("original/")}
    yield model
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _opts(hub, dest, **extra):
    options = {
        "dest": str(dest),
        "source": "hf",
        "repo_id": REPO,
        "revision": hub["sha"],
        "hf_endpoint": hub["endpoint"],
        "owner": os.getuid(),
        "group": os.getgid(),
        "workers": 4,
        "disk_margin_gb": 0,
        "host": "lab-1",
        "timeout": 30,
        "ignore_patterns": list(DEFAULT_IGNORE_PATTERNS),
    }
    options.update(extra)
    return options


def _dest_files(dest):
    found = {}
    for current, _dirs, names in os.walk(dest):
        for name in names:
            rel = os.path.relpath(os.path.join(current, name), dest)
            with open(os.path.join(current, name), "rb") as handle:
                found[rel] = handle.read()
    return found


def _assert_model(hub, dest):
    files = _dest_files(dest)
    manifest = json.loads(files.pop(MANIFEST_NAME))
    files.pop("notes.txt", None)
    assert files == {rel: hub["content"][rel] for rel in hub["fetched"]}
    assert manifest["files"] == {rel: {"size": i["size"], "sha256": i["sha256"]} for rel, i in hub["fetched"].items()}
    assert (manifest["source"], manifest["repo_id"], manifest["revision"]) == ("hf", REPO, hub["sha"])
    for rel in hub["fetched"]:
        st = os.lstat(os.path.join(dest, rel))
        assert (oct(st.st_mode & 0o777), st.st_uid) == ("0o644", os.getuid())
    return manifest


@pytest.fixture
def count_hashes(monkeypatch):
    calls = []
    real = hash_file

    def counting(path, blob=False):
        calls.append(path)
        return real(path, blob)

    monkeypatch.setattr(hashing_module, "hash_file", counting)
    return calls


def test_olah_reports_lfs_and_blob_ids(hub):
    tree = Hub(hub["endpoint"]).list_tree(REPO, hub["sha"])
    by_path = {entry["path"]: entry for entry in tree}
    shard = "model-00001-of-00002.safetensors"
    assert by_path[shard]["lfs"]["oid"] == hub["files"][shard]["sha256"]
    assert by_path[shard]["lfs"]["size"] == hub["files"][shard]["size"]
    assert "lfs" not in by_path["config.json"]
    assert by_path["config.json"]["oid"] == hub["files"]["config.json"]["blob_sha1"]


def test_fetch_rerun_corrupt_and_extra(hub, tmp_path, count_hashes):
    dest = tmp_path / "vol" / "weights" / "Tiny-Llama-2L"
    status = tmp_path / "status.json"
    first = sync_weights(_opts(hub, dest, status_file=str(status)))
    total = sum(info["size"] for info in hub["fetched"].values())
    assert first["changed"] is True
    assert first["fetched_bytes"] == total == first["plan"]["bytes_to_fetch"]
    assert first["plan"]["missing"] == sorted(hub["fetched"])
    assert (first["revision"], first["verified"], first["restarts"]) == (hub["sha"], "sha256", 0)
    manifest = _assert_model(hub, dest)
    assert manifest["endpoint"] == hub["endpoint"]
    assert not (tmp_path / "vol" / "weights" / STAGING_NAME).exists()
    progress = json.loads(status.read_text())
    assert (progress["state"], progress["done_bytes"], progress["total_bytes"]) == ("done", total, total)
    assert count_hashes == []  # fetched files are hashed while they stream

    (dest / "notes.txt").write_text("operator's file")
    again = sync_weights(_opts(hub, dest))
    assert (again["changed"], again["fetched_bytes"], again["verified"], again["hashed"]) == (False, 0, "size", [])
    assert again["plan"]["extra"] == ["notes.txt"]
    assert again["diff"]["before"] == again["diff"]["after"]
    assert count_hashes == []
    assert (dest / "notes.txt").read_text() == "operator's file"

    shard = "model-00002-of-00002.safetensors"
    data = bytearray((dest / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (dest / shard).write_bytes(bytes(data))
    unnoticed = sync_weights(_opts(hub, dest))
    assert (unnoticed["changed"], unnoticed["verified"]) == (False, "size")
    fixed = sync_weights(_opts(hub, dest, verify="sha256"))
    assert fixed["plan"]["corrupt"] == [shard]
    assert fixed["plan"]["to_fetch"] == [shard]
    assert fixed["fetched_bytes"] == hub["files"][shard]["size"]
    assert fixed["changed"] is True
    assert len(fixed["hashed"]) == len(hub["fetched"])
    _assert_model(hub, dest)

    os.unlink(dest / "config.json")
    refetched = sync_weights(_opts(hub, dest))
    assert (refetched["plan"]["missing"], refetched["fetched_bytes"]) == (
        ["config.json"],
        hub["files"]["config.json"]["size"],
    )
    _assert_model(hub, dest)
    clean = sync_weights(_opts(hub, dest, verify="sha256"))
    assert (clean["changed"], clean["plan"]["corrupt"]) == (False, [])


def test_existing_weights_without_manifest_are_hashed_once(hub, tmp_path, count_hashes):
    dest = tmp_path / "weights" / "Tiny-Llama-2L"
    make_tree(str(dest), {rel: hub["content"][rel] for rel in hub["fetched"]})
    for rel in hub["fetched"]:
        os.chmod(dest / rel, 0o644)
    result = sync_weights(_opts(hub, dest))
    # A pre-seeded copy (the factory volume of a QuietBox 2) is adopted: hashed, recorded, nothing fetched.
    assert (result["changed"], result["fetched_bytes"], result["verified"]) == (True, 0, "sha256")
    assert len(count_hashes) == len(hub["fetched"])
    _assert_model(hub, dest)
    count_hashes.clear()
    assert sync_weights(_opts(hub, dest))["changed"] is False
    assert count_hashes == []


class Interrupted(Exception):
    pass


def test_interrupted_download_resumes(hub, tmp_path):
    dest = tmp_path / "weights" / "Tiny-Llama-2L"
    staging = tmp_path / "weights" / STAGING_NAME / "Tiny-Llama-2L"
    order = sorted(hub["fetched"])
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    before_shard2 = sum(hub["files"][rel]["size"] for rel in order[: order.index(shard2)])
    budget = before_shard2 + 500_000

    def stop(done, total, file):
        if done >= budget:
            raise Interrupted(file)

    with pytest.raises(Interrupted):
        sync_weights(_opts(hub, dest), callback=stop)
    assert not dest.exists()
    assert (staging / shard1).stat().st_size == hub["files"][shard1]["size"]
    assert (staging / (shard2 + PART_SUFFIX)).stat().st_size >= 500_000

    plan = sync_weights(_opts(hub, dest), check_mode=True)
    assert plan["plan"]["bytes_staged"] >= before_shard2 + 500_000
    result = sync_weights(_opts(hub, dest))
    total = sum(info["size"] for info in hub["fetched"].values())
    # olah ignores Range and answers 200: the partial shard starts over, finished files are not fetched again.
    assert result["restarts"] == 1
    assert result["fetched_bytes"] == total - before_shard2
    _assert_model(hub, dest)
    assert not staging.exists()


def test_disk_too_small_writes_nothing(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 1 << 20)
    monkeypatch.setattr(sync_module, "free_bytes", lambda path: 1 << 20)
    dest = tmp_path / "vol" / "weights" / "Tiny-Llama-2L"
    with pytest.raises(WeightsError) as exc:
        sync_weights(_opts(hub, dest, disk_margin_gb=1))
    msg = str(exc.value)
    assert msg.startswith(f"lab-1: not enough free space for the weights of {REPO} in {dest}")
    assert "1.0 MiB free" in msg
    assert os.listdir(tmp_path) == []


def test_floating_revision(hub, tmp_path):
    dest = tmp_path / "weights" / "M"
    with pytest.raises(WeightsError, match=f"revision 'main' of {REPO} is a branch or tag"):
        sync_weights(_opts(hub, dest, revision="main"))
    assert not dest.exists()
    result = sync_weights(_opts(hub, dest, revision="main", allow_floating_revision=True))
    assert result["revision"] == hub["sha"]
    assert _assert_model(hub, dest)["revision"] == hub["sha"]
    tag = sync_weights(_opts(hub, dest, revision="v1.0", allow_floating_revision=True))
    assert (tag["revision"], tag["changed"]) == (hub["sha"], False)


def test_check_mode_writes_nothing(hub, tmp_path):
    dest = tmp_path / "weights" / "M"
    result = sync_weights(_opts(hub, dest), check_mode=True)
    assert result["changed"] is True
    assert result["plan"]["bytes_to_fetch"] == sum(info["size"] for info in hub["fetched"].values())
    assert "fetch: 7 files" in result["diff"]["after"]
    assert os.listdir(tmp_path) == []


def test_token_never_in_results_or_errors(hub, tmp_path):
    dest = tmp_path / "weights" / "M"
    result = sync_weights(_opts(hub, dest, hf_token=TOKEN))
    assert TOKEN not in json.dumps(result)
    assert TOKEN not in (dest / MANIFEST_NAME).read_text()
    with pytest.raises(WeightsError) as exc:
        sync_weights(
            _opts(
                hub,
                tmp_path / "w2" / "M",
                repo_id="ttfleet-lab/absent",
                revision="main",
                hf_token=TOKEN,
                allow_floating_revision=True,
            )
        )
    msg = str(exc.value)
    assert TOKEN not in msg
    assert "refused" in msg
    assert "check that hf_token has access" in msg


def test_path_source_hardlinks_same_filesystem(hub, tmp_path):
    src = tmp_path / "nfs" / "Tiny-Llama-2L"
    make_tree(str(src), hub["content"])
    dest = tmp_path / "vol" / "weights" / "Tiny-Llama-2L"
    result = sync_weights(_opts(hub, dest, source="path", path=str(src)))
    assert result["changed"] is True
    assert result["fetched_bytes"] == 0
    for rel in hub["fetched"]:
        assert os.stat(dest / rel).st_ino == os.stat(src / rel).st_ino
    assert not (dest / "original").exists()
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert manifest["path"] == str(src)
    assert manifest["files"]["config.json"]["sha256"] == hub["files"]["config.json"]["sha256"]
    assert sync_weights(_opts(hub, dest, source="path", path=str(src)))["changed"] is False


def test_path_source_copies_across_filesystems(hub, tmp_path, monkeypatch):
    other = "/dev/shm"
    if os.path.isdir(other) and os.access(other, os.W_OK) and os.stat(other).st_dev != os.stat(tmp_path).st_dev:
        src_root = tempfile.mkdtemp(prefix="ttfleet-weights-", dir=other)
    else:
        src_root = str(tmp_path / "src")
        monkeypatch.setattr(plan_module, "same_filesystem", lambda item, staging: False)
        monkeypatch.setattr(fetch_module, "same_filesystem", lambda item, staging: False)
    try:
        src = os.path.join(src_root, "Tiny-Llama-2L")
        make_tree(src, hub["content"])
        dest = tmp_path / "vol" / "weights" / "Tiny-Llama-2L"
        result = sync_weights(_opts(hub, dest, source="path", path=src))
        total = sum(info["size"] for info in hub["fetched"].values())
        assert result["fetched_bytes"] == total
        for rel in hub["fetched"]:
            assert os.stat(dest / rel).st_ino != os.stat(os.path.join(src, rel)).st_ino
        _assert_model_path(hub, dest, src)
        again = sync_weights(_opts(hub, dest, source="path", path=src, verify="sha256"))
        assert (again["changed"], again["plan"]["corrupt"]) == (False, [])
    finally:
        shutil.rmtree(src_root, ignore_errors=True)


def _assert_model_path(hub, dest, src):
    files = _dest_files(dest)
    manifest = json.loads(files.pop(MANIFEST_NAME))
    assert files == {rel: hub["content"][rel] for rel in hub["fetched"]}
    assert (manifest["source"], manifest["path"], manifest.get("revision")) == (
        "path",
        src,
        None,
    )


def test_module_main_check_then_apply(hub, tmp_path, capsys):
    dest = tmp_path / "vol" / "weights" / "Tiny-Llama-2L"
    args = {
        "dest": str(dest),
        "repo_id": REPO,
        "revision": hub["sha"],
        "hf_endpoint": hub["endpoint"],
        "hf_token": TOKEN,
        "owner": os.getuid(),
        "group": os.getgid(),
        "disk_margin_gb": 0,
        "_ansible_check_mode": True,
        "_ansible_diff": True,
    }
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_weights_module.main()
    out = capsys.readouterr().out
    result = json.loads(out)
    assert exc.value.code == 0
    assert TOKEN not in out
    assert result["changed"] is True
    assert result["plan"]["to_fetch"] == sorted(hub["fetched"])
    assert "fetch: 7 files" in result["diff"]["after"]
    assert not (tmp_path / "vol").exists()

    args["_ansible_check_mode"] = False
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_weights_module.main()
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert TOKEN not in out
    assert json.loads(out)["fetched_bytes"] == sum(info["size"] for info in hub["fetched"].values())
    _assert_model(hub, dest)

    args.update(revision="main")
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_weights_module.main()
    failed = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1
    assert "set allow_floating_revision: true" in failed["msg"]


# A test stand-in in front of olah, which ignores Range: it forwards every request and, for a GET
# with Range, answers 206 with the requested slice (as huggingface.co and its CDNs do). It also records
# the Authorization headers it sees.
class _RangeFront(QuietHandler):
    upstream = None
    seen = None

    def do_GET(self):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "range")}
        type(self).seen.append((self.path, self.headers.get("Authorization"), self.headers.get("Range")))
        req = urllib.request.Request(self.upstream + self.path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, body, ctype = resp.status, resp.read(), resp.headers.get("Content-Type")
        except urllib.error.HTTPError as exc:
            status, body, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
        match = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
        if status == 200 and match and int(match.group(1)) < len(body):
            start = int(match.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            body = body[start:]
        else:
            self.send_response(status)
        self.send_header("Content-Type", ctype or "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def range_front(hub):
    handler = type("Front", (_RangeFront,), {"upstream": hub["endpoint"], "seen": []})
    with serve(handler) as server:
        yield url(server), handler.seen


def test_resume_with_range_206(hub, tmp_path, range_front):
    endpoint, seen = range_front
    dest = tmp_path / "weights" / "Tiny-Llama-2L"
    order = sorted(hub["fetched"])
    shard2 = "model-00002-of-00002.safetensors"
    before_shard2 = sum(hub["files"][rel]["size"] for rel in order[: order.index(shard2)])

    def stop(done, total, file):
        if done >= before_shard2 + 700_000:
            raise Interrupted(file)

    with pytest.raises(Interrupted):
        sync_weights(_opts(hub, dest, hf_endpoint=endpoint), callback=stop)
    part = tmp_path / "weights" / STAGING_NAME / "Tiny-Llama-2L" / (shard2 + PART_SUFFIX)
    partial = part.stat().st_size
    result = sync_weights(_opts(hub, dest, hf_endpoint=endpoint, hf_token=TOKEN))
    total = sum(info["size"] for info in hub["fetched"].values())
    assert result["restarts"] == 0
    assert result["fetched_bytes"] == total - before_shard2 - partial
    assert (shard2, f"bytes={partial}-") in {(path.rsplit("/", 1)[-1], rng) for path, _auth, rng in seen}
    _assert_model(hub, dest)
    # A public repository never needs the token, so it never left the host.
    assert {auth for _path, auth, _rng in seen} == {None}
