#!/usr/bin/env python
"""Fleet convergence from bare hosts: site.yml on N lab hosts that all serve the same model.

For each N (default 1, 4, 8) the script removes the lab, starts N fresh n150 lab hosts (tests/lab/lab.py up),
starts the lab's Hugging Face mirror behind its byte counter (tests/lab/hf_mirror.py), copies the stand-in
inference image into every host, and runs site.yml (tt_host -> inference_server -> model_cache -> serve)
until every host serves Llama-3.2-1B-Instruct. It prints and writes bench/results/fleet_convergence.json:

  wall_s         site.yml from bare hosts to every instance healthy, seconds
  origin_ratio   file bytes read from the mirror / (N x model size)   (1/N: the origin was read once)
  peer_bytes     bytes the hosts pulled from a peer (the per-model plan model_cache prints: source peer:<host>)
  changed        changed tasks of a second, converged run (0 expected)

Asserts nothing.   .venv/bin/python bench/fleet_convergence.py [--sizes 1,4,8] [--keep]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, ".venv", "bin")
STATE = os.path.join(ROOT, ".cache", "hf-mirror")
REPO = "meta-llama/Llama-3.2-1B-Instruct"
# One model of the plan model_cache prints ("Show the plan of the model weights"): "<model>: <source>, <bytes> bytes
# to fetch into <volume>...".
# A long line may be folded by the YAML callback: any whitespace between the words.
PLAN_ITEM = re.compile(r"[\"'][^\"':]+:\s+(\S+),\s+(\d+)\s+bytes\s+to\s+fetch\s")
IMAGE = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.11.1-84b4c53-222ee06"
ENV = dict(
    os.environ,
    LANG="C.UTF-8",
    LC_ALL="C.UTF-8",
    ANSIBLE_FORCE_COLOR="false",
    ANSIBLE_NOCOLOR="true",
    ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
)


def run(argv, capture=True):
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, text=True, capture_output=capture, check=False)
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout or "")[-4000:] + (proc.stderr or "")[-2000:])
        raise SystemExit(f"{' '.join(argv[:3])} ... failed with exit code {proc.returncode}")
    return proc.stdout


def changed_count(output):
    total = 0
    for line in output.splitlines():
        if " changed=" in line and " ok=" in line:
            total += int(line.split(" changed=")[1].split()[0])
    return total


def one(n):
    hosts = ["n150"] * n
    run([sys.executable, "tests/lab/lab.py", "down"])
    run([sys.executable, "tests/lab/lab.py", "up", "--hosts", ",".join(hosts)])
    names = [f"lab-n150-{i + 1}" for i in range(n)]
    run([sys.executable, "tests/lab/hf_mirror.py", "start", "--repo", REPO])
    with open(os.path.join(STATE, "models.json")) as handle:
        files = json.load(handle)[REPO]["files"]
    size = sum(item["size"] for path, item in files.items() if not path.startswith("original/"))
    run(
        [
            sys.executable,
            "tests/lab/lab.py",
            "serve-image",
            "--tag",
            IMAGE,
            *[f"--copy={name}:/var/lib/ttfleet-lab/serve-image.tar" for name in names],
        ]
    )
    start = time.perf_counter()
    # -v: the plan of the model weights (the peer bytes below) is printed from verbosity 1 on.
    output = run([os.path.join(BIN, "ansible-playbook"), "-v", "-i", "inventories/lab", "site.yml"])
    wall = time.perf_counter() - start
    with open(os.path.join(STATE, "origin.jsonl")) as handle:
        log = [json.loads(line) for line in handle if line.strip()]
    origin = sum(item["bytes"] for item in log if "/resolve/" in item["path"])
    peer = sum(int(b) for src, b in PLAN_ITEM.findall(output) if src.startswith("peer"))
    rerun = run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/lab", "site.yml"])
    result = {
        "hosts": n,
        "wall_s": round(wall, 1),
        "model_bytes": size,
        "origin_bytes": origin,
        "origin_ratio": round(origin / (n * size), 3),
        "peer_bytes": peer,
        "changed": changed_count(rerun),
    }
    print(
        f"N={n}: {result['wall_s']} s, origin {origin} B = {result['origin_ratio']} x N x model, "
        f"peer {result['peer_bytes']} B, re-run changed {result['changed']}",
        flush=True,
    )
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--keep", action="store_true", help="leave the last lab running")
    parser.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "fleet_convergence.json"))
    args = parser.parse_args()
    results = [one(int(n)) for n in args.sizes.split(",")]
    if not args.keep:
        run([sys.executable, "tests/lab/hf_mirror.py", "stop"])
        run([sys.executable, "tests/lab/lab.py", "down"])
    data = {
        **_results.stamp(),
        "model": REPO,
        "results": results,
    }
    _results.write(args.output, data)


if __name__ == "__main__":
    main()
