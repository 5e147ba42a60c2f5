"""The collection's clients through a real HTTP proxy (Debian's tinyproxy, started per test on 127.0.0.1) and through
hostile stand-ins for one: what reaches the proxy, what reaches the origin, and what an operator reads when the proxy
is wrong.

A recording relay sits between the client and tinyproxy and keeps every byte the client sent, so a test sees what
the proxy saw: for an https origin only a CONNECT head and then TLS, never the token or an S3 signature.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
from conftest import SLACK, HostileServer, drip, http_head, reply, send
from test_hub import REPO, SHA, TOKEN, _tls_context, hub_script

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import connection, read_capped
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import Hub, list_hf_source
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError

PROXY_USER, PROXY_PASSWORD = "fleet", "pr0xy-" + "Pa55word"
ACCESS_KEY, SECRET_KEY = "AKIA" + "HOSTILETEST0001", "hostile" + "SecretKey0123456789"
KEY = {"model_name": "m", "mesh": "n300", "impl_id": "tt", "tt_metal_commit": "a" * 7, "vllm_commit": "b" * 7}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Tinyproxy:
    """tinyproxy in the foreground on 127.0.0.1, optionally with basic auth, behind a relay that records the bytes
    clients send it (``sent``) and counts their connections."""

    def __init__(self, tmp_path, auth=False):
        binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
        if not os.access(binary, os.X_OK):
            pytest.fail("tinyproxy is not installed: tests/run-tests.sh hostile installs it (Debian package tinyproxy)")
        self.port = _free_port()
        conf = tmp_path / "tinyproxy.conf"
        lines = [f"Port {self.port}", "Listen 127.0.0.1", "Timeout 30", "MaxClients 50", "LogLevel Connect",
                 "Allow 127.0.0.1", "DisableViaHeader Yes"]
        if auth:
            lines.append(f"BasicAuth {PROXY_USER} {PROXY_PASSWORD}")
        conf.write_text("\n".join(lines) + "\n")
        self.log = tmp_path / "tinyproxy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
        for _attempt in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            time.sleep(0.05)
        else:
            self.close()
            pytest.fail(f"tinyproxy did not listen on {self.port}: {self.log.read_text()}")
        self.sent = bytearray()
        self.connections = 0
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                client, _addr = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src, dst, record):
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if record:
                    self.sent.extend(data)
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def with_auth(self, password=PROXY_PASSWORD):
        return self.url.replace("http://", f"http://{PROXY_USER}:{password}@")

    def close(self):
        self.stop.set()
        with contextlib.suppress(AttributeError, OSError):
            self.listener.close()
        self.proc.terminate()
        self.proc.wait(10)


class _Started:
    """``start(...)`` calls ``make(...)``; ``close()`` closes everything it made."""

    def __init__(self, make):
        self.make = make
        self.made = []

    def __call__(self, *args, **kwargs):
        self.made.append(self.make(*args, **kwargs))
        return self.made[-1]

    def close(self):
        for thing in self.made:
            thing.close()


@pytest.fixture
def tinyproxy(tmp_path):
    start = _Started(lambda auth=False: Tinyproxy(tmp_path, auth))
    try:
        yield start
    finally:
        start.close()


@pytest.fixture
def proxy_env(monkeypatch):
    """Set the proxy variables of this process (what a module sees from the role's ``environment``)."""
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
            monkeypatch.delenv(name)

    def put(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return put


class TlsServer(HostileServer):
    """A hostile server that speaks TLS (a certificate for 127.0.0.1, trusted through SSL_CERT_FILE)."""

    def __init__(self, script, context):
        self.context = context
        super().__init__(script)
        self.url = f"https://127.0.0.1:{self.port}"

    def _one(self, conn):
        try:
            conn = self.context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            conn.close()
            return
        super()._one(conn)


@pytest.fixture
def tls_origin(tmp_path, monkeypatch):
    context, cert = _tls_context(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    start = _Started(lambda script: TlsServer(script, context))
    try:
        yield start
    finally:
        start.close()


def test_an_https_hub_with_a_token_is_reached_through_a_connect_tunnel(tinyproxy, tls_origin, proxy_env):
    proxy = tinyproxy(auth=True)
    hub = tls_origin(hub_script(token=TOKEN))
    proxy_env(HTTPS_PROXY=proxy.with_auth())
    sha, files = list_hf_source(Hub(hub.url, TOKEN), REPO, SHA)
    assert (sha, [item["path"] for item in files]) == (SHA, ["model.safetensors"])
    assert hub.requests[-1].header("authorization") == f"Bearer {TOKEN}"
    assert proxy.connections >= 1
    heads = bytes(proxy.sent).split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert heads[0] == f"CONNECT 127.0.0.1:{hub.port} HTTP/1.0"
    assert any(line.startswith("Proxy-Authorization: Basic ") for line in heads)
    # What the proxy saw: CONNECT heads, then TLS records; the token and the request path never in the clear.
    assert TOKEN.encode() not in proxy.sent
    assert REPO.encode() not in proxy.sent
    assert b"CONNECT 127.0.0.1" in proxy.log.read_bytes()


def test_an_s3_signature_to_an_https_endpoint_stays_inside_the_tunnel(tinyproxy, tls_origin, proxy_env):
    proxy = tinyproxy()
    seen = []

    def s3(conn, req, srv):
        seen.append(req.header("authorization") or "")
        send(conn, http_head(200, {"ETag": '"x"', "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"}, 0))

    endpoint = tls_origin(s3)
    proxy_env(HTTPS_PROXY=proxy.url)
    client = S3Client(endpoint.url, ACCESS_KEY, SECRET_KEY, timeout=10)
    assert client.head_object("bucket", "key") is not None
    assert seen and ACCESS_KEY in seen[0]
    assert ACCESS_KEY.encode() not in proxy.sent
    assert bytes(proxy.sent).startswith(f"CONNECT 127.0.0.1:{endpoint.port} HTTP/1.0".encode())


def test_a_plain_http_hub_is_asked_in_absolute_form(tinyproxy, hostile, proxy_env):
    proxy = tinyproxy()
    hub = hostile(hub_script())
    proxy_env(HTTP_PROXY=proxy.url)
    assert list_hf_source(Hub(hub.url), REPO, SHA)[1][0]["path"] == "model.safetensors"
    assert bytes(proxy.sent).startswith(f"GET {hub.url}/api/models/{REPO}/tree/{SHA}".encode())
    assert hub.requests, "the origin was reached through the proxy"


def test_proxy_credentials_reach_the_proxy_of_a_plain_http_origin(tinyproxy, hostile, proxy_env):
    proxy = tinyproxy(auth=True)
    hub = hostile(hub_script())
    proxy_env(HTTP_PROXY=proxy.with_auth())
    assert list_hf_source(Hub(hub.url), REPO, SHA)[1][0]["path"] == "model.safetensors"
    assert b"Proxy-Authorization: Basic " in proxy.sent
    # The proxy takes its credentials off before it forwards the request.
    assert hub.requests and all(req.header("proxy-authorization") is None for req in hub.requests)
    proxy_env(HTTP_PROXY=proxy.url)
    with pytest.raises(WeightsError, match=r"the proxy http://127\.0\.0\.1:\d+ \(HTTP_PROXY\), on the way .* HTTP 407"):
        list_hf_source(Hub(hub.url), REPO, SHA)


def test_credentials_for_a_plain_http_origin_are_not_sent_through_the_proxy(tinyproxy, hostile, proxy_env):
    proxy = tinyproxy()
    endpoint = hostile(lambda conn, req, srv: send(conn, http_head(200, {}, 0)))
    proxy_env(HTTP_PROXY=proxy.with_auth())
    client = S3Client(endpoint.url, ACCESS_KEY, SECRET_KEY, timeout=5)
    with pytest.raises(S3Error) as err:
        client.head_object("bucket", "key")
    text = str(err.value)
    assert "carries credentials (Authorization), which would cross the proxy" in text
    assert f"http://{PROXY_USER}:***@127.0.0.1" in text
    assert "list its host in NO_PROXY" in text
    assert PROXY_PASSWORD not in text and SECRET_KEY not in text
    assert not proxy.sent and not endpoint.requests


def test_no_proxy_keeps_an_origin_direct(tinyproxy, hostile, proxy_env):
    proxy = tinyproxy()
    hub = hostile(hub_script())
    proxy_env(HTTP_PROXY=proxy.url, HTTPS_PROXY=proxy.url, NO_PROXY="example.net, 127.0.0.0/8")
    assert list_hf_source(Hub(hub.url), REPO, SHA)[1][0]["path"] == "model.safetensors"
    assert hub.requests and proxy.connections == 0


def test_peers_stay_direct_whatever_the_proxy_environment(tinyproxy, hostile, proxy_env):
    proxy = tinyproxy()
    store = hostile(lambda conn, req, srv: reply(conn, {"error": "none"}, 404))
    proxy_env(HTTP_PROXY=proxy.url, HTTPS_PROXY=proxy.url)
    assert HttpStore(f"{store.url}/{'0' * 32}/", timeout=5).read_manifest(KEY) is None
    assert store.requests and proxy.connections == 0
    # Told otherwise, the same store goes through the proxy (an origin beyond it), its token path included.
    assert HttpStore(f"{store.url}/{'0' * 32}/", timeout=5, use_proxy=True).read_manifest(KEY) is None
    assert proxy.connections == 1 and bytes(proxy.sent).startswith(f"GET {store.url}/".encode())


def test_a_wrong_proxy_password_is_named_masked(tinyproxy, tls_origin, proxy_env):
    proxy = tinyproxy(auth=True)
    hub = tls_origin(hub_script())
    proxy_env(HTTPS_PROXY=proxy.with_auth("wrong-" + "Secret9"))
    with pytest.raises(WeightsError) as err:
        list_hf_source(Hub(hub.url), REPO, SHA)
    text = str(err.value)
    assert re.search(r"refused the tunnel: HTTP 40[17] ", text), text
    assert "check the user and password in HTTPS_PROXY" in text
    # The Hub's messages hide the whole user info of a URL; the proxy's own message masks the password alone.
    assert f"the proxy http://********@127.0.0.1:{proxy.url.rpartition(':')[2]} (HTTPS_PROXY)" in text
    assert "Secret9" not in text
    assert not hub.requests


def test_an_unreachable_proxy_is_named_not_the_origin(hostile, proxy_env):
    hub = hostile(hub_script())
    dead = _free_port()
    proxy_env(HTTP_PROXY=f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{dead}")
    started = time.monotonic()
    with pytest.raises(WeightsError) as err:
        list_hf_source(Hub(hub.url, timeout=5), REPO, SHA)
    text = str(err.value)
    assert f"the proxy http://********@127.0.0.1:{dead} (HTTP_PROXY)" in text
    assert "ConnectionRefusedError" in text and "check HTTP_PROXY and that the proxy runs" in text
    assert "check hf_endpoint" not in text
    assert PROXY_PASSWORD not in text
    assert not hub.requests
    assert time.monotonic() - started < 30


def _s3_through(proxy_url, tls_origin, proxy_env, stall, total=8):
    endpoint = tls_origin(lambda conn, req, srv: send(conn, http_head(200, {}, 0)))
    proxy_env(HTTPS_PROXY=proxy_url)
    client = S3Client(endpoint.url, ACCESS_KEY, SECRET_KEY, timeout=stall, total=total)
    started = time.monotonic()
    with pytest.raises(S3Error) as err:
        client.head_object("bucket", "key")
    return str(err.value), time.monotonic() - started, endpoint


def test_a_proxy_that_never_answers_connect_hits_the_stall_limit(hostile, tls_origin, proxy_env):
    silent = hostile(lambda conn, req, srv: srv.stop.wait(30))
    # The overall limit is far above three stalls and their pauses (4.5 s): only the stall limit can end them.
    text, seconds, endpoint = _s3_through(silent.url, tls_origin, proxy_env, stall=1, total=60)
    assert f"the proxy {silent.url} (HTTPS_PROXY), on the way to 127.0.0.1:{endpoint.port}, stalled" in text, text
    assert silent.requests and silent.requests[0].method == "CONNECT"
    assert not endpoint.requests
    # Three attempts, each ending at the 1 s stall limit, with their pauses (0.5 s, 1 s); the proxy is silent 30 s.
    assert seconds < 3 * 1 + 1.5 + SLACK, seconds


def test_a_proxy_that_drips_its_connect_answer_hits_the_overall_limit(hostile, tls_origin, proxy_env):
    dripping = hostile(lambda conn, req, srv: drip(conn, b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 1000, 0.2, srv.stop))
    text, seconds, endpoint = _s3_through(dripping.url, tls_origin, proxy_env, stall=2)
    assert f"the proxy {dripping.url} (HTTPS_PROXY)" in text, text
    assert "did not finish within the 8 s limit" in text, text
    assert not endpoint.requests
    assert seconds < 8 + 10, seconds


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "broke the HTTP protocol (BadStatusLine"),
        (b"HTTP/1.1 403 No\x1b]0;pwned\x07\r\n\r\n", "refused the tunnel: HTTP 403 No\\x1b]0;pwned\\x07"),
        (b"", "broke the HTTP protocol (RemoteDisconnected"),
    ],
)
def test_a_proxy_that_answers_connect_with_garbage_is_a_counted_failure(
    hostile, tls_origin, proxy_env, answer, expected
):
    liar = hostile(lambda conn, req, srv: send(conn, answer))
    text, _seconds, endpoint = _s3_through(liar.url, tls_origin, proxy_env, stall=2)
    assert f"the proxy {liar.url} (HTTPS_PROXY)" in text, text
    assert expected in text, text
    assert "\x1b" not in text
    assert not endpoint.requests


def test_a_proxy_that_lies_about_the_tunnel_fails_the_tls_check_of_the_origin(hostile, tls_origin, proxy_env):
    def liar(conn, req, srv):
        # "Connected", then plain HTTP where the origin's TLS answer should be (once http.client read the 200 alone).
        send(conn, b"HTTP/1.1 200 Connection established\r\n\r\n")
        time.sleep(0.3)
        send(conn, http_head(200, {}, 0))

    proxy = hostile(liar)
    text, _seconds, endpoint = _s3_through(proxy.url, tls_origin, proxy_env, stall=2)
    assert "SSL" in text and f"(through the proxy {proxy.url})" in text, text
    assert ACCESS_KEY not in b"".join(req.raw for req in proxy.requests).decode("latin-1")
    assert not endpoint.requests


def test_a_kernel_store_beyond_an_unreachable_proxy_names_the_proxy(hostile, proxy_env):
    store = hostile(lambda conn, req, srv: reply(conn, {}, 404))
    dead = _free_port()
    proxy_env(HTTP_PROXY=f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{dead}")
    with pytest.raises(KernelError) as err:
        HttpStore(f"{store.url}/", timeout=5, use_proxy=True).read_manifest(KEY)
    text = str(err.value)
    assert f"the proxy http://{PROXY_USER}:***@127.0.0.1:{dead} (HTTP_PROXY)" in text
    assert PROXY_PASSWORD not in text and not store.requests


def test_a_registry_token_goes_through_the_tunnel_only(tinyproxy, tls_origin, proxy_env):
    """The registry client (container_image, image_mirror) through the proxy: its basic credentials and bearer token
    reach the registry inside TLS; the proxy sees CONNECT only."""
    from ansible_collections.ttfleet.inference.plugins.module_utils._images.registry import Registry

    proxy = tinyproxy()
    registry_token = "reg-" + "BearerToken42"
    seen = []

    def registry(conn, req, srv):
        seen.append((req.path, req.header("authorization")))
        if req.path.startswith("/token"):
            reply(conn, {"token": registry_token})
        elif req.header("authorization") != f"Bearer {registry_token}":
            realm = f'Bearer realm="{srv.url}/token",service="r"'
            send(conn, http_head(401, {"WWW-Authenticate": realm}, 0))
        else:
            send(conn, http_head(200, {"Docker-Content-Digest": "sha256:" + "c" * 64}, 0))

    server = tls_origin(registry)
    proxy_env(HTTPS_PROXY=proxy.url)
    client = Registry(f"127.0.0.1:{server.port}", auth=("robot", "regPassw0rd"), timeout=20, stall=5)
    assert client.manifest("lib/model", "1.0", method="HEAD")[2] == "sha256:" + "c" * 64
    assert any(auth == f"Bearer {registry_token}" for _path, auth in seen)
    for secret in (registry_token, "regPassw0rd", "robot"):
        assert secret.encode() not in proxy.sent
    assert bytes(proxy.sent).startswith(f"CONNECT 127.0.0.1:{server.port}".encode())


@pytest.mark.parametrize("through_proxy", [False, True])
def test_the_overall_limit_holds_for_a_tls_origin_that_drips_its_answer(
    tinyproxy, tls_origin, proxy_env, through_proxy
):
    """The watchdog is armed on the socket before CONNECT and the TLS handshake; the TLS socket that replaces it must
    still be shut down when the overall limit passes (the origin drips its status line 10x inside the stall limit,
    for 20 s, far longer than the limit)."""
    origin = tls_origin(lambda conn, req, srv: drip(conn, b"HTTP/1.1 200 " + b"O" * 200 + b"\r\n", 0.1, srv.stop))
    if through_proxy:
        proxy_env(HTTPS_PROXY=tinyproxy().url)
    deadline = Deadline(total=3, stall=1, what="the answer")
    started = time.monotonic()
    conn = connection("https", "127.0.0.1", origin.port, deadline, use_proxy=True)
    try:
        conn.request("GET", "/")
        # http.client takes the status line cut short by the shutdown for a whole one; reading on is refused.
        resp = conn.getresponse()
        with pytest.raises(NetError, match="did not finish within its 3 s limit"):
            read_capped(resp, 1024, "the answer", origin.url, deadline)
    except (OSError, http.client.HTTPException):
        pass  # or the cut came inside the status line: either way the deadline ended it
    finally:
        conn.close()
    assert deadline.expired
    assert time.monotonic() - started < 3 + SLACK
