"""The hostile-server harness: local servers on 127.0.0.1 that play a broken or malicious Hugging Face hub, S3
endpoint, peer, kernel store or instance port, and the measurements the tests assert on.

- ``hostile``: a raw TCP server; each connection runs a *script* ``script(conn, request)`` where ``request`` is the
  parsed request (method, path, headers, raw bytes) and ``conn`` a socket to write anything to: endless bodies,
  one byte a second, garbage instead of HTTP, redirects anywhere. Every request is recorded.
- ``catcher``: a second server that only records what reaches it (did a credential leave its origin?).
- ``run_bounded``: runs Python code in a child process and returns its exit, output, wall time and peak RSS, so a
  test asserts time and memory bounds on the real code path.
- ``drip``, ``http_head``, ``long_head``, ``endless``, ``reply``, ``answer_file``: script building blocks;
  ``weights_options``: the model_weights options the hub and peer tests share.

Time, on a loaded machine (issue 31: load 9 on 2 cores, as on shared CI runners): a test asserts on the outcome (which
error, what was left on disk, that the call ended), and a bound on wall time is a limit plus ``SLACK``. The hostile
behaviour a bound stops runs far longer than that (or without end), so the test still fails when the limit is missing.
Which of two limits fires is never left to scheduling: a dripping server sends a byte every ``DRIP`` seconds, well
inside any stall limit, when the overall limit is the one under test.

Nothing here reaches beyond 127.0.0.1; every server thread is a daemon and stops with the fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

# What a loaded machine adds to a limit before the test sees it fire: a child Python's start and imports, the
# scheduling of the server, watchdog and test threads. Seen under stress-ng --cpu 4 on 2 cores: up to ~2 s.
SLACK = 5.0
# Seconds between two bytes of a dripping server: a tenth of the smallest stall limit a test sets beside the overall
# limit it tests (2 s), so the stall limit cannot fire first however the machine schedules the two sides.
DRIP = 0.2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)


def pytest_configure(config):
    config.addinivalue_line("markers", "broke29(n): a case of issue 29 that broke the code before the fix")


class Request:
    def __init__(self, method, path, headers, raw):
        self.method, self.path, self.headers, self.raw = method, path, headers, raw

    def header(self, name):
        return self.headers.get(name.lower())


def read_request(conn, limit=65536, timeout=5):
    """Read one HTTP request head (and a Content-Length body) from ``conn``; None when the peer sends none."""
    conn.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < limit:
            part = conn.recv(4096)
            if not part:
                return None
            data += part
    except OSError:
        return None
    head, _sep, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, _version = lines[0].split(" ", 2)
    except ValueError:
        return Request("", "", {}, data)
    headers = {}
    for line in lines[1:]:
        name, _colon, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    want = int(headers.get("content-length", "0") or 0)
    try:
        while len(body) < want:
            part = conn.recv(65536)
            if not part:
                break
            body += part
    except OSError:
        pass
    return Request(method, path, headers, head + b"\r\n\r\n" + body)


def http_head(status=200, headers=None, length=None, gap=" "):
    """The status line and headers of a reply, as bytes (``gap`` between the version and the status code)."""
    lines = [f"HTTP/1.1{gap}{status} X"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def long_head(status=200, headers=None, length=None):
    """``http_head`` with 300 spaces before the status code (http.client reads any run of them): dripped at ``DRIP``
    seconds a byte, the status code comes after a minute, far past any bound a test asserts, so a missing limit cannot
    pass for a working one. A deadline cuts this head before it has a status: http.client takes a head cut anywhere
    after the status code for a whole answer, and the client would then judge headers it never got."""
    return http_head(status, headers, length, gap=" " * 300)


def send(conn, data):
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False


def drip(conn, data, every=DRIP, stop=None):
    """Send ``data`` one byte every ``every`` seconds (a stalled-but-alive origin)."""
    for byte in data:
        if stop is not None and stop.is_set():
            return
        if not send(conn, bytes([byte])):
            return
        time.sleep(every)


def endless(conn, chunk=b"\0" * 65536, stop=None, limit=1 << 34):
    """Send ``chunk`` again and again until the client goes away (or ``limit`` bytes)."""
    sent = 0
    while sent < limit and (stop is None or not stop.is_set()):
        if not send(conn, chunk):
            return sent
        sent += len(chunk)
    return sent


def reply(conn, body, status=200, headers=None):
    """A whole answer: ``body`` as it is when bytes, else as JSON."""
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send(conn, http_head(status, {"Content-Type": "application/json", **(headers or {})}, len(body)) + body)


def answer_file(conn, req, srv, body):
    """A file's answer: ``body`` (bytes) with its length, or ``body`` run as the script of this request."""
    if callable(body):
        body(conn, req, srv)
    else:
        send(conn, http_head(200, {"Content-Type": "application/octet-stream"}, len(body)) + body)


def weights_options(tmp_path, **source):
    """model_weights options for a volume under ``tmp_path`` owned by this user, with ``source``'s options on top."""
    options = {
        "dest": str(tmp_path / "vol" / "weights" / "M"),
        "owner": os.getuid(),
        "group": os.getgid(),
        "disk_margin_gb": 0,
        "host": "lab-1",
        "timeout": 5,
        "ignore_patterns": [],
    }
    options.update(source)
    return options


class HostileServer:
    def __init__(self, script):
        self.script = script
        self.requests = []
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            req = read_request(conn)
            if req is not None:
                self.requests.append(req)
            self.script(conn, req, self)
        except Exception:  # A hostile script may break its own connection; the test asserts on the client.
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def hostile():
    """``hostile(script)`` starts a server running ``script(conn, request, server)`` per connection."""
    servers = []

    def start(script):
        server = HostileServer(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def catcher(hostile):
    """A server that answers 200 with an empty JSON list and records every request (and its headers)."""

    def script(conn, req, server):
        send(conn, http_head(200, {"Content-Type": "application/json"}, 2) + b"[]")

    return hostile(script)


def run_bounded(code, timeout=120, env=None):
    """Run ``code`` in a child Python; returns a dict: rc, out, err, seconds, peak_rss_mib (of the child)."""
    wrapper = (
        "import resource, sys, json\n"
        f"sys.path.insert(0, {COLLECTIONS!r})\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "finally:\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forked pytest process.
        "    peak = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0] / 1024\n"
        "    sys.stderr.write('\\n@@peak_rss_mib=%.1f\\n' % peak)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", wrapper],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
        check=False,
    )
    seconds = time.monotonic() - start
    peak = None
    for line in proc.stderr.splitlines():
        if line.startswith("@@peak_rss_mib="):
            peak = float(line.split("=", 1)[1])
    return {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr, "seconds": seconds, "peak_rss_mib": peak}


def baseline_rss_mib():
    """Peak RSS of a child that only imports the collection's network code: the zero of memory assertions."""
    result = run_bounded("from ansible_collections.ttfleet.inference.plugins.module_utils._net import http  # noqa")
    return result["peak_rss_mib"]


def dir_bytes(path):
    """Bytes of every regular file below ``path`` (what a hostile origin left on disk)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def as_json(text):
    """The last JSON object printed in ``text`` (a module's result)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON in {text[-500:]!r}")


def limit_nofile(n):
    """preexec_fn for a child whose open-file limit is ``n``."""

    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply
