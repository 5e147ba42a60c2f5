"""The S3 client (plugins/module_utils/_net/s3/) against hostile S3 endpoints on 127.0.0.1: bytes on disk, time, memory,
where the signature goes, and what a broken answer turns into. The client is the real one with dummy keys (the hostile
servers check no signature)."""

from __future__ import annotations

import os
import pyexpat
import socket
import struct
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from conftest import SLACK, as_json, baseline_rss_mib, drip, endless, http_head, long_head, run_bounded, send
from test_kernel_store import module_code

from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_LISTED_FILES, MAX_XML_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.endpoint import ATTEMPTS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.xml import parse_error

ACCESS = "AKIA" + "HOSTILETEST0001"
SECRET = "hostile/secret+" + "0123456789abcdef"
TOKEN = "FwoGZXIvYXdzE" + "hostile-session-token"


def client_for(server, **kwargs):
    return S3Client(server.url, ACCESS, SECRET, session_token=TOKEN, **kwargs)


def head_or(body_script, size=4096):
    """A script answering HEAD with an object of ``size`` bytes and handing GETs to ``body_script``."""

    def script(conn, req, srv):
        if req is None:
            return
        if req.method == "HEAD":
            send(conn, http_head(200, {"ETag": '"0"'}, size))
        else:
            body_script(conn, req, srv)

    return script


@pytest.fixture(scope="module")
def baseline():
    return baseline_rss_mib()


# ---------------------------------------------------------------------------
# Disk: exactly the bytes an object has


@pytest.mark.parametrize("sized", [True, False], ids=["size-given", "size-from-head"])
def test_an_endless_body_for_a_4_kib_object_leaves_4_kib_and_fails_fast(hostile, tmp_path, sized):
    server = hostile(head_or(lambda conn, req, srv: send(conn, http_head(200)) and endless(conn, stop=srv.stop)))
    dest = tmp_path / "config.json.part"
    start = time.monotonic()
    with pytest.raises(S3Error, match=r"sent more than the 4096 bytes expected") as err:
        client_for(server).get_object("models", "org/model/config.json", str(dest), size=4096 if sized else None)
    assert time.monotonic() - start < 5
    assert dest.stat().st_size <= 4096
    assert "S3 GET s3://models/org/model/config.json at http://127.0.0.1:" in str(err.value)


def test_a_declared_length_beyond_the_object_is_refused_before_a_byte_is_written(hostile, tmp_path):
    server = hostile(lambda conn, req, srv: send(conn, http_head(200, length=1 << 40)) and endless(conn, stop=srv.stop))
    dest = tmp_path / "part"
    with pytest.raises(S3Error, match=r"sends 1099511627776 bytes .* of an object of 4096 bytes"):
        client_for(server).get_object("models", "k", str(dest), size=4096)
    assert not dest.exists() or dest.stat().st_size == 0


def test_a_range_answer_for_another_object_size_is_refused(hostile, tmp_path):
    def script(conn, req, srv):
        send(conn, http_head(206, {"Content-Range": "bytes 100-9999/10000"}, 9900) + b"x" * 9900)

    dest = tmp_path / "part"
    dest.write_bytes(b"y" * 100)
    with pytest.raises(S3Error, match="says the object is 10000 bytes, not the 4096 expected"):
        client_for(hostile(script)).get_object("models", "k", str(dest), offset=100, size=4096)
    assert dest.stat().st_size == 100


def test_a_body_that_ends_early_or_is_reset_is_an_error_not_a_traceback(hostile, tmp_path):
    short = hostile(lambda conn, req, srv: send(conn, http_head(200, length=4096) + b"z" * 10))
    with pytest.raises(S3Error, match=r"failed after 10 bytes: .*ended after 10 of its 4096 bytes"):
        client_for(short).get_object("models", "k", str(tmp_path / "a"), size=4096)

    def reset(conn, req, srv):
        send(conn, http_head(200, length=4096) + b"z" * 10)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    with pytest.raises(
        S3Error, match=r"S3 GET s3://models/k at http://127\.0\.0\.1:\d+ failed after \d+ bytes: .*reset"
    ):
        client_for(hostile(reset)).get_object("models", "k", str(tmp_path / "b"), size=4096)


# ---------------------------------------------------------------------------
# Time: a stall limit and an overall limit on every request


def test_a_dripped_body_stops_at_the_deadline(hostile, tmp_path):
    def script(conn, req, srv):
        send(conn, http_head(200, length=4096))
        drip(conn, b"x" * 4096, stop=srv.stop)

    dest = tmp_path / "part"
    start = time.monotonic()
    with pytest.raises(S3Error, match="did not finish within its 3 s limit"):
        client_for(hostile(script), timeout=2, total=3).get_object("models", "k", str(dest), size=4096)
    assert time.monotonic() - start < 3 + SLACK
    assert dest.stat().st_size < 4096


@pytest.mark.parametrize("call", ["head", "list", "get"])
def test_headers_dripped_stop_at_the_deadline_retries_included(hostile, tmp_path, call):
    server = hostile(lambda conn, req, srv: drip(conn, long_head(200, length=0), stop=srv.stop))
    client = client_for(server, timeout=2, total=3)
    start = time.monotonic()
    with pytest.raises(S3Error, match="did not finish within its 3 s limit"):
        if call == "head":
            client.head_object("models", "k")
        elif call == "list":
            list(client.list_objects("models", "org/"))
        else:
            client.get_object("models", "k", str(tmp_path / "part"), size=4096)
    # One 3 s limit for every attempt; a limit per attempt would take 3 x 3 s and the pauses between them.
    assert time.monotonic() - start < 3 + SLACK


def test_a_silent_endpoint_is_a_stall(hostile):
    server = hostile(lambda conn, req, srv: srv.stop.wait(30))
    start = time.monotonic()
    with pytest.raises(S3Error, match=r"S3 HEAD s3://models/k at http://127\.0\.0\.1:\d+ .*(stalled|3 s limit)"):
        client_for(server, timeout=1, total=3).head_object("models", "k")
    assert time.monotonic() - start < 3 + SLACK


# ---------------------------------------------------------------------------
# Memory: listing pages, error documents and the number of objects are capped


def _page(keys, token=None):
    items = "".join(f"<Contents><Key>{key}</Key><Size>1</Size></Contents>" for key in keys)
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    return f"<ListBucketResult>{more}{items}</ListBucketResult>".encode()


LIST_IN_CHILD = """
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
client = S3Client({url!r}, "AK", "SK", timeout=10, total=60)
try:
    print(len(list(client.list_objects("models", "org/"))))
except S3Error as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "declared"])
def test_a_256_mib_listing_page_is_refused_with_little_memory(hostile, baseline, declared):
    entry = b"<Contents><Key>org/" + b"k" * 200 + b"</Key><Size>1</Size></Contents>"

    def script(conn, req, srv):
        head = {"Content-Type": "application/xml"}
        send(conn, http_head(200, head, 256 << 20 if declared else None) + b"<ListBucketResult>")
        endless(conn, chunk=entry * 256, stop=srv.stop, limit=256 << 20)

    server = hostile(script)
    result = run_bounded(LIST_IN_CHILD.format(url=server.url))
    assert result["rc"] == 0, result["err"][-2000:]
    assert "refused:" in result["out"] and f"more than the {MAX_XML_BYTES} bytes" in result["out"]
    assert result["seconds"] < 20
    # One page at most (16 MiB) is held, never the 256 MiB, and a refused page is not fetched again.
    assert result["peak_rss_mib"] - baseline < 64, result
    assert len(server.requests) == 1


def test_a_listing_of_1000001_keys_is_refused_at_the_cap(hostile, baseline):
    total = 1_000_001

    def script(conn, req, srv):
        # A well-behaved pager (max-keys honoured) over a bucket far larger than any model.
        start = 0
        if "continuation-token=" in req.path:
            start = int(req.path.split("continuation-token=")[1].split("&")[0])
        stop = min(start + 1000, total)
        body = _page((f"org/{i:07d}" for i in range(start, stop)), token=str(stop) if stop < total else None)
        send(conn, http_head(200, {"Content-Type": "application/xml"}, len(body)) + body)

    server = hostile(script)
    result = run_bounded(LIST_IN_CHILD.format(url=server.url))
    assert result["rc"] == 0, result["err"][-2000:]
    assert f"the listing holds more than {MAX_LISTED_FILES} objects" in result["out"]
    assert len(server.requests) == MAX_LISTED_FILES // 1000 + 1
    assert result["seconds"] < 40
    assert result["peak_rss_mib"] - baseline < 160, result


def test_one_page_of_more_keys_than_the_cap_is_refused_while_parsing(hostile, baseline):
    body = _page(f"o/{i}" for i in range(MAX_LISTED_FILES + 1))
    assert len(body) < MAX_XML_BYTES
    server = hostile(lambda conn, req, srv: send(conn, http_head(200, length=len(body)) + body))
    result = run_bounded(LIST_IN_CHILD.format(url=server.url))
    assert f"the listing holds more than {MAX_LISTED_FILES} objects" in result["out"], result["err"][-2000:]
    assert result["peak_rss_mib"] - baseline < 160, result


def test_a_continuation_token_that_comes_back_is_refused(hostile):
    server = hostile(
        lambda conn, req, srv: send(conn, http_head(200, length=len(_page([], "same"))) + _page([], "same"))
    )
    with pytest.raises(S3Error, match="continuation token that is too long or came back"):
        list(client_for(server).list_objects("models", "org/"))
    assert len(server.requests) == 2


def test_an_endless_error_document_is_read_only_to_its_cap(hostile):
    def script(conn, req, srv):
        send(conn, http_head(403, {"Content-Type": "application/xml"}) + b"<Error><Code>AccessDenied</Code>")
        endless(conn, chunk=b"<Message>no</Message>" * 1000, stop=srv.stop)

    start = time.monotonic()
    with pytest.raises(S3Error, match="answered HTTP 403") as err:
        list(client_for(hostile(script)).list_objects("models"))
    assert time.monotonic() - start < 5 and err.value.status == 403


# ---------------------------------------------------------------------------
# Held: billion laughs, gzip


LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + b"".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'.encode() for i in range(1, 10)
    )
    + b"]><ListBucketResult><Contents><Key>&lol9;</Key><Size>1</Size></Contents></ListBucketResult>"
)


def test_billion_laughs_in_a_listing_or_an_error_is_refused_without_expanding(hostile, baseline):
    server = hostile(lambda conn, req, srv: send(conn, http_head(200, length=len(LAUGHS)) + LAUGHS))
    result = run_bounded(LIST_IN_CHILD.format(url=server.url))
    assert "refused:" in result["out"] and "document type declaration" in result["out"], result["err"][-2000:]
    assert result["seconds"] < 10 and result["peak_rss_mib"] - baseline < 32
    assert parse_error(LAUGHS.replace(b"ListBucketResult", b"Error")) == (None, None)


@pytest.mark.skipif(pyexpat.version_info < (2, 4, 1), reason="expat < 2.4.1 has no amplification limit")
def test_expat_alone_still_stops_billion_laughs():
    # The second line of defence: even a parser that let a DTD through stops at expat's amplification limit.
    with pytest.raises(ET.ParseError):
        ET.fromstring(LAUGHS.replace(b"lol9;", b"lol9;&lol9;&lol9;&lol9;&lol9;&lol9;&lol9;&lol9;&lol9;"))


def test_no_gzip_is_asked_for_or_inflated(hostile, tmp_path):
    import gzip

    packed = gzip.compress(b"\0" * (1 << 20))

    def script(conn, req, srv):
        send(conn, http_head(200, {"Content-Encoding": "gzip"}, len(packed)) + packed)

    server = hostile(script)
    dest = tmp_path / "part"
    got = client_for(server).get_object("models", "k", str(dest), size=len(packed))
    assert got["written"] == len(packed) and dest.read_bytes() == packed
    assert (server.requests[0].header("accept-encoding") or "identity") == "identity"


# ---------------------------------------------------------------------------
# Credentials stay with the endpoint: redirects are never followed


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_the_catcher_is_not_followed(hostile, catcher, tmp_path, status):
    server = hostile(lambda conn, req, srv: send(conn, http_head(status, {"Location": catcher.url + "/steal"}, 0)))
    client = client_for(server)
    for call in (
        lambda: client.head_object("models", "k"),
        lambda: client.get_object("models", "k", str(tmp_path / "part"), size=10),
        lambda: list(client.list_objects("models")),
        lambda: client.put_object("models", "k", b"data"),
    ):
        with pytest.raises(S3Error, match=f"answered HTTP {status}") as err:
            call()
        assert "redirects are not followed" in str(err.value)
    time.sleep(0.2)
    assert catcher.requests == []
    # The signature and the token went to the endpoint, and only there.
    assert all(req.header("x-amz-security-token") == TOKEN for req in server.requests)
    assert all(req.header("authorization").startswith("AWS4-HMAC-SHA256") for req in server.requests)


def test_5xx_retries_stay_with_the_endpoint(hostile, catcher):
    server = hostile(lambda conn, req, srv: send(conn, http_head(503, {"Location": catcher.url + "/retry"}, 0)))
    with pytest.raises(S3Error, match="answered HTTP 503"):
        client_for(server).head_object("models", "k")
    assert len(server.requests) == ATTEMPTS and catcher.requests == []


# ---------------------------------------------------------------------------
# Protocol errors and untrusted text


def test_garbage_instead_of_http_names_the_endpoint_and_the_request(hostile):
    server = hostile(lambda conn, req, srv: send(conn, b"SSH-2.0-OpenSSH_9.2\r\n\x1b]0;owned\x07\r\n"))
    with pytest.raises(S3Error) as err:
        client_for(server).head_object("models", "org/config.json")
    text = str(err.value)
    assert f"S3 HEAD s3://models/org/config.json at {server.url}" in text
    assert "broke the HTTP protocol" in text and "\x1b" not in text
    assert SECRET not in text and TOKEN not in text


def test_tls_to_a_plain_http_endpoint_is_a_clear_error():
    # A plain-HTTP answer to the TLS handshake (the harness would wait for a request head that never comes).
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer():
        for _attempt in range(ATTEMPTS):
            conn, _addr = listener.accept()
            with conn:
                conn.sendall(http_head(400, length=0))
                time.sleep(0.2)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(S3Error, match=rf"S3 HEAD s3://models/k at https://127\.0\.0\.1:{port} failed") as err:
            S3Client(f"https://127.0.0.1:{port}", ACCESS, SECRET, timeout=2, total=5).head_object("models", "k")
        assert "SSL" in str(err.value)
    finally:
        listener.close()


def test_error_text_from_the_server_is_made_printable(hostile):
    # (ESC and BEL cannot appear in XML 1.0; C1 controls, bidi overrides and line breaks can.)
    body = "<Error><Code>Access\u009b2JDenied</Code><Message>ok\nfatal: forged \u202e</Message></Error>".encode()
    server = hostile(lambda conn, req, srv: send(conn, http_head(403, length=len(body)) + body))
    with pytest.raises(S3Error) as err:
        list(client_for(server).list_objects("models", "p\x1b[31m/"))
    text = str(err.value)
    assert "\x1b" not in text and "\n" not in text and "\u009b" not in text and "\u202e" not in text
    assert "\\x9b" in text and "\\u202e" in text and "\\nfatal: forged" in text


def test_a_non_numeric_head_length_is_an_error(hostile):
    server = hostile(
        lambda conn, req, srv: send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\nConnection: close\r\n\r\n")
    )
    with pytest.raises(S3Error):
        client_for(server).head_object("models", "k")


# ---------------------------------------------------------------------------
# Through the module: a clear failure, never a traceback


def test_kernel_cache_against_garbage_fails_cleanly_through_the_module(hostile, tmp_path):
    server = hostile(lambda conn, req, srv: send(conn, b"\x00\xffnot http at all\r\n\r\n"))
    args = {
        "state": "deployed",
        "volume": str(tmp_path / "volume"),
        "model_name": "Qwen3-32B",
        "mesh": "P300x2",
        "impl_id": "tt_transformers",
        "tt_metal_commit": "8c48a10",
        "store": "s3",
        "s3_endpoint": server.url,
        "s3_bucket": "kernels",
        "s3_access_key": ACCESS,
        "s3_secret_key": SECRET,
        "owner": os.getuid(),
        "group": os.getgid(),
        "timeout": 2,
    }
    code = module_code("kernel_cache", args)
    result = run_bounded(code, timeout=60)
    out = as_json(result["out"])
    assert out.get("failed") and "Traceback" not in result["err"]
    assert f"at {server.url}" in out["msg"] and "broke the HTTP protocol" in out["msg"]
    assert SECRET not in result["out"] + result["err"]
