"""model_weights against a hostile or broken Hugging Face hub on 127.0.0.1: the real Hub client (list_hf_source,
fetch_hf through sync_weights, and the module's main in a child process where memory matters).

Each "broke" case of issue 15 asserts its bound (seconds, bytes in staging, peak memory, what a catcher port
received); the "held" cases stay covered beside them.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import http.server
import ipaddress
import json
import re
import socket
import ssl
import struct
import threading
import time

import pytest
from conftest import (
    SLACK,
    answer_file,
    as_json,
    dir_bytes,
    drip,
    endless,
    http_head,
    long_head,
    reply,
    run_bounded,
    send,
    weights_options,
)

from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_LISTED_FILES, MAX_REDIRECTS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import fetch as fetch_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import hub as hub_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.fetch import NET_ATTEMPTS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import Hub, list_hf_source
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    PART_SUFFIX,
    STAGING_NAME,
    WeightsError,
    check_relpath,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
from ansible_collections.ttfleet.inference.plugins.plugin_utils import progress_action

REPO = "org/model"
SHA = "a" * 40
TREE = f"/api/models/{REPO}/tree/{SHA}"
RESOLVE = f"/{REPO}/resolve/{SHA}/"
# Shaped like an HF token, assembled at run time so no token-like string is committed.
TOKEN = "hf_" + "hostileTEST" + "token0123456789"
DATA = b"\0" * 4096


def entry(path, content=DATA, size=None):
    """A tree API entry of an LFS file holding ``content`` (listed at ``size``, default its length)."""
    size = len(content) if size is None else size
    return {
        "type": "file",
        "path": path,
        "size": 134,
        "oid": "d" * 40,
        "lfs": {"oid": hashlib.sha256(content).hexdigest(), "size": size, "pointerSize": 134},
    }


def hub_script(tree=None, files=None, token=None):
    """A hub: ``tree`` (a list, or a script) at the tree API, ``files`` ({path: bytes or a script}) at resolve/.
    With ``token``, both answer 401 unless the request carries it."""
    tree = [entry("model.safetensors")] if tree is None else tree
    files = {"model.safetensors": DATA} if files is None else files

    def script(conn, req, srv):
        if token and req.header("authorization") != f"Bearer {token}":
            reply(conn, {"error": "gated"}, 401)
        elif req.path.startswith(TREE):
            tree(conn, req, srv) if callable(tree) else reply(conn, tree)
        elif req.path.startswith(RESOLVE) and req.path[len(RESOLVE) :] in files:
            answer_file(conn, req, srv, files[req.path[len(RESOLVE) :]])
        else:
            reply(conn, {"error": "no such path"}, 404)

    return script


def opts(tmp_path, endpoint, **extra):
    return weights_options(tmp_path, source="hf", repo_id=REPO, revision=SHA, hf_endpoint=endpoint, **extra)


def staged(tmp_path):
    return tmp_path / "vol" / "weights" / STAGING_NAME / "M"


def fetch_requests(server):
    return [req for req in server.requests if req.path.startswith(RESOLVE)]


def _hwm_mib(err):
    return float(re.search(r"@@hwm_mib=([0-9.]+)", err).group(1))


def run_module(args, timeout=120):
    """The module's main in a child Python, with ``args`` (None: only import it): its result, wall time and the
    peak RSS of the child's own memory (VmHWM: ru_maxrss would also count the test process it was forked from)."""
    code = (
        "import json, re, sys, tempfile\n"
        "from ansible_collections.ttfleet.inference.plugins.modules import model_weights\n"
        f"args = {args!r}\n"
        "if args is not None:\n"
        "    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as handle:\n"
        "        json.dump({'ANSIBLE_MODULE_ARGS': args}, handle)\n"
        "    sys.argv = ['model_weights', handle.name]\n"
        "    try:\n"
        "        model_weights.main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "with open('/proc/self/status') as status:\n"
        "    hwm = int(re.search(r'VmHWM:\\s+(\\d+) kB', status.read()).group(1)) / 1024\n"
        "sys.stderr.write('@@hwm_mib=%.1f\\n' % hwm)\n"
    )
    result = run_bounded(code, timeout=timeout)
    result["json"] = as_json(result["out"]) if args is not None else None
    result["hwm_mib"] = _hwm_mib(result["err"])
    return result


@pytest.fixture(scope="module")
def module_baseline():
    """Peak RSS (MiB) of a child that only imports the module."""
    return run_module(None)["hwm_mib"]


def module_args(tmp_path, endpoint, **extra):
    args = opts(tmp_path, endpoint, **extra)
    del args["host"]
    return args


# ---------------------------------------------------------------------------
# Disk: a body longer than the listing writes nothing beyond the listed size


def _endless_zeros(conn, req, srv):
    send(conn, http_head(200, {"Content-Type": "application/octet-stream"}))
    endless(conn, stop=srv.stop)


def _declares_16_mib(conn, req, srv):
    send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 16 << 20))
    endless(conn, stop=srv.stop, limit=16 << 20)


@pytest.mark.parametrize("body", [_endless_zeros, _declares_16_mib], ids=["endless", "declared-16MiB"])
def test_a_body_longer_than_listed_fails_fast_and_leaves_nothing_beyond_the_size(hostile, tmp_path, body):
    # The first 4096 bytes are even the right ones: a source sending more than it lists is refused all the same.
    server = hostile(hub_script(files={"model.safetensors": body}))
    start = time.monotonic()
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server.url))
    elapsed = time.monotonic() - start
    msg = str(exc.value)
    assert elapsed < 10, elapsed
    assert f"127.0.0.1:{server.port}" in msg and "model.safetensors" in msg
    assert "sent more" in msg or "declared 16777216 bytes" in msg
    assert "partial file was removed" in msg
    assert len(fetch_requests(server)) == 1, "a source that sends more than it lists is not asked again"
    assert dir_bytes(tmp_path / "vol") <= 4096, "staging holds more than the listed size"
    assert not (staged(tmp_path) / ("model.safetensors" + PART_SUFFIX)).exists()
    assert not (tmp_path / "vol" / "weights" / "M" / "model.safetensors").exists()


def test_a_resumed_part_never_grows_past_the_listed_size(hostile, tmp_path):
    # The first attempt ends after 1000 bytes; the second asks for the rest, and the source answers the range
    # with 206 and then streams without end.
    def body(conn, req, srv):
        if req.header("range"):
            send(conn, http_head(206, {"Content-Range": "bytes 1000-4095/4096"}))
            endless(conn, stop=srv.stop)
        else:
            send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096) + DATA[:1000])

    server = hostile(hub_script(files={"model.safetensors": body}))
    sizes = []
    with pytest.raises(WeightsError, match=r"sent more for model\.safetensors") as exc:
        sync_weights(opts(tmp_path, server.url), callback=lambda done, total, file: sizes.append(done))
    assert "where 3096 were expected" in str(exc.value)
    assert [req.header("range") for req in fetch_requests(server)] == [None, "bytes=1000-"]
    assert max(sizes) <= 4096
    assert not (staged(tmp_path) / ("model.safetensors" + PART_SUFFIX)).exists()
    assert dir_bytes(tmp_path / "vol") <= 4096


def test_a_body_that_ends_early_is_retried_then_a_clear_error(hostile, tmp_path):
    def short(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096) + DATA[:1000])

    server = hostile(hub_script(files={"model.safetensors": short}))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server.url))
    msg = str(exc.value)
    assert msg.startswith(f"downloading model.safetensors of {REPO} from http://127.0.0.1:{server.port} failed 3 times")
    assert "ended after 1000 of its 4096 bytes" in msg
    assert len(fetch_requests(server)) == NET_ATTEMPTS
    # Later attempts resume (the server ignores the range and starts over, which is counted and handled).
    assert [req.header("range") for req in fetch_requests(server)][1:] == ["bytes=1000-", "bytes=1000-"]
    assert dir_bytes(staged(tmp_path)) <= 4096 + 4096  # the part (1000 bytes) and the small staging state


# ---------------------------------------------------------------------------
# Stalls: every request has a deadline, not only a per-read timeout


@pytest.fixture
def short_limits(monkeypatch):
    monkeypatch.setattr(fetch_module, "TRANSFER_FLOOR", 1.0)
    monkeypatch.setattr(hub_module, "REQUEST_TOTAL", 1.5)
    monkeypatch.setattr(hub_module, "LISTING_TOTAL", 3.0)


def test_a_dripped_file_stops_at_its_deadline(hostile, tmp_path, short_limits):
    def dripped(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096))
        drip(conn, DATA, stop=srv.stop)

    server = hostile(hub_script(files={"model.safetensors": dripped}))
    start = time.monotonic()
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, server.url, timeout=2))
    elapsed = time.monotonic() - start
    # Three attempts of 1 s (+ 4 KiB at 1 MiB/s) each; a per-read timeout alone would run for 800 s an attempt.
    assert elapsed < 3 * 1.0 + SLACK, elapsed
    assert "did not finish within its 1 s limit" in str(exc.value)
    assert len(fetch_requests(server)) == NET_ATTEMPTS


def test_a_silent_file_source_is_a_stall(hostile, tmp_path, short_limits, monkeypatch):
    monkeypatch.setattr(fetch_module, "TRANSFER_FLOOR", 60.0)

    def silent(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096))
        srv.stop.wait(30)

    server = hostile(hub_script(files={"model.safetensors": silent}))
    start = time.monotonic()
    with pytest.raises(WeightsError, match="stalled"):
        sync_weights(opts(tmp_path, server.url, timeout=1))
    # Three attempts of the 1 s stall limit; without it, three of the 60 s overall limit.
    assert time.monotonic() - start < 3 * 1 + SLACK


def test_a_listing_with_dripped_headers_stops_at_its_deadline(hostile, tmp_path, short_limits):
    server = hostile(hub_script(tree=lambda conn, req, srv: drip(conn, long_head(length=2) + b"[]", stop=srv.stop)))
    start = time.monotonic()
    # The stall limit (timeout) is far above the request's 1.5 s: only the overall limit can end it.
    with pytest.raises(WeightsError, match=r"did not finish within its 2 s limit"):
        sync_weights(opts(tmp_path, server.url, timeout=30))
    assert time.monotonic() - start < 1.5 + SLACK
    assert not (tmp_path / "vol").exists()


def test_endless_pages_stop_at_the_listing_deadline(hostile, tmp_path, short_limits, monkeypatch):
    # Each page comes whole in 0.3 s; the stall limit (timeout) and each page's own limit are far above the listing's
    # 3 s, so the listing's deadline is the only one that can end it, whichever page it falls in.
    monkeypatch.setattr(hub_module, "REQUEST_TOTAL", 60.0)

    def page(conn, req, srv):
        time.sleep(0.3)
        reply(conn, [], headers={"Link": f'<{srv.url}{TREE}?cursor={len(srv.requests)}>; rel="next"'})

    server = hostile(hub_script(tree=page))
    start = time.monotonic()
    with pytest.raises(WeightsError, match=r"within (its )?[0-3] s") as exc:
        sync_weights(opts(tmp_path, server.url, timeout=30))
    assert "stalled" not in str(exc.value)
    assert len([req for req in server.requests if req.path.startswith(TREE)]) > 1, "the deadline spans the pages"
    # Without the listing's limit the pages go on for MAX_LIST_PAGES times 0.3 s.
    assert time.monotonic() - start < 3 + SLACK


# ---------------------------------------------------------------------------
# Memory: capped replies, a capped number of files


def _endless_page(conn, req, srv):
    item = json.dumps(entry("x/model.safetensors")).encode() + b","
    send(conn, http_head(200, {"Content-Type": "application/json"}) + b"[")
    endless(conn, chunk=item * (65536 // len(item)), stop=srv.stop, limit=256 << 20)


def test_a_256_mib_file_list_page_is_refused_in_bounded_memory(hostile, tmp_path, module_baseline):
    server = hostile(hub_script(tree=_endless_page))
    result = run_module(module_args(tmp_path, server.url, _ansible_check_mode=True))
    assert result["json"].get("failed"), result["json"]
    assert "passed the 33554432-byte cap" in result["json"]["msg"]
    assert f"127.0.0.1:{server.port}" in result["json"]["msg"]
    print(f"256 MiB page: {result['seconds']:.1f} s, peak {result['hwm_mib']:.0f} MiB (baseline {module_baseline:.0f})")
    assert result["hwm_mib"] - module_baseline < 100, result["hwm_mib"]
    assert result["seconds"] < 30


def _pages_of(count, per_page):
    """A tree endpoint listing ``count`` files in pages of ``per_page``, each linking to the next."""
    body = json.dumps([{"type": "file", "path": f"f/{i:07d}.bin", "size": 1, "oid": "e" * 40} for i in range(per_page)])
    body = body.encode()

    def script(conn, req, srv):
        number = int(req.path.rsplit("cursor=", 1)[1]) if "cursor=" in req.path else 0
        headers = {}
        if (number + 1) * per_page < count:
            headers["Link"] = f'<{srv.url}{TREE}?recursive=true&expand=false&cursor={number + 1}>; rel="next"'
        reply(conn, body, headers=headers)

    return script


def test_a_million_files_are_refused_quickly_and_small(hostile, tmp_path, module_baseline):
    server = hostile(hub_script(tree=_pages_of(1_000_001, 10_000)))
    result = run_module(module_args(tmp_path, server.url, _ansible_check_mode=True))
    msg = result["json"].get("msg", "")
    assert result["json"].get("failed"), result["json"]
    # The last page is refused by its JSON values, counted before decoding, or by its entries once decoded.
    assert re.search(rf"more than {MAX_LISTED_FILES} entries|at most {MAX_LISTED_FILES} files", msg), msg
    pages = len([req for req in server.requests if req.path.startswith(TREE)])
    print(f"1,000,001 files: {pages} pages, {result['seconds']:.1f} s, peak {result['hwm_mib']:.0f} MiB")
    assert pages == MAX_LISTED_FILES // 10_000 + 1
    assert result["seconds"] < 30
    assert result["hwm_mib"] - module_baseline < 100, result["hwm_mib"]


def test_one_page_of_a_million_files_is_refused_by_its_size(hostile, tmp_path):
    def page(conn, req, srv):
        item = b'{"type":"file","path":"f/0000000.bin","size":1,"oid":"' + b"e" * 40 + b'"},'
        body = b"[" + item * 1_000_000 + item[:-1] + b"]"
        reply(conn, body)

    server = hostile(hub_script(tree=page))
    with pytest.raises(WeightsError, match=r"is \d+ bytes, above the 33554432-byte cap"):
        list_hf_source(Hub(server.url), REPO, SHA)


def test_a_page_of_many_tiny_values_is_refused_before_decoding(hostile):
    # 30 MiB of "[]," would decode into ten million lists: counted in the raw bytes and refused first.
    server = hostile(hub_script(tree=lambda conn, req, srv: reply(conn, b"[" + b"[]," * (10 << 20) + b"[]]")))
    with pytest.raises(WeightsError, match="refused before decoding"):
        list_hf_source(Hub(server.url), REPO, SHA)


# ---------------------------------------------------------------------------
# Credentials: the token stays with the configured origin


def test_a_next_page_on_another_origin_gets_nothing_even_after_a_401(hostile, tmp_path):
    catcher = hostile(lambda conn, req, srv: reply(conn, {"error": "who are you"}, 401))

    def tree(conn, req, srv):
        reply(conn, [entry("a.bin")], headers={"Link": f'<{catcher.url}{TREE}?cursor=2>; rel="next"'})

    hub = hostile(hub_script(tree=tree, files={"a.bin": DATA}, token=TOKEN))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, hub.url, hf_token=TOKEN))
    msg = str(exc.value)
    assert f"at http://127.0.0.1:{catcher.port}, another origin; refused" in msg
    assert TOKEN not in msg
    assert catcher.requests == [], "a request went to the next-page origin"
    assert any(req.header("authorization") == f"Bearer {TOKEN}" for req in hub.requests)


def test_next_pages_on_the_same_origin_are_followed_with_the_token(hostile, tmp_path):
    def tree(conn, req, srv):
        if "cursor=2" in req.path:
            reply(conn, [entry("b.bin")])
        else:
            reply(conn, [entry("a.bin")], headers={"Link": f'<{TREE}?recursive=true&cursor=2>; rel="next"'})

    hub = hostile(hub_script(tree=tree, files={"a.bin": DATA, "b.bin": DATA}, token=TOKEN))
    result = sync_weights(opts(tmp_path, hub.url, hf_token=TOKEN))
    assert result["plan"]["to_fetch"] == ["a.bin", "b.bin"]
    assert (tmp_path / "vol" / "weights" / "M" / "b.bin").read_bytes() == DATA


def test_a_cdn_redirect_works_and_the_cdn_never_sees_the_token(hostile, tmp_path):
    cdn = hostile(
        lambda conn, req, srv: send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, 4096) + DATA)
    )

    def resolve(conn, req, srv):
        send(conn, http_head(302, {"Location": f"{cdn.url}/xet/abc?X-Amz-Signature=s1gn3d&Expires=9"}, 0))

    hub = hostile(hub_script(files={"model.safetensors": resolve}, token=TOKEN))
    result = sync_weights(opts(tmp_path, hub.url, hf_token=TOKEN))
    assert result["fetched_bytes"] == 4096
    assert cdn.requests and all(req.header("authorization") is None for req in cdn.requests)
    assert cdn.requests[0].path == "/xet/abc?X-Amz-Signature=s1gn3d&Expires=9"
    assert all(req.header("authorization") == f"Bearer {TOKEN}" for req in fetch_requests(hub)[1:])


def test_a_cdn_answering_401_never_gets_the_token(hostile, tmp_path):
    cdn = hostile(lambda conn, req, srv: reply(conn, {"error": "expired"}, 401))

    def resolve(conn, req, srv):
        send(conn, http_head(302, {"Location": f"{cdn.url}/lfs/abc"}, 0))

    hub = hostile(hub_script(files={"model.safetensors": resolve}))
    with pytest.raises(WeightsError, match=r"refused file model\.safetensors"):
        sync_weights(opts(tmp_path, hub.url, hf_token=TOKEN))
    assert cdn.requests and all(req.header("authorization") is None for req in cdn.requests)
    # The token was tried once, on the endpoint's own origin.
    assert [req.header("authorization") for req in fetch_requests(hub)] == [None, f"Bearer {TOKEN}"]


def _tls_context(tmp_path):
    """A self-signed certificate for 127.0.0.1: (server context, path of the certificate to trust)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "hub.pem", tmp_path / "hub.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, str(cert_path)


def test_an_https_hub_redirecting_to_http_is_refused(hostile, tmp_path, monkeypatch):
    catcher = hostile(lambda conn, req, srv: reply(conn, []))
    context, cert = _tls_context(tmp_path)
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(302)
            self.send_header("Location", f"{catcher.url}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    try:
        with pytest.raises(WeightsError, match="redirected from https to http; downgrades are refused"):
            sync_weights(opts(tmp_path, f"https://127.0.0.1:{server.server_address[1]}", hf_token=TOKEN))
    finally:
        server.shutdown()
        server.server_close()
    assert seen and seen[-1][1] == f"Bearer {TOKEN}", "the https hub was reached with its token"
    assert catcher.requests == []


@pytest.mark.parametrize("target", ["file:///etc/shadow", "ftp://127.0.0.1:21/x", "gopher://127.0.0.1/x"])
def test_a_redirect_to_another_scheme_is_refused(hostile, tmp_path, target):
    hub = hostile(hub_script(tree=lambda conn, req, srv: send(conn, http_head(302, {"Location": target}, 0))))
    with pytest.raises(WeightsError, match=r"only http and https are followed|redirect that is not followed"):
        sync_weights(opts(tmp_path, hub.url))
    assert not (tmp_path / "vol").exists()


def _chain(hops):
    def tree(conn, req, srv):
        step = int(req.path.rsplit("hop=", 1)[1]) if "hop=" in req.path else 0
        if step < hops:
            send(conn, http_head(302, {"Location": f"{TREE}?hop={step + 1}"}, 0))
        else:
            reply(conn, [entry("model.safetensors")])

    return tree


def test_five_redirects_are_followed_and_six_refused(hostile, tmp_path):
    five = hostile(hub_script(tree=_chain(MAX_REDIRECTS)))
    assert list_hf_source(Hub(five.url), REPO, SHA)[1][0]["path"] == "model.safetensors"
    six = hostile(hub_script(tree=_chain(MAX_REDIRECTS + 1)))
    with pytest.raises(WeightsError, match=r"the file list .* redirect that is not followed .* more than 5 times"):
        list_hf_source(Hub(six.url), REPO, SHA)
    assert len([req for req in six.requests if req.path.startswith(TREE)]) == MAX_REDIRECTS + 1


def test_a_redirect_loop_is_refused(hostile, tmp_path):
    def tree(conn, req, srv):
        send(conn, http_head(302, {"Location": f"{TREE}?b" if req.path.endswith("?a") else f"{TREE}?a"}, 0))

    hub = hostile(hub_script(tree=tree))
    start = time.monotonic()
    with pytest.raises(WeightsError, match="in a loop"):
        list_hf_source(Hub(hub.url), REPO, SHA)
    assert time.monotonic() - start < 5


# ---------------------------------------------------------------------------
# Protocol errors are failures with a clear message, never a traceback


GARBAGE = b"SSH-2.0-OpenSSH_9.6\r\n\x1b]0;owned\x07\r\n"


def test_a_listing_that_is_not_http_is_a_clear_error(hostile, tmp_path):
    hub = hostile(hub_script(tree=lambda conn, req, srv: send(conn, GARBAGE)))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, hub.url))
    msg = str(exc.value)
    assert f"127.0.0.1:{hub.port} broke the HTTP protocol" in msg
    assert "the file list" in msg and "\x1b" not in msg


def _reset(conn, req, srv):
    # Linger 0: closing the connection sends a TCP reset instead of an answer.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize(
    "script",
    [
        lambda conn, req, srv: send(conn, GARBAGE),
        lambda conn, req, srv: send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
        _reset,
    ],
    ids=["not-http", "bad-chunks", "reset"],
)
def test_a_download_that_breaks_the_protocol_is_a_counted_failure(hostile, tmp_path, script):
    hub = hostile(hub_script(files={"model.safetensors": script}))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, hub.url))
    msg = str(exc.value)
    assert msg.startswith(f"downloading model.safetensors of {REPO} from http://127.0.0.1:{hub.port} failed 3 times")
    assert "\x1b" not in msg and "Traceback" not in msg
    assert len(fetch_requests(hub)) == NET_ATTEMPTS


def test_the_module_reports_a_protocol_error_without_a_traceback(hostile, tmp_path):
    hub = hostile(hub_script(tree=lambda conn, req, srv: send(conn, GARBAGE)))
    result = run_module(module_args(tmp_path, hub.url))
    assert result["json"]["failed"] is True
    assert "broke the HTTP protocol" in result["json"]["msg"]
    assert "Traceback" not in result["out"] + result["err"]
    assert "exception" not in result["json"]


# ---------------------------------------------------------------------------
# Operator output: untrusted names are shown escaped

HOSTILE_NAMES = [
    "\x1b]0;owned\x07model.safetensors",
    "a\nfatal: [qb2-1]: forged",
    "\x1b[2J\x1b[Hclear.bin",
    "x\u202egnp.exe",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_file_names_with_terminal_controls_are_refused_and_shown_escaped(hostile, tmp_path, name):
    hub = hostile(hub_script(tree=[entry("config.json"), entry(name)]))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, hub.url))
    msg = str(exc.value)
    assert "unusable file path" in msg
    assert not any(ch in msg for ch in "\x1b\x07\n\r\u202e"), repr(msg)
    assert printable(name) in msg
    assert not (tmp_path / "vol").exists()


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_progress_lines_show_names_and_states_escaped(name):
    status = {"done_bytes": 10, "total_bytes": 100, "rate": 5, "eta": 18, "file": name, "state": "x\x1b[31m"}
    line = progress_action.progress_line("qb2-1", status, 3)
    assert not any(ch in line for ch in "\x1b\x07\n\r\u202e"), repr(line)
    assert line.startswith("qb2-1: model_weights 10 B of 100 B (10.0%)")
    assert f"[{printable(name)}]" in line and ", x\\x1b[31m" in line


def test_a_status_file_with_odd_values_still_gives_a_line():
    status = {"done_bytes": "many", "total_bytes": -5, "rate": [1], "eta": "soon", "file": 7}
    assert progress_action.progress_line("h", status, 1) == "h: model_weights 0 B of 0 B at 0 B/s, ETA 0s [7]"
    status = progress_action.parse_status('{"done_bytes": NaN, "total_bytes": Infinity, "rate": -Infinity, "eta": NaN}')
    assert progress_action.progress_line("h", status, 1).startswith("h: model_weights 0 B of ")


def test_error_messages_from_the_hub_are_shown_escaped(hostile, tmp_path):
    def tree(conn, req, srv):
        reply(conn, {"error": "x"}, 404, {"X-Error-Message": "Repository \x1b]0;owned\x07not found\x1b[2J"})

    hub = hostile(hub_script(tree=tree))
    with pytest.raises(WeightsError) as exc:
        sync_weights(opts(tmp_path, hub.url))
    msg = str(exc.value)
    assert "HTTP 404 (Repository \\x1b]0;owned\\x07not found\\x1b[2J)" in msg
    assert "\x1b" not in msg and "\x07" not in msg


# ---------------------------------------------------------------------------
# Held, and staying held


@pytest.mark.parametrize(
    "path",
    ["../../victim", "/etc/shadow", "a/../../x", "a\x00b", "x" * 256, "/".join(["d" * 200] * 21), "a//b", "\ud800"],
    ids=["dotdot", "absolute", "inner-dotdot", "nul", "long-name", "long-path", "empty-part", "surrogate"],
)
def test_unusable_paths_are_refused_before_writing(hostile, tmp_path, path):
    hub = hostile(hub_script(tree=[entry("config.json"), entry(path)]))
    with pytest.raises(WeightsError, match="unusable file path"):
        sync_weights(opts(tmp_path, hub.url))
    assert not (tmp_path / "vol").exists()
    assert fetch_requests(hub) == []


def test_names_at_the_limits_are_accepted():
    check_relpath("x" * 255, "the Hub")
    check_relpath("/".join(["d" * 200] * 20), "the Hub")
    check_relpath("tokenizer (copy) é.json", "the Hub")


def test_a_petabyte_listing_is_refused_before_writing(hostile, tmp_path):
    hub = hostile(hub_script(tree=[entry("model.safetensors", size=1 << 50)]))
    with pytest.raises(WeightsError, match="not enough free space"):
        sync_weights(opts(tmp_path, hub.url))
    assert fetch_requests(hub) == []
    assert dir_bytes(tmp_path) == 0


def test_a_gzip_bomb_is_never_inflated(hostile, tmp_path):
    bomb = gzip.compress(b"[" + b" " * (200 << 20) + b"]", compresslevel=9)

    def tree(conn, req, srv):
        send(conn, http_head(200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, len(bomb)) + bomb)

    hub = hostile(hub_script(tree=tree))
    with pytest.raises(WeightsError, match="not JSON"):
        list_hf_source(Hub(hub.url), REPO, SHA)
    assert "gzip" not in (hub.requests[0].header("accept-encoding") or "")


@pytest.mark.parametrize("body", [b"[{", b"\xff\xfe", b"[" * 200_000 + b"]" * 200_000, b"{}"])
def test_malformed_or_deep_json_is_a_clear_error(hostile, body):
    hub = hostile(hub_script(tree=lambda conn, req, srv: reply(conn, body)))
    with pytest.raises(WeightsError, match=r"not JSON|not a list"):
        list_hf_source(Hub(hub.url), REPO, SHA)
