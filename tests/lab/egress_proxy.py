#!/usr/bin/env python
"""The lab's egress proxy and release origin (tests and lab only): hosts with no route to the origins reach them
through a real HTTP proxy, as hosts behind a site's egress proxy do.

LAB ONLY: this tool serves the molecule scenario ``proxy`` on this machine. It is no part of the collection and
nothing of it belongs on a real site.

    tests/lab/egress_proxy.py start --network NET --state DIR --vars-file PATH [--origin-network bridge]
    tests/lab/egress_proxy.py stop --state DIR

start runs two servers on this machine:
- the proxy: Debian's tinyproxy on the gateway of the hosts' Docker network NET, on a free port, admitting that
  network's subnet only, with basic authentication (user ``fleet``, a fresh random password in DIR/proxy.password,
  0600) and every request it serves logged to DIR/tinyproxy.log (``Request (file descriptor N): GET http://...``,
  ``CONNECT host:port``);
- the release origin: the lab's tt-inference-server repository (tests/lab/ttis_repo.py, a bare mirror made from its
  bundle, served over git's dumb HTTP protocol) and its wheelhouse, in a directory under /var/tmp, both by Python's
  http.server on the gateway of the origin network (the default bridge), which the hosts on NET have no route to
  (the scenario's prepare gives them a default route that leads nowhere).
The vars file (YAML, also printed as JSON) holds ``lab_proxy_url`` (with the password), ``lab_proxy_address``
(host:port), ``lab_proxy_subnet``, ``lab_release_git_url`` and ``lab_release_wheels_url``. A proxy or origin left
running by an earlier start on the same DIR is stopped first; stop kills both and removes their pid files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_mirror import _kill, free_port, gateway  # tests/lab/hf_mirror.py: the lab network's gateway

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTIS_LAB = os.path.join(ROOT, ".cache", "ttis-lab")
PROXY_USER = "fleet"
PIDS = ("tinyproxy.pid", "origin.pid")


def log(msg):
    print(f"egress_proxy: {msg}", file=sys.stderr, flush=True)


def subnet(network):
    (info,) = json.loads(
        subprocess.run(["docker", "network", "inspect", network], check=True, capture_output=True, text=True).stdout
    )
    subnets = [c["Subnet"] for c in (info.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]
    if not subnets:
        raise SystemExit(f"docker network {network} has no subnet")
    return subnets[0]


def stop(state):
    for name in PIDS:
        path = os.path.join(state, name)
        _kill(path)  # SIGTERM, then up to 5 s for it to go
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        with open(os.path.join(state, "origin.root")) as handle:
            root = handle.read().strip()
        if os.path.basename(root).startswith("ttfleet-lab-origin-"):
            shutil.rmtree(root, ignore_errors=True)
        os.unlink(os.path.join(state, "origin.root"))


def spawn(state, name, argv):
    with open(os.path.join(state, f"{name}.log"), "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    with open(os.path.join(state, f"{name}.pid"), "w") as handle:
        handle.write(f"{proc.pid}\n")
    return proc


def wait_listening(proc, host, port, name, state):
    for _attempt in range(100):
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((host, port)) == 0:
                return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    with open(os.path.join(state, f"{name}.log"), errors="replace") as handle:
        raise SystemExit(f"{name} did not listen on {host}:{port}: {handle.read()[-2000:]}")


def release_origin(state, host):
    """The bare repository (git's dumb HTTP protocol: refs and packs as files, after update-server-info; it serves
    full clones only, so the scenario sets inference_server_git_depth: 0) and the wheelhouse, served by http.server."""
    bundle = os.path.join(TTIS_LAB, "tt-inference-server.bundle")
    if not os.path.exists(bundle):
        raise SystemExit(f"{bundle} is missing: run tests/lab/ttis_repo.py first")
    # The served tree: a directory of its own under /var/tmp, named in DIR/origin.root and removed by stop.
    root = tempfile.mkdtemp(prefix="ttfleet-lab-origin-", dir="/var/tmp")
    os.chmod(root, 0o755)
    with open(os.path.join(state, "origin.root"), "w") as handle:
        handle.write(root)
    repos = os.path.join(root, "repos")
    mirror = os.path.join(repos, "tt-inference-server.git")
    subprocess.run(["git", "clone", "-q", "--mirror", bundle, mirror], check=True)
    subprocess.run(["git", "-C", mirror, "update-server-info"], check=True)
    shutil.copytree(os.path.join(TTIS_LAB, "wheels"), os.path.join(root, "wheels"))
    port = free_port(host)
    proc = spawn(state, "origin", [sys.executable, "-m", "http.server", "--bind", host, "--directory", root, str(port)])
    wait_listening(proc, host, port, "origin", state)
    base = f"http://{host}:{port}"
    refs = f"{base}/repos/tt-inference-server.git/info/refs"
    with urllib.request.urlopen(refs, timeout=10) as response:
        if b"refs/tags/" not in response.read():
            raise SystemExit(f"{refs}: the release origin serves no tags")
    return base


def start(args):
    stop(args.state)
    os.makedirs(args.state, exist_ok=True)
    origin = release_origin(args.state, gateway(args.origin_network))
    host, allowed = gateway(args.network), subnet(args.network)
    port = free_port(host)
    password = secrets.token_urlsafe(18)
    old_umask = os.umask(0o077)  # the password file and the configuration that holds it are born 0600
    try:
        with open(os.path.join(args.state, "proxy.password"), "w") as handle:
            handle.write(password)
        conf = os.path.join(args.state, "tinyproxy.conf")
        with open(conf, "w") as handle:
            handle.write(
                f"Port {port}\nListen {host}\nAllow {allowed}\nTimeout 60\nMaxClients 100\nLogLevel Connect\n"
                f"DisableViaHeader Yes\nBasicAuth {PROXY_USER} {password}\n"
            )
    finally:
        os.umask(old_umask)
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    if not os.path.exists(binary):
        raise SystemExit("tinyproxy is not installed: apt-get install tinyproxy (tests/run-tests.sh installs it)")
    proc = spawn(args.state, "tinyproxy", [binary, "-d", "-c", conf])
    wait_listening(proc, host, port, "tinyproxy", args.state)
    result = {
        "lab_proxy_url": f"http://{PROXY_USER}:{password}@{host}:{port}",
        "lab_proxy_address": f"{host}:{port}",
        "lab_proxy_subnet": allowed,
        "lab_release_git_url": f"{origin}/repos/tt-inference-server.git",
        "lab_release_wheels_url": f"{origin}/wheels/",
    }
    fd = os.open(args.vars_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("---\n# Written by tests/lab/egress_proxy.py start (lab only, not committed).\n")
        for key, value in result.items():
            handle.write(f"{key}: {json.dumps(value)}\n")
    log(f"proxy {host}:{port} for {allowed}; release origin {origin}")
    print(json.dumps({k: v for k, v in result.items() if k != "lab_proxy_url"}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    first = sub.add_parser("start")
    first.add_argument("--network", required=True)
    first.add_argument("--origin-network", default="bridge")
    first.add_argument("--state", required=True)
    first.add_argument("--vars-file", required=True)
    last = sub.add_parser("stop")
    last.add_argument("--state", required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        start(args)
    else:
        stop(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
