# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights sources s3 and peer: a real SeaweedFS bucket (signatures checked) and a real weights_server
daemon on 127.0.0.1, with the same staging, verification and resume as the hf source."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import urllib.error
import urllib.request

import pytest
from conftest import ROOT

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import start_server, stop_server
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import PeerError
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import alive, state_path
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import (
    build_manifest,
    identity_of,
    manifest_matches,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_IGNORE_PATTERNS,
    STAGING_NAME,
    WeightsError,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import s3_prefix_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

REPO = "ttfleet-lab/Tiny-S3"


REV = "0123456789abcdef0123456789abcdef01234567"


ACCESS = "TTFLEET" + "WEIGHTS01"


SECRET = "weights/secret+" + "0123456789abcdef"


BUCKET = "models"


PREFIX = "fleet/v1"


SHARD = "model-00001-of-00001.safetensors"


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


s3_server = _load("s3_server", "tests/tools/s3_server.py")


def _model_files():
    rng = __import__("random").Random(7)
    return {
        "config.json": b'{"model_type": "llama"}\n',
        "tokenizer.json": b'{"model": {"type": "WordLevel"}}\n',
        SHARD: rng.randbytes(3 << 20),
        "sub/extra.bin": rng.randbytes(1 << 20),
        "original/consolidated.00.pth": b"meta checkpoint\n",
    }


def _manifest(contents):
    files = [
        {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in contents.items()
    ]
    return build_manifest(identity_of("hf", REPO, REV), files, source="hf")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    srv = s3_server.SeaweedS3(str(tmp_path_factory.mktemp("seaweed")), ACCESS, SECRET).start()
    client = S3Client(srv.endpoint, ACCESS, SECRET)
    client.create_bucket(BUCKET)
    contents = _model_files()
    base = s3_prefix_of(PREFIX, REPO, REV)
    assert base == f"fleet/v1/{REPO}/{REV}/"
    for rel, data in contents.items():
        client.put_object(BUCKET, base + rel, data)
    client.put_object(BUCKET, base + MANIFEST_NAME, json.dumps(_manifest(contents)).encode())
    yield {"server": srv, "client": client, "contents": contents, "base": base}
    srv.stop()


def _s3_opts(bucket, dest, **extra):
    options = {
        "dest": str(dest),
        "source": "s3",
        "repo_id": REPO,
        "revision": REV,
        "s3_endpoint": bucket["server"].endpoint,
        "s3_bucket": BUCKET,
        "s3_prefix": PREFIX,
        "s3_access_key": ACCESS,
        "s3_secret_key": SECRET,
        "owner": os.getuid(),
        "group": os.getgid(),
        "workers": 2,
        "disk_margin_gb": 0,
        "ignore_patterns": list(DEFAULT_IGNORE_PATTERNS),
    }
    options.update(extra)
    return options


def _fetched(bucket):
    return {rel: data for rel, data in bucket["contents"].items() if not rel.startswith("original/")}


def _assert_dest(dest, expected):
    for rel, data in expected.items():
        assert (dest / rel).read_bytes() == data
    assert not (dest / "original").exists()
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert (manifest["repo_id"], manifest["revision"]) == (REPO, REV)
    assert {rel: entry["sha256"] for rel, entry in manifest["files"].items()} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in expected.items()
    }
    assert not (dest.parent / STAGING_NAME).exists()
    return manifest


class Interrupt(Exception):
    pass


def _interrupt_after(limit):
    def callback(done, _total, _file):
        if done >= limit:
            raise Interrupt

    return callback


# ---------------------------------------------------------------------------
# s3


def test_s3_fetch_then_converged_without_hashing(bucket, tmp_path):
    dest = tmp_path / "vol" / "weights" / "Tiny"
    first = sync_weights(_s3_opts(bucket, dest))
    expected = _fetched(bucket)
    assert first["changed"] and first["fetched_bytes"] == sum(len(d) for d in expected.values())
    manifest = _assert_dest(dest, expected)
    assert manifest["source"] == "s3" and SECRET not in json.dumps(manifest) and ACCESS not in json.dumps(manifest)
    again = sync_weights(_s3_opts(bucket, dest))
    assert (again["changed"], again["fetched_bytes"], again["hashed"], again["verified"]) == (False, 0, [], "size")
    # The same repository and commit from the Hub counts as converged too: the identity is (repo, revision).
    assert manifest_matches(manifest, identity_of("hf", REPO, REV))


def test_s3_corrupt_shard_refetched_alone(bucket, tmp_path):
    dest = tmp_path / "weights" / "Tiny"
    sync_weights(_s3_opts(bucket, dest))
    shard = dest / SHARD
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    # size mode trusts the manifest: the flip is invisible to it; sha256 finds it.
    assert sync_weights(_s3_opts(bucket, dest, verify="size"))["changed"] is False
    result = sync_weights(_s3_opts(bucket, dest, verify="sha256"))
    assert result["plan"]["corrupt"] == [SHARD] and result["plan"]["to_fetch"] == [SHARD]
    assert result["fetched_bytes"] == len(bucket["contents"][SHARD])
    _assert_dest(dest, _fetched(bucket))


def test_s3_interrupted_download_resumes_with_range(bucket, tmp_path):
    dest = tmp_path / "weights" / "Tiny"
    total = sum(len(d) for d in _fetched(bucket).values())
    with pytest.raises(Interrupt):
        sync_weights(_s3_opts(bucket, dest), callback=_interrupt_after(2 << 20))
    assert not dest.exists() or not (dest / SHARD).exists()
    plan = sync_weights(_s3_opts(bucket, dest), check_mode=True)["plan"]
    assert plan["bytes_staged"] >= 1 << 20
    result = sync_weights(_s3_opts(bucket, dest))
    assert result["restarts"] == 0
    assert result["fetched_bytes"] == total - plan["bytes_staged"]
    assert result["fetched_bytes"] < total
    _assert_dest(dest, _fetched(bucket))


def test_s3_bad_object_content_refused(bucket, tmp_path):
    client, base = bucket["client"], bucket["base"].replace(REV, "f" * 40)
    contents = dict(bucket["contents"])
    manifest = _manifest(contents)
    manifest["revision"] = "f" * 40
    client.put_object(BUCKET, base + MANIFEST_NAME, json.dumps(manifest).encode())
    for rel, data in contents.items():
        client.put_object(BUCKET, base + rel, data if rel != "config.json" else b"X" * len(data))
    dest = tmp_path / "weights" / "Tiny"
    with pytest.raises(WeightsError, match=r"config\.json .* wrong content"):
        sync_weights(_s3_opts(bucket, dest, revision="f" * 40))
    assert not (dest / "config.json").exists()


def test_s3_errors_name_the_fix_and_hide_keys(bucket, tmp_path):
    dest = tmp_path / "weights" / "Tiny"
    with pytest.raises(WeightsError, match=r"has no \.ttfleet-manifest\.json; upload the whole weights directory"):
        sync_weights(_s3_opts(bucket, dest, s3_prefix="elsewhere"))
    with pytest.raises(WeightsError) as err:
        sync_weights(_s3_opts(bucket, dest, s3_secret_key="not-" + SECRET))
    assert "403" in str(err.value) and "secret key" in str(err.value) and SECRET not in str(err.value)
    with pytest.raises(WeightsError, match="branch or tag"):
        sync_weights(_s3_opts(bucket, dest, revision="main"))
    with pytest.raises(WeightsError, match="source s3 needs s3_bucket"):
        sync_weights(_s3_opts(bucket, dest, s3_bucket=None))
    assert not dest.exists()


def test_s3_missing_object_reported(bucket, tmp_path):
    client = bucket["client"]
    rev = "e" * 40
    base = s3_prefix_of(PREFIX, REPO, rev)
    manifest = _manifest(bucket["contents"])
    manifest["revision"] = rev
    client.put_object(BUCKET, base + MANIFEST_NAME, json.dumps(manifest).encode())
    client.put_object(BUCKET, base + "config.json", bucket["contents"]["config.json"])
    with pytest.raises(WeightsError, match="lacks or holds a different size of 3 file"):
        sync_weights(_s3_opts(bucket, tmp_path / "w" / "Tiny", revision=rev))


def test_disk_preflight_leaves_nothing(bucket, tmp_path):
    dest = tmp_path / "weights" / "Tiny"
    free = free_bytes(str(tmp_path))
    with pytest.raises(WeightsError, match=r"not enough free space .* needs .* free"):
        sync_weights(_s3_opts(bucket, dest, disk_margin_gb=(free / (1 << 30)) + 1))
    assert not dest.exists() and not (tmp_path / "weights" / STAGING_NAME).exists()


# ---------------------------------------------------------------------------
# peer


@pytest.fixture
def holder(bucket, tmp_path):
    dest = tmp_path / "holder" / "weights" / "Tiny"
    sync_weights(_s3_opts(bucket, dest))
    run_dir = tmp_path / "run"
    state = start_server(str(dest), "127.0.0.1", 0, ttl=120, run_dir=str(run_dir), name="Tiny")
    yield {"dest": dest, "state": state, "run_dir": str(run_dir)}
    stop_server(str(run_dir), "Tiny")


def _peer_opts(holder, dest, **extra):
    options = {
        "dest": str(dest),
        "source": "peer",
        "repo_id": REPO,
        "revision": REV,
        "peer_url": holder["state"]["url"],
        "owner": os.getuid(),
        "group": os.getgid(),
        "disk_margin_gb": 0,
        "ignore_patterns": list(DEFAULT_IGNORE_PATTERNS),
    }
    options.update(extra)
    return options


def test_peer_pull_counts_served_bytes(bucket, holder, tmp_path):
    dest = tmp_path / "puller" / "weights" / "Tiny"
    result = sync_weights(_peer_opts(holder, dest))
    expected = _fetched(bucket)
    total = sum(len(d) for d in expected.values())
    assert result["fetched_bytes"] == total
    manifest = _assert_dest(dest, expected)
    assert manifest["source"] == "peer"
    assert alive(holder["state"])
    running, served = stop_server(holder["run_dir"], "Tiny")
    manifest_size = (holder["dest"] / MANIFEST_NAME).stat().st_size
    assert running and served == total + manifest_size
    assert not alive(holder["state"])
    assert stop_server(holder["run_dir"], "Tiny") == (False, 0)


def test_peer_resume_and_wrong_revision(holder, tmp_path):
    dest = tmp_path / "puller" / "weights" / "Tiny"
    with pytest.raises(Interrupt):
        sync_weights(_peer_opts(holder, dest), callback=_interrupt_after(2 << 20))
    result = sync_weights(_peer_opts(holder, dest))
    assert result["restarts"] == 0 and 0 < result["fetched_bytes"] < 3 << 20
    with pytest.raises(WeightsError, match=f"holds {REPO}@{REV}, not {REPO}@{'d' * 40}"):
        sync_weights(_peer_opts(holder, tmp_path / "other" / "Tiny", revision="d" * 40))


def test_peer_serves_only_manifest_files(holder):
    url = holder["state"]["url"]
    (holder["dest"] / "secret.txt").write_text("not listed\n")
    for bad in ("secret.txt", "../Tiny/config.json", "%2e%2e/%2e%2e/run/Tiny.json"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + bad, timeout=5)
        assert err.value.code == 404
    wrong_token = url.rsplit("/", 2)[0] + "/" + "0" * 32 + "/config.json"
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(wrong_token, timeout=5)
    req = urllib.request.Request(url + "config.json", headers={"Range": "bytes=2-5"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 206 and resp.read() == b'"model_type": "llama"}\n'[1:5]
    state_file = os.path.join(holder["run_dir"], "Tiny.json")
    assert oct(os.stat(state_file).st_mode & 0o777) == "0o600"


def test_peer_refuses_directory_without_manifest(tmp_path):
    (tmp_path / "w").mkdir()
    with pytest.raises(PeerError, match=r"no readable \.ttfleet-manifest\.json"):
        start_server(str(tmp_path / "w"), "127.0.0.1", run_dir=str(tmp_path / "run"), name="x")
    with pytest.raises(PeerError, match="name"):
        state_path(str(tmp_path), "../x")
