#!/usr/bin/env python
"""A gate in front of the lab's Hugging Face mirror that refuses gated repositories without a token (tests only).

huggingface.co answers requests for a gated repository without a valid token with HTTP 401 (anonymous) or 403
(a token without access) and an ``X-Error-Message`` header. olah, the lab mirror, gates nothing, so the fault
suite puts this proxy in front of it:

    gated_hub.py --listen HOST:0 --upstream http://HOST:PORT --gated ORG/NAME [--gated ...]
                 --token-file FILE --pidfile FILE

Requests under a gated repository (``/api/models/ORG/NAME/...`` and ``/ORG/NAME/resolve/...``) are relayed
only with ``Authorization: Bearer <the token in FILE>``: without one the answer is 401, with another 403.
Everything else is relayed as is. The token is read from a file so that it is never on a command line. The
listening address is printed on stdout.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import http.server
import os
import socketserver
import sys
import urllib.parse

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host"}


def gated_repo(path, gated):
    path = urllib.parse.urlsplit(path).path
    for repo in gated:
        if path.startswith((f"/api/models/{repo}/", f"/{repo}/resolve/")) or path == f"/api/models/{repo}":
            return repo
    return None


def make_handler(upstream, gated, token):
    target = urllib.parse.urlsplit(upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):
            return

        def _refuse(self, code, message):
            body = b'{"error": "' + message.encode() + b'"}'
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Error-Code", "GatedRepo")
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _relay(self):
            repo = gated_repo(self.path, gated)
            if repo:
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Bearer "):
                    self._refuse(
                        401,
                        f"Access to model {repo} is restricted. You must have access to it and be "
                        "authenticated to access it. Please log in.",
                    )
                    return
                if not hmac.compare_digest(auth[len("Bearer ") :].encode(), token.encode()):
                    self._refuse(403, f"Access to model {repo} is restricted and you are not in the authorized list.")
                    return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP and k.lower() != "authorization"}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            try:
                conn.request(self.command, self.path, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                length = resp.getheader("Content-Length")
                for key, value in resp.getheaders():
                    if key.lower() not in HOP:
                        self.send_header(key, value)
                chunked = length is None and self.command != "HEAD"
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while self.command != "HEAD":
                    block = resp.read(1 << 20)
                    if not block:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            finally:
                conn.close()

        do_GET = do_HEAD = _relay

    return Handler


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--gated", action="append", default=[])
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--pidfile")
    args = parser.parse_args(argv)
    with open(args.token_file, encoding="utf-8") as handle:
        token = handle.read().strip()
    host, _sep, port = args.listen.rpartition(":")
    server = Server((host, int(port)), make_handler(args.upstream, args.gated, token))
    if args.pidfile:
        with open(args.pidfile, "w") as handle:
            handle.write(str(os.getpid()))
    print(f"http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
