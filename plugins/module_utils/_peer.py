# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""A temporary read-only HTTP server for the weights of one model, so fleet hosts can pull from a peer.

Standard library only. The server answers ``GET``/``HEAD`` of ``/<token>/<file>`` for exactly the files
listed in the directory's ``.ttfleet-manifest.json`` (and the manifest itself), with ``Range`` support
so a puller resumes; anything else is 404. ``token`` is a random path element: it keeps other clients on
the network from browsing, it is not an access control for secret data.

``start_server`` binds the socket in the caller (so the port is known and errors surface there), then
detaches a daemon (double fork, new session, stdio on /dev/null) that serves until ``stop_server``
signals it or ``ttl`` seconds pass, whichever comes first, so a play that dies never leaves it behind
for long. The daemon records the bytes it served in ``<run_dir>/<name>.json``.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import threading
import time
import urllib.parse

from ansible_collections.ttfleet.inference.plugins.module_utils._volumes import MANIFEST_NAME

CHUNK = 1 << 20
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PeerError(Exception):
    """A server that cannot start or stop; the message names the input and the fix."""


def served_files(directory):
    """``{relative path: size}`` the server may hand out: the manifest's files that exist, plus the manifest."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise PeerError(
            f"{directory} has no readable {MANIFEST_NAME} ({exc}); only weights this collection placed can be served"
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise PeerError(f"{path} lists no files; only complete weights can be served")
    allowed = {MANIFEST_NAME}
    for rel in files:
        parts = rel.split("/")
        if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
            continue
        allowed.add(rel)
    return allowed


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_handler(directory, token, allowed, counter):
    """A request handler class serving ``allowed`` files of ``directory`` under ``/<token>/``."""
    prefix = f"/{token}/"

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "ttfleet-weights/1"
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):
            return

        def _fail(self, code):
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _resolve(self):
            path = urllib.parse.urlsplit(self.path).path
            if not path.startswith(prefix):
                return None
            rel = urllib.parse.unquote(path[len(prefix) :])
            if rel not in allowed:
                return None
            full = os.path.join(directory, *rel.split("/"))
            # Never follow a link out of the directory, even if one appeared after the start.
            if os.path.islink(full) or not os.path.realpath(full).startswith(os.path.realpath(directory) + os.sep):
                return None
            return full

        def _serve(self, body):
            full = self._resolve()
            if full is None:
                self._fail(404)
                return
            try:
                handle = open(full, "rb")  # noqa: SIM115 - closed below
            except OSError:
                self._fail(404)
                return
            with handle:
                size = os.fstat(handle.fileno()).st_size
                start, end = 0, size - 1
                match = re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
                if match:
                    start = int(match.group(1))
                    if match.group(2):
                        end = min(int(match.group(2)), size - 1)
                    if start >= size or start > end:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    self.send_response(200)
                length = max(end - start + 1, 0)
                self.send_header("Content-Length", str(length))
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not body:
                    return
                handle.seek(start)
                remaining = length
                while remaining > 0:
                    block = handle.read(min(CHUNK, remaining))
                    if not block:
                        break
                    self.wfile.write(block)
                    remaining -= len(block)
                    counter.add(len(block))

        def do_GET(self):
            self._serve(True)

        def do_HEAD(self):
            self._serve(False)

    return Handler


class Counter:
    """Bytes served, written to ``stats_path`` at most every second and at exit."""

    def __init__(self, stats_path, info):
        self.lock = threading.Lock()
        self.bytes = 0
        self.stats_path = stats_path
        self.info = info
        self.written = 0.0

    def add(self, count):
        with self.lock:
            self.bytes += count
            if time.monotonic() - self.written >= 1.0:
                self.flush()

    def flush(self, state="serving"):
        self.written = time.monotonic()
        data = dict(self.info, served_bytes=self.bytes, state=state)
        temp = f"{self.stats_path}.tmp-{os.getpid()}"
        with contextlib.suppress(OSError):
            with open(temp, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(temp, self.stats_path)


def default_address():
    """The address of the interface that holds the default route, else the one the host name resolves to.

    Connecting a UDP socket sends nothing; it only makes the kernel choose the source address.
    """
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))
        address = sock.getsockname()[0]
        if address and not address.startswith("0."):
            return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        raise PeerError("cannot find this host's address; set bind to the address peers reach it at") from None


def state_path(run_dir, name):
    if not _NAME_RE.match(name or ""):
        raise PeerError(f"name {name!r} must be letters, digits, '.', '_' or '-' (it names the state file)")
    return os.path.join(run_dir, f"{name}.json")


def read_state(run_dir, name):
    try:
        with open(state_path(run_dir, name), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def alive(state):
    """Whether the daemon of ``state`` still runs (same pid and the start time it recorded)."""
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or pid <= 1:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and int(fields[19]) == state.get("starttime")
    except (OSError, IndexError, ValueError):
        return False


def _starttime(pid):
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def start_server(directory, bind, port=0, ttl=3600, run_dir="/run/ttfleet-weights", name="weights"):
    """Start serving ``directory`` on ``bind:port`` (0 picks a free port); returns the state dict.

    The state (pid, port, token, url, path, expires) is written to ``<run_dir>/<name>.json`` (mode 0600).
    """
    directory = os.path.realpath(directory)
    allowed = served_files(directory)
    path = state_path(run_dir, name)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        server = type("PeerServer", (_Server,), {"address_family": family})((bind, port), None, False)
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise PeerError(
                f"cannot bind {bind}: not an address of this host; set the fleet address to one it has"
            ) from None
        raise PeerError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}; pick another port or 0") from None
    token = secrets.token_hex(16)
    real_port = server.server_address[1]
    host = f"[{bind}]" if ":" in bind else bind
    state = {
        "path": directory,
        "bind": bind,
        "port": real_port,
        "token": token,
        "url": f"http://{host}:{real_port}/{token}/",
        "expires": int(time.time() + ttl),
        "files": len(allowed) - 1,
    }
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # pragma: no cover - runs in the detached daemon
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, server.socket.fileno())
            os.closerange(server.socket.fileno() + 1, 65536)
            os.chdir("/")
            _serve_until(server, directory, token, allowed, state, path, ttl)
        finally:
            os._exit(0)
    os.close(write_end)
    server.socket.close()
    os.waitpid(first, 0)
    with os.fdopen(read_end, "rb") as handle:
        pid_text = handle.read().decode() or "0"
    state["pid"] = int(pid_text)
    try:
        state["starttime"] = _starttime(state["pid"])
    except (OSError, IndexError, ValueError):
        raise PeerError(f"the weights server for {directory} exited right after starting") from None
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    os.replace(path + ".new", path)
    return state


def _serve_until(server, directory, token, allowed, state, path, ttl):  # pragma: no cover - daemon side
    counter = Counter(path + ".stats", {"url": state["url"]})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.RequestHandlerClass = make_handler(directory, token, allowed, counter)
    server.timeout = 0.5
    deadline = time.monotonic() + ttl
    while not stop.is_set() and time.monotonic() < deadline:
        server.handle_request()
    server.server_close()
    counter.flush("stopped")


def stop_server(run_dir, name, wait=10.0):
    """Stop the daemon recorded for ``name``; returns ``(was_running, served_bytes)``. Missing state is fine."""
    path = state_path(run_dir, name)
    state = read_state(run_dir, name)
    if state is None:
        return False, 0
    running = alive(state)
    if running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + wait
        while alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state["pid"], signal.SIGKILL)
    served = 0
    try:
        with open(path + ".stats", encoding="utf-8") as handle:
            served = int(json.load(handle).get("served_bytes", 0))
    except (OSError, ValueError, TypeError):
        pass
    for leftover in (path, path + ".stats"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)
    return running, served
