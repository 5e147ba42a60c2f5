#!/usr/bin/env python
"""Fan-out of model weights over N lab hosts: origin bytes, peer bytes, wall time, sha256 throughput.

For each N (default 2, 4, 8) the script starts N fresh containers of the lab image, publishes a generated
model (--model-mb, a few safetensors-sized files plus config and tokenizer) with its manifest in a real
SeaweedFS bucket on the docker gateway, behind tests/tools/counting_proxy.py, and runs the role's rule
(plugins/module_utils/_fanout.py): host 1 (the seed) fetches from the bucket, then every other host pulls
from one holder over weights_server (plugins/module_utils/_peer.py) at the same time, all with
plugins/module_utils/_weights/ inside the containers (what the model_weights module runs). It prints and
writes to bench/results/model_cache_fanout.json:

  wall_s          seed fetch + parallel peer pulls, seconds
  origin_ratio    bytes read from the bucket / (N x model size)   (1/N is the ideal: origin read once)
  peer_bytes      bytes the holders served
  sha256_MBps     verification throughput of _weights.hashing.hash_files on the seed's files, next to
                  coreutils sha256sum on the same files (both inside the seed container)

Asserts nothing.  bench/model_cache_fanout.py [--hosts 2,4,8] [--model-mb 256]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._fanout import fanout
from ansible_collections.ttfleet.inference.plugins.module_utils._s3 import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes import MANIFEST_NAME
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
from ansible_collections.ttfleet.inference.plugins.module_utils import _peer
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import hash_files
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
opts = json.loads(sys.argv[2])
if sys.argv[1] == "fetch":
    t0 = time.monotonic()
    r = sync_weights(opts)
    print(json.dumps({"s": time.monotonic() - t0, "fetched": r["fetched_bytes"], "restarts": r["restarts"]}))
elif sys.argv[1] == "serve":
    state = _peer.start_server(opts["dest"], opts["bind"], 0, 600, "/run/ttfleet-weights", "bench")
    print(json.dumps(state))
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
    parser.add_argument("--hosts", default="2,4,8")
    parser.add_argument("--model-mb", type=int, default=256)
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
    results = {"machine": f"{platform.node()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "runs": []}
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
            results["runs"].append(run_fanout(count, bundle, proxy_url, proxy_log, model_bytes))
            print(json.dumps(results["runs"][-1]), flush=True)
    finally:
        proxy.terminate()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {args.out}")
    return 0


def run_fanout(count, bundle, proxy_url, proxy_log, model_bytes):
    names = [f"mcb-{i}" for i in range(count)]
    for name in names:
        docker("rm", "-f", name, check=False)
        docker("run", "-d", "--name", name, "--tmpfs", "/run", IMAGE, "sleep", "infinity")
        docker("cp", bundle, f"{name}:/opt/bench")
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
        start = time.monotonic()
        seed_run = finish(host_exec(seed, "fetch", s3_opts))
        state = finish(host_exec(seed, "serve", {"dest": DEST, "bind": addresses[seed]}))
        pulls = [host_exec(n, "fetch", dict(base_opts, source="peer", peer_url=state["url"]))
                 for n in names if plan[n]["M"]["role"] == "pull"]  # fmt: skip
        pulled = [finish(proc) for proc in pulls]
        wall = time.monotonic() - start
        _running, peer_bytes = finish(host_exec(seed, "stop", {}))
        hashing = finish(host_exec(seed, "hash", {"dest": DEST}))
        with open(proxy_log) as handle:
            log = [json.loads(line) for line in handle if line.strip()]
        origin = sum(e["bytes"] for e in log if e["method"] == "GET" and "list-type" not in e["path"])
        origin_files = sum(
            e["bytes"] for e in log if e["method"] == "GET" and not e["path"].endswith(MANIFEST_NAME)
            and "list-type" not in e["path"]
        )  # fmt: skip
        return {
            "hosts": count,
            "model_bytes": model_bytes,
            "wall_s": round(wall, 2),
            "seed_fetch_s": round(seed_run["s"], 2),
            "slowest_pull_s": round(max((p["s"] for p in pulled), default=0), 2),
            "origin_bytes": origin,
            "origin_ratio": round(origin_files / (count * model_bytes), 4),
            "peer_bytes": peer_bytes,
            "peer_bytes_per_puller": round(peer_bytes / max(len(pulled), 1)),
            "sha256_MBps": round(hashing["bytes"] / hashing["ours_s"] / 1e6, 1),
            "sha256sum_MBps": round(hashing["bytes"] / hashing["sha256sum_s"] / 1e6, 1),
        }
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)


if __name__ == "__main__":
    sys.exit(main())
