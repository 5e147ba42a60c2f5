#!/usr/bin/env python
"""Fan-out of model weights over N lab hosts in doubling rounds: wall time against one copy, origin bytes.

For each N (default 2, 4, 8, 16) the script starts N fresh containers of the lab image (weights on a tmpfs, so
the shared disk is not what limits), shapes each container's egress with a token-bucket filter (`tc qdisc ... tbf`,
--rate, default 200mbit), publishes a generated model (--model-mb) with its manifest in a real SeaweedFS bucket
on the docker gateway behind tests/tools/counting_proxy.py, and runs the role's schedule
(plugins/module_utils/_plan/fanout.py): the seed fetches from the bucket, then round by round every holder starts its
weights_server (plugins/module_utils/_peer/) and the round's pullers pull from their holder at the same time, with
plugins/module_utils/_weights/ inside the containers (what the model_weights module runs). A round starts when the
previous one ended, as the role's rounds do. It prints and writes to bench/results/model_cache_fanout.json:

  one_copy_s      one host pulling the model from one holder (N=2's pull), the unit of the goal
  fanout_s        the pull rounds, seconds (the seed's origin fetch not counted)
  goal_s          (1 + ceil(log2 N)) x one_copy_s
  linear_s        with --linear: every puller from the seed at once (the old rule), for comparison
  rounds          pull rounds; origin_ratio = bytes read from the bucket / model size (1.0 is the goal)

Asserts nothing.  bench/model_cache_fanout.py [--hosts 2,4,8,16] [--model-mb 128] [--rate 200mbit] [--linear]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fanout import fanout, rounds
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import hash_file
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import build_manifest, identity_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import s3_prefix_of

IMAGE = "ttfleet-lab/debian:latest"
REPO = "ttfleet-bench/Fanout-Model"
REV = "b" * 40
ACCESS, SECRET = "BENCH" + "ACCESS01", "bench/" + "secret-0123456789"
DEST = "/var/lib/tt-cache/volume_id_bench/weights/Fanout-Model"

IN_HOST = r"""
import json, os, sys, time
sys.path.insert(0, "/opt/bench")
from ansible_collections.ttfleet.inference.plugins.module_utils._peer import daemon as _peer
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import hash_files
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
opts = json.loads(sys.argv[2])
if sys.argv[1] == "fetch":
    t0 = time.monotonic()
    r = sync_weights(opts)
    print(json.dumps({"s": time.monotonic() - t0, "fetched": r["fetched_bytes"], "restarts": r["restarts"],
                      "manifest_sha256": r["manifest_sha256"]}))
elif sys.argv[1] == "serve":
    state = _peer.start_server(opts["dest"], opts["bind"], 0, 600, "/run/ttfleet-weights", "bench")
    print(json.dumps(state))
elif sys.argv[1] == "clear":
    import shutil
    shutil.rmtree(os.path.dirname(os.path.dirname(opts["dest"])), ignore_errors=True)
    print(json.dumps({}))
elif sys.argv[1] == "stop":
    print(json.dumps(_peer.stop_server("/run/ttfleet-weights", "bench")))
elif sys.argv[1] == "hash":
    files = [os.path.join(opts["dest"], f) for f in sorted(os.listdir(opts["dest"])) if not f.startswith(".")]
    size = sum(os.path.getsize(f) for f in files)
    t0 = time.monotonic()
    hash_files({f: (f, False) for f in files}, os.cpu_count() or 1)
    ours = time.monotonic() - t0
    import subprocess
    t0 = time.monotonic()
    subprocess.run(["sha256sum", *files], check=True, capture_output=True)
    coreutils = time.monotonic() - t0
    print(json.dumps({"bytes": size, "ours_s": ours, "sha256sum_s": coreutils}))
"""


def _load(rel):
    spec = importlib.util.spec_from_file_location(os.path.basename(rel)[:-3], os.path.join(ROOT, rel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def docker(*args, check=True):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True)


def host_exec(name, mode, opts):
    return subprocess.Popen(
        ["docker", "exec", name, "python3", "/opt/bench/run.py", mode, json.dumps(opts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc):
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(err[-2000:])
    return json.loads(out.strip().splitlines()[-1])


def make_model(directory, model_mb):
    files = {"config.json": b'{"model_type": "llama"}\n', "tokenizer.json": b'{"model": {}}\n'}
    shards = max(1, model_mb // 64)
    for index in range(shards):
        files[f"model-{index + 1:05d}-of-{shards:05d}.safetensors"] = os.urandom((model_mb << 20) // shards)
    for rel, data in files.items():
        with open(os.path.join(directory, rel), "wb") as handle:
            handle.write(data)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4,8,16")
    parser.add_argument("--model-mb", type=int, default=128)
    parser.add_argument("--rate", default="200mbit", help="egress rate of every host (tc tbf)")
    parser.add_argument("--linear", action="store_true", help="also time every puller from the seed at once")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "model_cache_fanout.json"))
    args = parser.parse_args(argv)
    s3_server = _load("tests/tools/s3_server.py")
    work = tempfile.mkdtemp(prefix="ttfleet-fanout-")
    gateway = _load("tests/lab/hf_mirror.py").gateway("bridge")
    server = s3_server.SeaweedS3(os.path.join(work, "seaweed"), ACCESS, SECRET, host=gateway).start()
    proxy_log = os.path.join(work, "origin.jsonl")
    proxy = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "tools", "counting_proxy.py"), "--listen", f"{gateway}:0",
         "--upstream", server.endpoint, "--log", proxy_log, "--keep-host"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    proxy_url = proxy.stdout.readline().strip()
    bundle = os.path.join(work, "bundle")
    shutil.copytree(
        os.path.join(ROOT, "plugins", "module_utils"),
        os.path.join(bundle, "ansible_collections", "ttfleet", "inference", "plugins", "module_utils"),
    )
    for part in ("ansible_collections", "ansible_collections/ttfleet", "ansible_collections/ttfleet/inference",
                 "ansible_collections/ttfleet/inference/plugins"):  # fmt: skip
        open(os.path.join(bundle, part, "__init__.py"), "w").close()
    with open(os.path.join(bundle, "run.py"), "w") as handle:
        handle.write(IN_HOST)
    results = {"machine": f"{platform.node()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
               "rate": args.rate, "runs": []}  # fmt: skip
    try:
        client = S3Client(server.endpoint, ACCESS, SECRET)
        client.create_bucket("models")
        model_dir = os.path.join(work, "model")
        os.makedirs(model_dir)
        files = make_model(model_dir, args.model_mb)
        listing = [{"path": rel, "size": len(data), "sha256": hash_file(os.path.join(model_dir, rel))["sha256"]}
                   for rel, data in files.items()]  # fmt: skip
        manifest = build_manifest(identity_of("s3", REPO, REV), listing, source="hf")
        base = s3_prefix_of("bench", REPO, REV)
        for rel in files:
            client.upload_file("models", base + rel, os.path.join(model_dir, rel))
        client.put_object("models", base + MANIFEST_NAME, json.dumps(manifest).encode())
        model_bytes = sum(len(data) for data in files.values())
        del files
        for count in [int(n) for n in args.hosts.split(",")]:
            results["runs"].append(run_fanout(count, bundle, proxy_url, proxy_log, model_bytes, args))
            run = results["runs"][-1]
            one_copy = next((r["one_copy_s"] for r in results["runs"] if r["one_copy_s"]), None)
            if one_copy:
                run["goal_s"] = round((1 + math.ceil(math.log2(count))) * one_copy, 2)
            print(json.dumps(run), flush=True)
    finally:
        proxy.terminate()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {args.out}")
    return 0


def run_fanout(count, bundle, proxy_url, proxy_log, model_bytes, args):
    names = [f"mcb-{i}" for i in range(count)]
    for name in names:
        docker("rm", "-f", name, check=False)
        docker("run", "-d", "--name", name, "--cap-add", "NET_ADMIN", "--tmpfs", "/run",
               "--tmpfs", f"/var/lib/tt-cache:size={args.model_mb * 3}m", IMAGE, "sleep", "infinity")  # fmt: skip
        docker("cp", bundle, f"{name}:/opt/bench")
        docker("exec", name, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", args.rate,
               "burst", "256kb", "latency", "100ms")  # fmt: skip
    open(proxy_log, "w").close()
    try:
        addresses = {
            n: docker("inspect", n, "--format", "{{.NetworkSettings.IPAddress}}").stdout.strip() for n in names
        }
        plan = fanout({n: [{"model": "M", "repo_id": REPO, "revision": REV, "site": "bench", "complete": False,
                            "shareable": True}] for n in names}, names)  # fmt: skip
        seed = next(n for n in names if plan[n]["M"]["role"] == "seed")
        base_opts = {"dest": DEST, "repo_id": REPO, "revision": REV, "owner": 0, "group": 0, "disk_margin_gb": 0,
                     "ignore_patterns": []}  # fmt: skip
        s3_opts = dict(base_opts, source="s3", s3_endpoint=proxy_url, s3_bucket="models", s3_prefix="bench",
                       s3_access_key=ACCESS, s3_secret_key=SECRET)  # fmt: skip
        seed_run = finish(host_exec(seed, "fetch", s3_opts))
        # As the role does: every pull checks its holder against the digest the seed fixed from the origin.
        base_opts["expected_manifest_sha256"] = seed_run["manifest_sha256"]
        start = time.monotonic()
        servers, per_round, peer_bytes = {}, [], 0
        for round_no in range(1, rounds(plan) + 1):
            round_start = time.monotonic()
            holders = [n for n in names if round_no in plan[n]["M"]["serve_rounds"] and n not in servers]
            for name, proc in [(n, host_exec(n, "serve", {"dest": DEST, "bind": addresses[n]})) for n in holders]:
                servers[name] = finish(proc)["url"]
            pullers = [n for n in names if plan[n]["M"]["role"] == "pull" and plan[n]["M"]["round"] == round_no]
            procs = [host_exec(n, "fetch", dict(base_opts, source="peer", peer_url=servers[plan[n]["M"]["peer"]],
                                                peer_fallback_urls=[servers[a] for a in plan[n]["M"]["alternates"]]))
                     for n in pullers]  # fmt: skip
            pulled = [finish(proc) for proc in procs]
            per_round.append({"round": round_no, "pulls": len(pulled), "s": round(time.monotonic() - round_start, 2),
                              "slowest_pull_s": round(max(p["s"] for p in pulled), 2)})  # fmt: skip
        fanout_s = time.monotonic() - start
        for name in servers:
            peer_bytes += finish(host_exec(name, "stop", {}))[1]
        with open(proxy_log) as handle:
            log = [json.loads(line) for line in handle if line.strip()]
        origin_files = sum(
            e["bytes"] for e in log if e["method"] == "GET" and not e["path"].endswith(MANIFEST_NAME)
            and "list-type" not in e["path"]
        )  # fmt: skip
        one_copy = per_round[0]["slowest_pull_s"] if count == 2 else None
        run = {
            "hosts": count,
            "model_bytes": model_bytes,
            "rounds": rounds(plan),
            "seed_fetch_s": round(seed_run["s"], 2),
            "fanout_s": round(fanout_s, 2),
            "per_round": per_round,
            "one_copy_s": one_copy,
            "origin_ratio": round(origin_files / model_bytes, 4),
            "peer_bytes": peer_bytes,
        }
        if args.linear and count > 2:
            for name in names:
                if name != seed:
                    finish(host_exec(name, "clear", {"dest": DEST}))
            url = finish(host_exec(seed, "serve", {"dest": DEST, "bind": addresses[seed]}))["url"]
            linear_start = time.monotonic()
            procs = [host_exec(n, "fetch", dict(base_opts, source="peer", peer_url=url)) for n in names if n != seed]
            for proc in procs:
                finish(proc)
            run["linear_s"] = round(time.monotonic() - linear_start, 2)
            finish(host_exec(seed, "stop", {}))
        return run
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)


if __name__ == "__main__":
    sys.exit(main())
