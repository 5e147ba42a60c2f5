#!/usr/bin/env python
"""The lab's Prometheus: Debian's real prometheus and promtool, taken out of the package (tests and lab only).

LAB ONLY: this tool serves the lint stage and molecule/metrics on this machine. It is no part of the collection.

    tests/lab/prometheus.py bin                       print the directory holding prometheus and promtool
    tests/lab/prometheus.py start --state DIR --file-sd DIR --rules FILE [--fleet ttfleet] [--interval 2s]
    tests/lab/prometheus.py stop --state DIR

bin downloads Debian's prometheus package (``apt-get download`` + ``dpkg-deb -x``, never installed: the package would
start a service) and keeps its two binaries in .cache/prometheus/<package version>/.
start runs that prometheus on 127.0.0.1 on a free port with DIR/prometheus.yml: two file_sd jobs reading the
metrics role's files in the --file-sd directory (<fleet>.json: the instances' /metrics; <fleet>-nodes.json:
node_exporter), the --rules file, scrapes and rule evaluations every --interval; its data in DIR/data, its log in
DIR/prometheus.log, its pid in DIR/prometheus.pid. Once /-/ready answers 200 it prints {"url": URL} (also in DIR/url).
A Prometheus left running on the same DIR is stopped first. stop stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_mirror import free_port  # tests/lab/hf_mirror.py
from registry import CACHE, _download_deb, _kill_group, _spawn, _wait_v2, cache_lock, log  # tests/lab/registry.py

BINARIES = ("prometheus", "promtool")


def binaries():
    """The directory holding Debian's prometheus and promtool, extracted once into .cache/prometheus/<version>."""
    base = os.path.join(CACHE, "prometheus")
    with cache_lock("prometheus"):
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            found = os.path.join(base, name)
            if all(os.access(os.path.join(found, tool), os.X_OK) for tool in BINARIES):
                return found
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # apt-get download as root fetches as _apt, which must write here
            deb = _download_deb(tmp, "prometheus")
            version = os.path.basename(deb).split("_")[1].replace("+", "-").replace(":", "-")
            subprocess.run(["dpkg-deb", "-x", deb, os.path.join(tmp, "root")], check=True)
            staging = os.path.join(tmp, "bin")
            os.makedirs(staging)
            for tool in BINARIES:
                shutil.copy2(os.path.join(tmp, "root", "usr", "bin", tool), os.path.join(staging, tool))
            os.makedirs(base, exist_ok=True)
            found = os.path.join(base, version)
            shutil.move(staging, found)
            log(f"prometheus and promtool from {os.path.basename(deb)} -> {os.path.relpath(found, os.getcwd())}")
    return found


def _config(state, file_sd, fleet, rules, interval):
    path = os.path.join(state, "prometheus.yml")
    with open(path, "w") as handle:
        handle.write(
            "# Written by tests/lab/prometheus.py start (lab only).\n"
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n  scrape_timeout: {interval}\n"
            f"rule_files: [{json.dumps(rules)}]\n"
            "scrape_configs:\n"
            "  - job_name: ttfleet-instances\n"
            f"    file_sd_configs: [{{files: [{json.dumps(os.path.join(file_sd, fleet + '.json'))}], "
            f"refresh_interval: {interval}}}]\n"
            "  - job_name: node\n"
            f"    file_sd_configs: [{{files: [{json.dumps(os.path.join(file_sd, fleet + '-nodes.json'))}], "
            f"refresh_interval: {interval}}}]\n"
        )
    return path


def start(args):
    state = os.path.abspath(args.state)
    os.makedirs(state, exist_ok=True)
    stop(state)
    tools = binaries()
    config = _config(state, os.path.abspath(args.file_sd), args.fleet, os.path.abspath(args.rules), args.interval)
    subprocess.run([os.path.join(tools, "promtool"), "check", "config", config], check=True, capture_output=True)
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    argv = [
        os.path.join(tools, "prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={os.path.join(state, 'data')}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    proc = _spawn(argv, state, "prometheus.pid", "prometheus.log")
    _wait_v2(url.removeprefix("http://"), proc, "prometheus", os.path.join(state, "prometheus.log"), 30, "/-/ready")
    with open(os.path.join(state, "url"), "w") as handle:
        handle.write(url + "\n")
    print(json.dumps({"url": url}))


def stop(state):
    _kill_group(os.path.join(state, "prometheus.pid"), "prometheus")
    for name in ("prometheus.pid", "url"):
        with_path = os.path.join(state, name)
        if os.path.exists(with_path):
            os.unlink(with_path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bin")
    run = sub.add_parser("start")
    run.add_argument("--state", required=True)
    run.add_argument("--file-sd", required=True)
    run.add_argument("--rules", required=True)
    run.add_argument("--fleet", default="ttfleet")
    run.add_argument("--interval", default="2s")
    halt = sub.add_parser("stop")
    halt.add_argument("--state", required=True)
    args = parser.parse_args()
    if args.command == "bin":
        print(binaries())
    elif args.command == "start":
        start(args)
    else:
        stop(os.path.abspath(args.state))


if __name__ == "__main__":
    main()
