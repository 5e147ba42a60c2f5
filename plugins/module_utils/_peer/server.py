# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer server's HTTP: one request whose head the gate read whole, answered from the catalog.

Requests are ``GET``/``HEAD`` of ``/<token>/<relative path>`` with ``Range`` support so a puller resumes; the
token is a random 128-bit path element that keeps other clients on the network out (it travels over plain HTTP:
serve only on the site network). Every answer closes its connection (``Connection: close``).
"""

from __future__ import annotations

# The request parser of the standard library only; files are served by the handler below, never by
# SimpleHTTPRequestHandler (which would serve a whole tree and follow links).
import http.server
import io
import os
import re
import socket
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._peer.catalog import open_pinned
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import Refused

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._peer.catalog import Pin
    from ansible_collections.ttfleet.inference.plugins.module_utils._peer.gate import Address, RequestHandler
    from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import Counter

CHUNK = 1 << 20
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")
# A range bound of more digits is past the end of any file (and int() of thousands of digits raises).
_RANGE_DIGITS = 18


class _StallWriter:
    """The ``wfile`` of a handler: writes to a socket whose timeout is ``WRITE_STALL``, so a client that takes no
    byte for that long raises TimeoutError (each ``send`` waits for room for at least one byte, not for all)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[self.sock.send(view) :]
        return len(data)

    def flush(self) -> None:
        return


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` of a ``Range`` header for a file of ``size`` bytes; None for the whole file (no or another
    form of range, which HTTP lets a server ignore); Refused(416) when it is not satisfiable."""
    match = _RANGE_RE.match(header or "")
    if not match:
        return None
    first, last = match.groups()
    if len(first) > _RANGE_DIGITS or int(first) >= size:
        raise Refused(416)
    start, end = int(first), size - 1
    if last and len(last) <= _RANGE_DIGITS:
        end = min(int(last), end)
    if start > end:
        raise Refused(416)
    return start, end


def make_handler(rootfd: int, token: str, files: Mapping[str, Pin], counter: Counter) -> RequestHandler:
    """A request handler class serving the catalog ``files`` below ``rootfd`` under ``/<token>/``.

    It answers one request whose head the gate has read whole, ``Handler(sock, client_address, head)``, and leaves
    the socket open for the caller to close."""
    prefix = f"/{token}/"

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "ttfleet-peer/2"
        protocol_version = "HTTP/1.1"

        def __init__(self, sock: socket.socket, client_address: Address, head: bytes) -> None:
            self.head = head
            # No server object: the gate read the head and owns the socket.
            super().__init__(sock, client_address, cast("Any", None))

        def setup(self) -> None:
            self.connection = self.request
            self.rfile = io.BytesIO(self.head)
            # Only write() and flush() of the handler's wfile are used.
            self.wfile = cast("io.BufferedIOBase", _StallWriter(self.connection))

        def finish(self) -> None:
            return

        def log_message(self, *_args: Any) -> None:
            return

        def _empty(self, code: int, headers: Iterable[tuple[str, str]] = ()) -> None:
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()

        def _serve(self, body: bool) -> None:
            path = urllib.parse.urlsplit(self.path).path
            # None (outside the prefix) is no catalog key: answered 404 below, so rel is a str past that.
            rel = cast("str", urllib.parse.unquote(path[len(prefix) :]) if path.startswith(prefix) else None)
            pin = files.get(rel)
            if pin is None:
                self._empty(404)
                return
            try:
                fd, size = open_pinned(rootfd, rel, pin)
            except Refused as refused:
                self._empty(refused.code)
                return
            with os.fdopen(fd, "rb") as handle:
                try:
                    wanted = _range(self.headers.get("Range"), size)
                except Refused as refused:
                    self._empty(refused.code, [("Content-Range", f"bytes */{size}")])
                    return
                if wanted:
                    start, end = wanted
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    start, end = 0, size - 1
                    self.send_response(200)
                length = max(end - start + 1, 0)
                self.send_header("Content-Length", str(length))
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Connection", "close")
                self.end_headers()
                if not body:
                    return
                done = 0
                while done < length:
                    # sendfile waits at most the socket's timeout (WRITE_STALL) for room for each piece.
                    sent = self.connection.sendfile(handle, start + done, min(CHUNK, length - done))
                    if not sent:  # the file shrank below its pinned size: the peer sees a short body
                        break
                    done += sent
                    counter.add(sent)

        def do_GET(self) -> None:
            self._serve(True)

        def do_HEAD(self) -> None:
            self._serve(False)

    return Handler
