#!/usr/bin/env python
"""How long `ttfleet.inference.model_spec` takes on a lab host: JSON path and checkout-import path.

Prints numbers and writes bench/results/model_spec_latency.json; asserts nothing (target for the
JSON path: under 0.5 s). Two measurements per spec source:
  on_host_s   load + select + derive inside the host's python3 (what the module itself does),
              median of --runs runs, each a fresh interpreter;
  task_s      one ansible task running the module against the host, median of --runs runs
              (adds connection and AnsiballZ overhead).
The import path needs a tt-inference-server checkout on this machine (--checkout DIR, e.g. a
`git clone --branch v0.20.0` of it); without one only the JSON path is measured.

    bench/model_spec_latency.py --host lab-p300x2-1 [--checkout /path/to/tt-inference-server]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "specs", "release_model_spec-v0.20.0.json.gz")
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
HOST_DIR = "/var/tmp/ttfleet-bench"

ON_HOST = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive, source
catalog = source.load_catalog(tt_inference_server_dir=sys.argv[2] or None, spec_file=sys.argv[3] or None)
result = derive.resolve(catalog, "Qwen3-32B", "p300x2", volume_root="/var/lib/tt-cache")
print(time.perf_counter() - t0, catalog["source"], result["volume_name"])
"""


def docker(*args, stdin=None):
    return subprocess.run(["docker", *args], check=True, text=True, input=stdin, capture_output=True).stdout


def on_host(host, checkout, spec_file, runs):
    times = []
    for _run in range(runs):
        out = docker("exec", "-i", host, "python3", "-", HOST_DIR, checkout, spec_file, stdin=ON_HOST)
        seconds, source, name = out.split()
        times.append(float(seconds))
    return statistics.median(times), source, name


def task(host, args, runs):
    env = dict(
        os.environ,
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
    )
    times = []
    for _run in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [
                os.path.join(ROOT, ".venv", "bin", "ansible"),
                host,
                "-i",
                os.path.join(ROOT, "inventories", "lab"),
                "-m",
                "ttfleet.inference.model_spec",
                "-a",
                json.dumps(args),
            ],
            check=True,
            env=env,
            capture_output=True,
            cwd=ROOT,
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="lab-p300x2-1")
    parser.add_argument("--checkout", help="a tt-inference-server checkout on this machine")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    plugins = f"{HOST_DIR}/ansible_collections/ttfleet/inference/plugins"
    docker("exec", args.host, "rm", "-rf", f"{HOST_DIR}/ansible_collections")
    docker("exec", args.host, "mkdir", "-p", plugins)
    docker("cp", MODULE_UTILS, f"{args.host}:{plugins}/module_utils")
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "release_model_spec.json")
        subprocess.run(["sh", "-c", f"gzip -dc '{SPEC_FIXTURE}' > '{plain}'"], check=True)
        docker("cp", plain, f"{args.host}:{HOST_DIR}/release_model_spec.json")
    cases = [("json", "", f"{HOST_DIR}/release_model_spec.json")]
    if args.checkout:
        docker("cp", args.checkout, f"{args.host}:{HOST_DIR}/tt-inference-server")
        # The checkout's code needs PyYAML and a .git marker, as on a real host (git clone).
        docker("exec", args.host, "mkdir", "-p", f"{HOST_DIR}/tt-inference-server/.git")
        cases.append(("import", f"{HOST_DIR}/tt-inference-server", ""))

    results = {
        "host": args.host,
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores",
        "cases": {},
    }
    print(f"{'path':8} {'source':26} {'on_host_s':>10} {'task_s':>8}  volume_name")
    for label, checkout, spec_file in cases:
        seconds, source, name = on_host(args.host, checkout, spec_file, args.runs)
        module_args = {"model": "Qwen3-32B", "device": "p300x2"}
        module_args.update({"tt_inference_server_dir": checkout} if checkout else {"spec_file": spec_file})
        task_seconds = task(args.host, module_args, args.runs)
        results["cases"][label] = {
            "source": source,
            "on_host_s": round(seconds, 4),
            "task_s": round(task_seconds, 3),
            "volume_name": name,
        }
        print(f"{label:8} {source:26} {seconds:10.3f} {task_seconds:8.2f}  {name}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    out = os.path.join(ROOT, "bench", "results", "model_spec_latency.json")
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(f"wrote {os.path.relpath(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
