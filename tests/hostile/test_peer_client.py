"""model_weights' peer source (PeerFiles) against a hostile or broken peer on 127.0.0.1, through sync_weights.

A peer's URL holds its 128-bit token in the path: requests stay on the peer's origin (no redirect is followed),
messages name the origin only, and every transfer is bounded like the Hub's (bytes, stall, deadline).
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from conftest import SLACK, answer_file, dir_bytes, drip, endless, http_head, long_head, reply, send, weights_options

from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import fetch as fetch_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import hub as hub_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import sources as sources_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.fetch import NET_ATTEMPTS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

REPO = "org/model"
REVISION = "b" * 40
PEER_TOKEN = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
DATA = b"\1" * 4096


def manifest(files=None):
    files = {"model.safetensors": DATA} if files is None else files
    return {
        "schema": 1,
        "repo_id": REPO,
        "revision": REVISION,
        "files": {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()},
    }


def peer_script(listing=None, files=None):
    """A peer serving ``listing`` (a manifest, or a script) and ``files`` ({path: bytes or a script}) under its
    token; anything else is 404, as weights_server answers."""
    listing = manifest() if listing is None else listing
    files = {"model.safetensors": DATA} if files is None else files
    base = f"/{PEER_TOKEN}/"

    def script(conn, req, srv):
        rel = req.path[len(base) :] if req.path.startswith(base) else None
        if rel == MANIFEST_NAME:
            listing(conn, req, srv) if callable(listing) else reply(conn, listing)
        elif rel in files:
            answer_file(conn, req, srv, files[rel])
        else:
            reply(conn, b"not found", 404)

    return script


def opts(tmp_path, server, **extra):
    return weights_options(
        tmp_path, source="peer", repo_id=REPO, revision=REVISION, peer_url=f"{server.url}/{PEER_TOKEN}/", **extra
    )


def file_requests(server):
    return [req for req in server.requests if not req.path.endswith(MANIFEST_NAME)]


def test_a_peer_pull_works_and_names_no_token(hostile, tmp_path):
    server = hostile(peer_script())
    result = sync_weights(opts(tmp_path, server))
    assert result["fetched_bytes"] == 4096
    assert PEER_TOKEN not in json.dumps(result)
    recorded = json.loads((tmp_path / "vol" / "weights" / "M" / MANIFEST_NAME).read_text())
    assert recorded["endpoint"] == f"http://127.0.0.1:{server.port}"


def test_an_endless_peer_body_writes_no_more_than_the_listed_size(hostile, tmp_path):
    def body(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}))
        endless(conn, chunk=b"\1" * 65536, stop=srv.stop)

    server = hostile(peer_script(files={"model.safetensors": body}))
    start = time.monotonic()
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server))
    msg = str(exc.value)
    assert time.monotonic() - start < 10
    assert f"peer http://127.0.0.1:{server.port} sent more for model.safetensors" in msg
    assert PEER_TOKEN not in msg
    assert len(file_requests(server)) == 1
    assert dir_bytes(tmp_path / "vol") <= 4096


def test_a_dripping_peer_stops_at_the_deadline(hostile, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_module, "TRANSFER_FLOOR", 1.0)

    def body(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096))
        drip(conn, DATA, stop=srv.stop)

    server = hostile(peer_script(files={"model.safetensors": body}))
    start = time.monotonic()
    with pytest.raises(WeightsError, match="did not finish within its 1 s limit") as exc:
        sync_weights(opts(tmp_path, server, timeout=2))
    # Three attempts of 1 s; without the limit, 800 s an attempt.
    assert time.monotonic() - start < 3 * 1.0 + SLACK
    assert len(file_requests(server)) == NET_ATTEMPTS
    assert PEER_TOKEN not in str(exc.value)


def test_a_peer_manifest_with_dripped_headers_stops_at_its_deadline(hostile, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_module, "REQUEST_TOTAL", 1.5)
    server = hostile(peer_script(listing=lambda conn, req, srv: drip(conn, long_head(200, length=2), stop=srv.stop)))
    start = time.monotonic()
    # The stall limit (timeout) is far above the request's 1.5 s: only the overall limit can end it.
    with pytest.raises(WeightsError, match="did not finish within its 2 s limit"):
        sync_weights(opts(tmp_path, server, timeout=30))
    assert time.monotonic() - start < 1.5 + SLACK


@pytest.mark.parametrize("what", ["manifest", "file"])
def test_a_peer_redirect_is_never_followed(hostile, catcher, tmp_path, what):
    def redirect(conn, req, srv):
        send(conn, http_head(302, {"Location": f"{catcher.url}{req.path}"}, 0))

    script = peer_script(listing=redirect) if what == "manifest" else peer_script(files={"model.safetensors": redirect})
    server = hostile(script)
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server))
    msg = str(exc.value)
    assert "with a redirect (HTTP 302)" in msg
    assert PEER_TOKEN not in msg
    assert catcher.requests == [], "a peer request followed a redirect off the peer's origin"


def test_an_endless_peer_manifest_is_capped(hostile, tmp_path):
    def listing(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/json"}) + b'{"files": {')
        endless(conn, chunk=b'"x": {"size": 1, "sha256": "' + b"0" * 64 + b'"}, ' * 500, stop=srv.stop)

    server = hostile(peer_script(listing=listing))
    with pytest.raises(WeightsError, match="passed the 33554432-byte cap") as exc:
        sync_weights(opts(tmp_path, server))
    assert f"peer http://127.0.0.1:{server.port}" in str(exc.value)
    assert PEER_TOKEN not in str(exc.value)


def test_a_manifest_listing_too_many_files_is_refused(hostile, tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "MAX_LISTED_FILES", 100)
    server = hostile(peer_script(listing=manifest({f"f/{i}.bin": b"x" for i in range(101)})))
    with pytest.raises(WeightsError, match="lists more than 100 files in its manifest"):
        sync_weights(opts(tmp_path, server))
    assert not (tmp_path / "vol").exists()


@pytest.mark.parametrize("part", ["listing", "file"])
def test_a_peer_that_is_not_http_is_a_clear_error(hostile, tmp_path, part):
    def garbage(conn, req, srv):
        send(conn, b"\x1b[2J\x1b]0;owned\x07not http\r\n\r\n")

    script = peer_script(listing=garbage) if part == "listing" else peer_script(files={"model.safetensors": garbage})
    server = hostile(script)
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server))
    msg = str(exc.value)
    assert f"127.0.0.1:{server.port} broke the HTTP protocol" in msg
    assert PEER_TOKEN not in msg and "\x1b" not in msg
    if part == "file":
        assert len(file_requests(server)) == NET_ATTEMPTS


@pytest.mark.parametrize("rel", ["../../victim", "\x1b]0;x\x07a.bin", "a\nb.bin"])
def test_hostile_manifest_paths_are_refused_and_shown_escaped(hostile, tmp_path, rel):
    server = hostile(peer_script(listing=manifest({"config.json": b"{}", rel: b"x"})))
    with pytest.raises(WeightsError, match="unusable file path") as exc:
        sync_weights(opts(tmp_path, server))
    assert not any(ch in str(exc.value) for ch in "\x1b\x07\n")
    assert not (tmp_path / "vol").exists()


def test_a_holder_that_dies_mid_file_hands_over_to_the_next_which_sends_only_the_rest(hostile, tmp_path):
    big = bytes(range(256)) * 64  # 16 KiB, so the cut lands mid-file
    listing = manifest({"model.safetensors": big})

    def cut(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, len(big)) + big[:3000])

    dying = hostile(peer_script(listing=listing, files={"model.safetensors": cut}))
    healthy = hostile(peer_script(listing=listing, files={"model.safetensors": big}))
    result = sync_weights(opts(tmp_path, dying, peer_fallback_urls=[f"{healthy.url}/{PEER_TOKEN}/"], timeout=5))
    assert result["peer"] == f"http://127.0.0.1:{healthy.port}"
    assert len(result["peer_failures"]) == 1 and f"127.0.0.1:{dying.port}" in result["peer_failures"][0]
    assert PEER_TOKEN not in json.dumps(result)
    assert (tmp_path / "vol" / "weights" / "M" / "model.safetensors").read_bytes() == big
    ranges = [req.header("range") for req in file_requests(healthy)]
    assert ranges == ["bytes=3000-"], f"the next holder was asked for {ranges}, not only the missing bytes"
    assert not list((tmp_path / "vol" / "weights").glob("**/*.ttfleet-part"))


def test_when_every_holder_fails_the_error_names_each_and_keeps_the_staged_files(hostile, tmp_path):
    second = b"\2" * 2048
    listing = manifest({"a.bin": DATA, "b.bin": second})

    def gone(conn, req, srv):
        reply(conn, b"not found", 404)

    first = hostile(peer_script(listing=listing, files={"a.bin": DATA, "b.bin": gone}))
    other = hostile(peer_script(listing=listing, files={"a.bin": gone, "b.bin": gone}))
    with pytest.raises(WeightsError, match="every peer failed for org/model@") as exc:
        sync_weights(opts(tmp_path, first, peer_fallback_urls=[f"{other.url}/{PEER_TOKEN}/"]))
    msg = str(exc.value)
    assert f"127.0.0.1:{first.port}" in msg and f"127.0.0.1:{other.port}" in msg
    assert PEER_TOKEN not in msg
    # a.bin arrived in full from the first holder: the second was never asked for it.
    assert [req.path.rsplit("/", 1)[1] for req in file_requests(other)] == ["b.bin"] * len(file_requests(other))
    assert not (tmp_path / "vol" / "weights" / "M" / "a.bin").exists()
