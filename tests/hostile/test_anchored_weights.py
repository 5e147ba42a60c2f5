"""Issue 29: the weights fan-out anchored at the origin, against hostile holders and a hostile hub on 127.0.0.1.

- Case 1: a holder that serves other bytes for a pinned ``org/model@<sha>`` with a manifest to match is refused by
  the digest fixed from the origin (``expected_manifest_sha256``), naming the holder; the pull fails over.
- Case 2: holder A sends wrong bytes and dies, honest holder B resumes with ``Range``: the whole file fails its digest
  and is fetched again from byte 0 at B, which succeeds; B is not blamed and no origin is needed.
- Case 9a: a repository file named ``.ttfleet-staging.json`` (the staging state's name in earlier releases) is
  fetched, placed as the repository holds it, and the next run converges.

The digest is computed here on its own (canonical JSON of schema, repository, revision and each file's size and
sha256), so the tests pin the format the role hands from the origin's hosts to the pullers.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from conftest import answer_file, http_head, reply, send, weights_options

from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

REPO = "org/model"
REVISION = "c" * 40
PEER_TOKEN = "00112233445566778899aabbccddeeff"
# 1 MiB, with a varying byte pattern so a splice of wrong bytes changes the digest.
BIG = bytes(range(256)) * 4096
CONFIG = b'{"architectures": ["X"]}\n'


def manifest(files):
    return {
        "schema": 1,
        "repo_id": REPO,
        "revision": REVISION,
        "files": {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()},
    }


def anchor(files):
    """The digest the origin's hosts return (``manifest_sha256``) for ``files``."""
    body = manifest(files)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def ranged(body):
    """A file answer that honours ``Range: bytes=N-`` (206 with Content-Range), as weights_server does."""

    def script(conn, req, srv):
        match = re.match(r"^bytes=(\d+)-$", req.header("range") or "")
        start = int(match.group(1)) if match else 0
        if not start:
            answer_file(conn, req, srv, body)
            return
        head = http_head(
            206,
            {"Content-Type": "application/octet-stream", "Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"},
            len(body) - start,
        )
        send(conn, head + body[start:])

    return script


def holder(listing, files):
    """A weights_server-like holder: ``listing`` at the manifest, ``files`` ({path: bytes or script})."""
    base = f"/{PEER_TOKEN}/"

    def script(conn, req, srv):
        rel = req.path[len(base) :] if req.path.startswith(base) else None
        if rel == MANIFEST_NAME:
            reply(conn, listing)
        elif rel in files:
            answer_file(conn, req, srv, files[rel])
        else:
            reply(conn, b"not found", 404)

    return script


def peer_opts(tmp_path, first, *others, **extra):
    return weights_options(
        tmp_path,
        source="peer",
        repo_id=REPO,
        revision=REVISION,
        peer_url=f"{first.url}/{PEER_TOKEN}/",
        peer_fallback_urls=[f"{other.url}/{PEER_TOKEN}/" for other in others],
        **extra,
    )


def file_requests(server):
    return [req for req in server.requests if not req.path.endswith(MANIFEST_NAME)]


WEIGHTS = {"config.json": CONFIG, "model.safetensors": BIG}
POISON = {"config.json": CONFIG, "model.safetensors": b"\xcc" * len(BIG)}


# ---------------------------------------------------------------------------
# Case 1: one host can poison the fleet's weights.


@pytest.mark.broke29(1)
def test_case1_a_tampering_holder_with_a_matching_manifest_is_refused_and_named(hostile, tmp_path):
    # The holder rewrote the file and its own manifest to match: only the origin's digest can tell.
    tamperer = hostile(holder(manifest(POISON), POISON))
    with pytest.raises(WeightsError) as exc:
        sync_weights(peer_opts(tmp_path, tamperer, expected_manifest_sha256=anchor(WEIGHTS)))
    msg = str(exc.value)
    assert f"peer http://127.0.0.1:{tamperer.port}" in msg
    assert "expected_manifest_sha256" in msg and anchor(WEIGHTS) in msg
    assert PEER_TOKEN not in msg
    assert file_requests(tamperer) == [], "a file was fetched from a holder whose manifest is not the origin's"
    assert not (tmp_path / "vol" / "weights" / "M" / "model.safetensors").exists()


@pytest.mark.broke29(1)
def test_case1_the_pull_fails_over_from_the_tampering_holder_to_an_honest_one(hostile, tmp_path):
    tamperer = hostile(holder(manifest(POISON), POISON))
    honest = hostile(holder(manifest(WEIGHTS), WEIGHTS))
    result = sync_weights(peer_opts(tmp_path, tamperer, honest, expected_manifest_sha256=anchor(WEIGHTS)))
    assert result["peer"] == f"http://127.0.0.1:{honest.port}"
    assert len(result["peer_failures"]) == 1
    assert f"127.0.0.1:{tamperer.port} serves a manifest of {REPO}@{REVISION}" in result["peer_failures"][0]
    dest = tmp_path / "vol" / "weights" / "M"
    assert (dest / "model.safetensors").read_bytes() == BIG
    assert result["manifest_sha256"] == anchor(WEIGHTS)
    assert file_requests(tamperer) == []


@pytest.mark.broke29(1)
def test_case1_the_digest_a_host_returns_is_the_one_its_pullers_check(hostile, tmp_path):
    # What a holder returns after its pull is what the next round's pullers are handed: the fan-out's rounds chain.
    honest = hostile(holder(manifest(WEIGHTS), WEIGHTS))
    first = sync_weights(peer_opts(tmp_path / "a", honest, expected_manifest_sha256=anchor(WEIGHTS)))
    assert first["manifest_sha256"] == anchor(WEIGHTS)
    again = sync_weights(peer_opts(tmp_path / "a", honest, expected_manifest_sha256=anchor(WEIGHTS)))
    assert again["changed"] is False and again["manifest_sha256"] == anchor(WEIGHTS)


@pytest.mark.broke29(1)
def test_case1_a_digest_that_is_not_a_sha256_is_refused(hostile, tmp_path):
    honest = hostile(holder(manifest(WEIGHTS), WEIGHTS))
    with pytest.raises(WeightsError, match=r"expected_manifest_sha256 'ABC' for org/model@c+ is not a lower-case"):
        sync_weights(peer_opts(tmp_path, honest, expected_manifest_sha256="ABC"))


# ---------------------------------------------------------------------------
# Case 2: a lying holder gets the honest one blamed.


@pytest.mark.broke29(2)
def test_case2_a_lying_holder_that_dies_does_not_get_the_honest_one_blamed(hostile, tmp_path):
    lie = 300 * 1024
    served = []

    def lying_then_dead(conn, req, srv):
        if served:
            return  # dead: the connection closes without a byte
        served.append(req.path)
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, len(BIG)) + b"\xee" * lie)

    liar = hostile(holder(manifest(WEIGHTS), {"config.json": CONFIG, "model.safetensors": lying_then_dead}))
    honest = hostile(holder(manifest(WEIGHTS), {"config.json": CONFIG, "model.safetensors": ranged(BIG)}))
    result = sync_weights(peer_opts(tmp_path, liar, honest, expected_manifest_sha256=anchor(WEIGHTS), timeout=5))
    assert result["peer"] == f"http://127.0.0.1:{honest.port}", "the honest holder was failed over"
    assert len(result["peer_failures"]) == 1 and f"127.0.0.1:{liar.port}" in result["peer_failures"][0]
    assert f"127.0.0.1:{honest.port}" not in json.dumps(result["peer_failures"])
    assert (tmp_path / "vol" / "weights" / "M" / "model.safetensors").read_bytes() == BIG
    ranges = [req.header("range") for req in file_requests(honest) if req.path.endswith("model.safetensors")]
    assert ranges == [f"bytes={lie}-", None], f"the honest holder was asked for {ranges}"
    assert not list((tmp_path / "vol" / "weights").glob("**/*.ttfleet-part"))


def test_case2_a_holder_whose_own_bytes_fail_is_the_one_named(hostile, tmp_path):
    # No resume: the holder sent the whole file itself, so it is blamed at once (no second download).
    liar = hostile(holder(manifest(WEIGHTS), {"config.json": CONFIG, "model.safetensors": b"\xee" * len(BIG)}))
    with pytest.raises(WeightsError) as exc:
        sync_weights(peer_opts(tmp_path, liar, expected_manifest_sha256=anchor(WEIGHTS)))
    msg = str(exc.value)
    assert (
        f"peer http://127.0.0.1:{liar.port} sent model.safetensors of {REPO}@{REVISION} with the wrong content" in msg
    )
    assert len([req for req in file_requests(liar) if req.path.endswith("model.safetensors")]) == 1


# ---------------------------------------------------------------------------
# Case 9a: a repository file named like the module's own staging state.

SHA = "d" * 40
TREE = f"/api/models/{REPO}/tree/{SHA}"
RESOLVE = f"/{REPO}/resolve/{SHA}/"
STATE_LIKE = b'{"identity": "not the module\'s", "files": {"model.safetensors": 1}}\n'


def git_blob(content):
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@pytest.mark.broke29("9a")
def test_case9a_a_repository_file_named_like_the_staging_state_converges(hostile, tmp_path):
    tree = [
        {"type": "file", "path": ".ttfleet-staging.json", "size": len(STATE_LIKE), "oid": git_blob(STATE_LIKE)},
        {
            "type": "file",
            "path": "model.safetensors",
            "size": 134,
            "oid": "e" * 40,
            "lfs": {"oid": hashlib.sha256(BIG).hexdigest(), "size": len(BIG), "pointerSize": 134},
        },
    ]
    files = {".ttfleet-staging.json": STATE_LIKE, "model.safetensors": BIG}

    def hub(conn, req, srv):
        if req.path.startswith(TREE):
            reply(conn, tree)
        elif req.path.startswith(RESOLVE) and req.path[len(RESOLVE) :] in files:
            answer_file(conn, req, srv, files[req.path[len(RESOLVE) :]])
        else:
            reply(conn, {"error": "no such path"}, 404)

    server = hostile(hub)
    options = weights_options(tmp_path, source="hf", repo_id=REPO, revision=SHA, hf_endpoint=server.url)
    first = sync_weights(options)
    dest = tmp_path / "vol" / "weights" / "M"
    assert (dest / ".ttfleet-staging.json").read_bytes() == STATE_LIKE, "the repository's file was overwritten"
    recorded = json.loads((dest / MANIFEST_NAME).read_text())["files"][".ttfleet-staging.json"]
    assert recorded["sha256"] == hashlib.sha256(STATE_LIKE).hexdigest()
    assert first["changed"] is True
    second = sync_weights({**options, "verify": "sha256"})
    assert second["changed"] is False, f"the second run changed again: {second['plan']}"
    assert second["plan"]["corrupt"] == [] and second["fetched_bytes"] == 0
