#!/usr/bin/env python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""LAB STAND-IN, tests only: a Hugging Face Hub endpoint for one repository that sends file bodies at a fixed
rate, so that a weights transfer lasts long enough for its progress lines to be observed.

It answers the three calls a snapshot needs (revision, tree, resolve) for the files under --root, all listed as
LFS files with their real sha256. It writes the port it listens on to --port-file.

    slow_hub.py --root DIR --repo org/name --rate 2097152 --host 172.17.0.1 --port-file hub.port
"""

import argparse
import hashlib
import http.server
import json
import os
import time
import urllib.parse


def build_repo(root):
    files = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                data = handle.read()
            rel = os.path.relpath(path, root)
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            files[rel] = {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "blob": blob}
    commit = hashlib.sha1(json.dumps(sorted((k, v["sha256"]) for k, v in files.items())).encode()).hexdigest()
    return commit, files


def handler_for(repo, commit, files, rate):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, data):
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _missing(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            api = f"/api/models/{repo}/"
            if path.startswith(api + "revision/"):
                return self._json({"id": repo, "sha": commit, "lastModified": "2026-11-30T00:00:00.000Z"})
            if path == api + f"tree/{commit}":
                return self._json(
                    [
                        {"type": "file", "path": rel, "size": f["size"], "oid": f["blob"],
                         "lfs": {"oid": f["sha256"], "size": f["size"]}}
                        for rel, f in sorted(files.items())
                    ]
                )
            prefix = f"/{repo}/resolve/{commit}/"
            if not path.startswith(prefix) or path[len(prefix):] not in files:
                return self._missing()
            entry = files[path[len(prefix):]]
            self.send_response(200)
            self.send_header("Content-Length", str(entry["size"]))
            self.send_header("ETag", f'"{entry["sha256"]}"')
            self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            chunk = max(rate // 10, 1)
            with open(entry["path"], "rb") as handle:
                while True:
                    block = handle.read(chunk)
                    if not block:
                        break
                    self.wfile.write(block)
                    time.sleep(0.1)

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--rate", type=int, default=2 << 20, help="bytes per second per file body")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()
    commit, files = build_repo(args.root)
    server = http.server.ThreadingHTTPServer((args.host, 0), handler_for(args.repo, commit, files, args.rate))
    with open(args.port_file + ".tmp", "w") as handle:
        handle.write(f"{server.server_address[1]}\n")
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
