#!/usr/bin/env python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""An HTTP reverse proxy for tests that counts the body bytes it relays, per request, into a JSON-lines log.

Put it in front of an origin (olah, an S3 gateway) to measure how many bytes the fleet really read from it:
each line is ``{"method", "path", "status", "bytes"}`` with ``bytes`` the response body relayed.

    counting_proxy.py --listen HOST:PORT --upstream http://HOST:PORT --log FILE
        [--pidfile FILE] [--keep-host] [--rate BPS]

``--listen HOST:0`` picks a free port; the address is printed on stdout once the proxy listens.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import socketserver
import sys
import threading
import time
import urllib.parse

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def make_handler(upstream, log_path, keep_host=False, rate=0):
    target = urllib.parse.urlsplit(upstream)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):
            return

        def _relay(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {}
            for key, value in self.headers.items():
                if key.lower() not in HOP:
                    # Repeated headers (a Docker engine sends one Accept per media type) are joined, not dropped.
                    headers[key] = f"{headers[key]}, {value}" if key in headers else value
            if not keep_host:
                headers["Host"] = target.netloc
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            status, relayed = None, 0
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                status = resp.status
                self.send_response(resp.status)
                # A HEAD answer, a 204 and a 304 have no body: no chunked framing either (its terminator would be
                # read as the start of the next response on the connection).
                bodiless = self.command == "HEAD" or resp.status in (204, 304)
                chunked = resp.getheader("Content-Length") is None and not bodiless
                for key, value in resp.getheaders():
                    if key.lower() not in HOP:
                        self.send_header(key, value)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while self.command != "HEAD":
                    block = resp.read((64 << 10) if rate else (1 << 20))
                    if rate:
                        time.sleep(len(block) / rate)
                    if not block:
                        break
                    relayed += len(block)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            finally:
                conn.close()
                entry = {"method": self.command, "path": self.path, "status": status, "bytes": relayed}
                with lock, open(log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(entry) + "\n")

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

    return Handler


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--pidfile")
    # An S3 client signs the Host header it sends: keep it so the signature still matches upstream.
    parser.add_argument("--keep-host", action="store_true")
    # Bytes per second per response: slow enough for a test to interrupt a download midway.
    parser.add_argument("--rate", type=int, default=0)
    args = parser.parse_args(argv)
    host, _sep, port = args.listen.rpartition(":")
    server = Server((host, int(port)), make_handler(args.upstream, args.log, args.keep_host, args.rate))
    if args.pidfile:
        with open(args.pidfile, "w") as handle:
            handle.write(str(os.getpid()))
    print(f"http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
