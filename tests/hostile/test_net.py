"""plugins/module_utils/_net/ against hostile servers: the deadlines, caps, redirect and credential rules every client
of the collection relies on."""

from __future__ import annotations

import io
import time
import urllib.error
import urllib.request

import pytest
from conftest import SLACK, drip, endless, http_head, long_head, send

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    RedirectPolicy,
    copy_capped,
    open_url,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_REDIRECTS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of


def test_headers_dripped_one_byte_at_a_time_stop_at_the_overall_deadline(hostile):
    server = hostile(lambda conn, req, srv: drip(conn, long_head(200, length=5) + b"hello", stop=srv.stop))
    start = time.monotonic()
    with pytest.raises(NetError, match="did not finish within its 2 s limit"):
        resp = open_url(server.url + "/x", Deadline(total=2, stall=10, what="the probe"))
        read_capped(resp, 100, "the body", server.url, None)
    assert time.monotonic() - start < 2 + SLACK


def test_a_silent_server_is_a_stall(hostile):
    server = hostile(lambda conn, req, srv: srv.stop.wait(30))
    start = time.monotonic()
    with pytest.raises(NetError, match="stalled"):
        open_url(server.url + "/x", Deadline(total=30, stall=0.5, what="the probe"))
    assert time.monotonic() - start < 0.5 + SLACK


def test_endless_body_is_cut_at_the_cap(hostile):
    server = hostile(lambda conn, req, srv: send(conn, http_head(200)) and endless(conn, stop=srv.stop))
    deadline = Deadline(total=30, stall=5)
    resp = open_url(server.url + "/list", deadline)
    with pytest.raises(NetError, match="passed the 1048576-byte cap"):
        read_capped(resp, 1 << 20, "the file list", server.url, deadline)


def test_declared_length_above_the_cap_is_refused_before_reading(hostile):
    server = hostile(lambda conn, req, srv: send(conn, http_head(200, length=1 << 40)))
    resp = open_url(server.url + "/list", Deadline())
    with pytest.raises(NetError, match="1099511627776 bytes, above the 1024-byte cap"):
        read_capped(resp, 1024, "the file list", server.url)


def test_copy_writes_exactly_the_expected_bytes_and_never_one_more(hostile):
    server = hostile(
        lambda conn, req, srv: send(conn, http_head(200)) and endless(conn, chunk=b"x" * 1000, stop=srv.stop)
    )
    out = io.BytesIO()
    resp = open_url(server.url + "/f", Deadline())
    with pytest.raises(NetError, match="sent more than the 4096 bytes expected"):
        copy_capped(resp, out.write, 4096, "model.safetensors", server.url, Deadline())
    assert len(out.getvalue()) == 4096
    short = hostile(lambda conn, req, srv: send(conn, http_head(200) + b"y" * 10))
    out = io.BytesIO()
    resp = open_url(short.url + "/f", Deadline())
    assert copy_capped(resp, out.write, 4096, "f", short.url) == 10


def test_credentials_stay_with_their_origin_on_redirects(hostile, catcher):
    origin = hostile(lambda conn, req, srv: send(conn, http_head(302, {"Location": catcher.url + "/cdn"}, 0)))
    resp = open_url(origin.url + "/resolve", Deadline(), credentials={"Authorization": "Bearer hf_secret"})
    assert resp.status == 200
    assert origin.requests[0].header("authorization") == "Bearer hf_secret"
    assert catcher.requests and catcher.requests[0].header("authorization") is None


def test_credentials_never_go_to_a_url_of_another_origin(catcher):
    # A next-page link or a retry aimed elsewhere: the credential origin decides, not the URL.
    open_url(
        catcher.url + "/page2",
        Deadline(),
        credentials={"Authorization": "Bearer hf_secret", "X-Amz-Security-Token": "tok"},
        credential_origin=("https", "huggingface.co", 443),
    )
    assert catcher.requests[0].header("authorization") is None
    assert catcher.requests[0].header("x-amz-security-token") is None


@pytest.mark.parametrize("target", ["file:///etc/shadow", "ftp://127.0.0.1/x", "gopher://127.0.0.1/"])
def test_redirects_only_to_http_and_https(hostile, target):
    server = hostile(lambda conn, req, srv: send(conn, http_head(302, {"Location": target}, 0)))
    with pytest.raises((NetError, urllib.error.HTTPError)):
        open_url(server.url + "/x", Deadline())


def test_a_downgrade_to_http_is_refused():
    req = urllib.request.Request("https://huggingface.co/x", headers={"Authorization": "Bearer t"})
    policy = RedirectPolicy(origin_of("https://huggingface.co/"))
    with pytest.raises(NetError, match="from https to http"):
        policy.redirect_request(req, None, 302, "Found", {}, "http://huggingface.co/x")


def test_redirect_loops_and_chains_are_bounded(hostile):
    hops = []

    def script(conn, req, srv):
        hops.append(req.path)
        send(conn, http_head(302, {"Location": f"{srv.url}/hop{len(hops)}"}, 0))

    server = hostile(script)
    with pytest.raises(urllib.error.HTTPError, match="redirect"):
        open_url(server.url + "/start", Deadline())
    assert len(hops) <= MAX_REDIRECTS + 1


def test_garbage_instead_of_http_is_a_clear_error(hostile):
    server = hostile(lambda conn, req, srv: send(conn, b"SSH-2.0-OpenSSH_9.2\r\n\x1b]0;owned\x07\r\n"))
    with pytest.raises(NetError, match=r"127\.0\.0\.1:\d+ broke the HTTP protocol"):
        open_url(server.url + "/health", Deadline(total=5, stall=2))


def test_a_body_that_ends_early_is_a_protocol_error(hostile):
    server = hostile(lambda conn, req, srv: send(conn, http_head(200, length=1000) + b"short"))
    resp = open_url(server.url + "/x", Deadline())
    with pytest.raises(NetError, match="broke the HTTP protocol"):
        read_capped(resp, 4096, "the body", server.url)


def test_printable_escapes_terminal_controls():
    text = "a\x1b[2J\x1b]0;t\x07\nfatal: forged\r\u202e\x9b"
    shown = printable(text)
    assert not any(ch in shown for ch in "\x1b\x07\n\r\u202e\x9b")
    assert "\\x1b[2J" in shown and "\\nfatal: forged" in shown
    assert printable("x" * 1000, limit=10).startswith("xxxxxxxxxx...(990 more")


def test_origin_normalises_default_ports_and_case():
    assert origin_of("HTTPS://HuggingFace.co/x") == origin_of("https://huggingface.co:443/y")
    assert origin_of("http://h:80/") != origin_of("https://h/")
