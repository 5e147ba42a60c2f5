"""The HTTP servers of the unit tests: real servers on 127.0.0.1 (or on a unix socket), each served by a daemon thread
and shut down when its ``with`` block ends, and the handler base that their stand-ins share.

Imported by name (``from http_servers import serve``): tests/unit is on sys.path through its conftest.py.
"""

import contextlib
import functools
import http.server
import socketserver
import threading
from typing import ClassVar


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that keeps the test output clean (no line per request) and sends whole answers."""

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=None):
        """Send ``status`` with ``headers``, a Content-Length and ``body`` (not for HEAD)."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Canned(QuietHandler):
    status = 200
    body = b""
    headers_out: ClassVar[dict] = {}
    path_only = None
    seen: ClassVar[list] = []

    def do_GET(self):
        type(self).seen.append(self.path)
        if self.path_only is not None and self.path != self.path_only:
            self.answer(404)
        else:
            self.answer(self.status, self.body, self.headers_out)


def canned(status=200, body=b"", headers=None, path=None):
    """A handler class that answers every GET with ``status``, ``headers`` and ``body`` (on ``path`` only when given,
    404 elsewhere) and lists the paths asked in its ``seen``. Its ``status`` and ``body`` may change while it serves."""
    attrs = {"status": status, "body": body, "headers_out": dict(headers or {}), "path_only": path, "seen": []}
    return type("Canned", (_Canned,), attrs)


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """HTTP on a unix socket (the Docker Engine API's transport)."""

    daemon_threads = True


@contextlib.contextmanager
def serving(server):
    """Serve ``server`` (bound already: an http.server, a socketserver or a subclass) in a daemon thread; leaving the
    block shuts it down and closes its socket."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def serve(handler):
    """A threading HTTP server of ``handler`` on a free port of 127.0.0.1, served for the ``with`` block."""
    return serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve_directory(directory):
    """The files below ``directory`` over HTTP (GET and HEAD), for the block."""
    return serve(functools.partial(_QuietFiles, directory=str(directory)))


def url(server):
    """``http://127.0.0.1:<port>`` of a server that ``serve`` started."""
    return f"http://127.0.0.1:{server.server_address[1]}"
