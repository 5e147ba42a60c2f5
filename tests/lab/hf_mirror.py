#!/usr/bin/env python
"""The lab's Hugging Face mirror: a real olah server, offline, serving tiny real models (tests and lab only).

    tests/lab/hf_mirror.py start --repo ORG/NAME [--repo ...] [--state DIR] [--network NET] [--vars-file PATH]
    tests/lab/hf_mirror.py stop [--state DIR]

start builds each repository with tests/lab/hf_model.py (deterministic commits), starts olah on the gateway of
the lab's Docker network (reachable from every lab host, not from outside this machine) on a free port, waits
for it to answer and writes an Ansible vars file with ``model_cache_hf_endpoint`` and
``lab_weights_revisions`` (repository -> commit). The endpoint is a counting proxy in front of olah
(tests/tools/counting_proxy.py): ``<state>/origin.jsonl`` records every response body it relayed, so tests and
benchmarks can tell how many bytes the fleet read from the origin; ``<state>/models.json`` lists each
repository's files and sizes. A mirror left running by an earlier start is stopped first. stop kills both and
removes the vars file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_STATE = os.path.join(ROOT, ".cache", "hf-mirror")
DEFAULT_VARS = os.path.join(ROOT, "inventories", "lab", "group_vars", "all", "zz_lab_mirror.yml")
HF_MODEL = os.path.join(ROOT, "tests", "lab", "hf_model.py")
COUNTING_PROXY = os.path.join(ROOT, "tests", "tools", "counting_proxy.py")


def _interface_ipv4(name):
    """The IPv4 address of network interface ``name`` (SIOCGIFADDR), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def gateway(network):
    """The host's address on docker network ``network``. A freshly started Debian docker.io 20.10 lists no
    Gateway for the default bridge in IPAM.Config although docker0 holds it: then the bridge interface says."""
    (info,) = json.loads(
        subprocess.run(["docker", "network", "inspect", network], check=True, capture_output=True, text=True).stdout
    )
    gateways = [c["Gateway"] for c in (info.get("IPAM") or {}).get("Config") or [] if c.get("Gateway")]
    if gateways:
        return gateways[0]
    bridge = (info.get("Options") or {}).get("com.docker.network.bridge.name")
    net_id = info.get("Id", "")
    # User-defined bridges are named br-<first 12 of the id> unless an option names them.
    address = _interface_ipv4(bridge or f"br-{net_id[:12]}")
    if not address:
        raise SystemExit(f"docker network {network} has no gateway address; start the lab first (make lab)")
    return address


def free_port(host):
    """A free TCP port of ``host`` below the kernel's ephemeral range: a released ephemeral port can be taken by any
    outgoing connection of the machine before the server binds it (a CI run failed so, tests/tools/s3_server.py)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            ephemeral = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    pick = random.SystemRandom()
    for _attempt in range(200):
        with socket.socket() as sock:
            try:
                sock.bind((host, pick.randint(10000, max(10001, ephemeral - 1))))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise SystemExit(f"no free port on {host} below {ephemeral}")


def _kill(pidfile):
    try:
        with open(pidfile) as handle:
            pid = int(handle.read().strip())
        os.kill(pid, signal.SIGTERM)
        for _attempt in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass


def stop(state, vars_file):
    for name in ("olah.pid", "proxy.pid"):
        _kill(os.path.join(state, name))
    for path in (os.path.join(state, "olah.pid"), os.path.join(state, "proxy.pid"), vars_file):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def start(args):
    stop(args.state, args.vars_file)
    mirrors = os.path.join(args.state, "mirrors")
    os.makedirs(mirrors, exist_ok=True)
    revisions, models = {}, {}
    for repo in args.repo:
        out = subprocess.run(
            [sys.executable, HF_MODEL, mirrors, "--repo", repo, "--hidden", str(args.hidden)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        models[repo] = json.loads(out)
        revisions[repo] = models[repo]["sha"]
    with open(os.path.join(args.state, "models.json"), "w") as handle:
        json.dump(models, handle, indent=1)
    host = gateway(args.network)
    port = free_port(host)
    with open(os.path.join(args.state, "olah.toml"), "w") as handle:
        handle.write(
            f'[basic]\nhost = "{host}"\nport = {port}\nrepos-path = "{args.state}/repos"\n'
            f'mirrors-path = ["{mirrors}"]\n[accessibility]\noffline = true\n'
        )
    olah = os.path.join(os.path.dirname(sys.executable), "olah-cli")
    with open(os.path.join(args.state, "olah.log"), "ab") as log:
        proc = subprocess.Popen(
            [olah, "-c", "olah.toml"],
            cwd=args.state,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with open(os.path.join(args.state, "olah.pid"), "w") as handle:
        handle.write(f"{proc.pid}\n")
    origin = f"http://{host}:{port}"
    probe = f"{origin}/api/models/{args.repo[0]}/revision/main"
    for _attempt in range(100):
        try:
            with urllib.request.urlopen(probe, timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"olah exited with {proc.returncode}; see {args.state}/olah.log")
        time.sleep(0.2)
    else:
        raise SystemExit(f"olah did not answer {probe} within 20 s; see {args.state}/olah.log")
    log_path = os.path.join(args.state, "origin.jsonl")
    open(log_path, "w").close()
    with open(os.path.join(args.state, "proxy.out"), "wb") as out:
        proxy = subprocess.Popen(
            [
                sys.executable,
                COUNTING_PROXY,
                "--listen",
                f"{host}:0",
                "--upstream",
                origin,
                "--log",
                log_path,
                "--pidfile",
                os.path.join(args.state, "proxy.pid"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    endpoint = ""
    for _attempt in range(100):
        with open(os.path.join(args.state, "proxy.out")) as handle:
            endpoint = handle.readline().strip()
        if endpoint or proxy.poll() is not None:
            break
        time.sleep(0.1)
    if not endpoint.startswith("http://"):
        raise SystemExit(f"the counting proxy did not start; see {args.state}/proxy.out")
    os.makedirs(os.path.dirname(args.vars_file), exist_ok=True)
    with open(args.vars_file, "w") as handle:
        handle.write("---\n# Written by tests/lab/hf_mirror.py start (lab only, not committed).\n")
        handle.write(f"model_cache_hf_endpoint: {endpoint}\n")
        handle.write("lab_weights_revisions:\n")
        for repo, sha in revisions.items():
            handle.write(f"  {repo}: {sha}\n")
    print(json.dumps({"endpoint": endpoint, "origin": origin, "revisions": revisions, "vars_file": args.vars_file}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "stop"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--state", default=DEFAULT_STATE)
        cmd.add_argument("--vars-file", default=DEFAULT_VARS)
        if name == "start":
            cmd.add_argument("--repo", action="append", required=True)
            cmd.add_argument("--network", default="ttfleet-lab")
            cmd.add_argument("--hidden", type=int, default=256, help="the models' hidden size (tests/lab/hf_model.py)")
    args = parser.parse_args(argv)
    args.state = os.path.abspath(args.state)
    if args.command == "start":
        start(args)
    else:
        stop(args.state, args.vars_file)


if __name__ == "__main__":
    main()
