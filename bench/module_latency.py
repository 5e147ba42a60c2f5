#!/usr/bin/env python
"""Latency of the collection's read-only modules on a lab host: one ad-hoc task each, median of --runs runs.

Measures `ttfleet.inference.model_spec`, `volume_facts`, `container_command` and `fleet_status` against a
converged lab host (make demo, or make lab + site.yml), each as a whole `ansible <host> -m ...` call (connection,
module transfer and the module itself), next to `ansible.builtin.ping` as the floor of one such call. The
modules read the spec of the release installed on the host. Prints numbers and writes
bench/results/module_latency.json; asserts nothing.

    .venv/bin/python bench/module_latency.py [--host lab-p300x2-1] [--model Qwen3-32B] [--device p300x2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call(host, module, args):
    env = dict(
        os.environ,
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
        ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
    )
    argv = [
        os.path.join(ROOT, ".venv", "bin", "ansible"),
        host,
        "-i",
        os.path.join(ROOT, "inventories", "lab"),
        "-m",
        module,
    ]
    if args:
        argv += ["-a", json.dumps(args)]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
        raise SystemExit(f"{module} failed on {host} with exit code {proc.returncode}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="lab-p300x2-1")
    parser.add_argument("--model", default="Qwen3-32B")
    parser.add_argument("--device", default="p300x2")
    parser.add_argument("--volume-root", default="/var/lib/tt-cache")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "module_latency.json"))
    args = parser.parse_args()
    spec = {"model": args.model, "device": args.device}
    cases = [
        ("ansible.builtin.ping", {}),
        ("ttfleet.inference.model_spec", dict(spec, volume_root=args.volume_root)),
        ("ttfleet.inference.volume_facts", dict(spec, root=args.volume_root, search_roots=["/home/*/data/tt-cache"])),
        ("ttfleet.inference.container_command", dict(spec, volume_root=args.volume_root)),
        ("ttfleet.inference.fleet_status", {}),
    ]
    results = []
    for module, module_args in cases:
        call(args.host, module, module_args)  # warm-up: caches, ControlPersist, bytecode
        times = [call(args.host, module, module_args) for _run in range(args.runs)]
        results.append(
            {
                "module": module,
                "median_s": round(statistics.median(times), 3),
                "min_s": round(min(times), 3),
                "max_s": round(max(times), 3),
            }
        )
        print(
            f"{module:40} median {results[-1]['median_s']:.3f} s  (min {results[-1]['min_s']:.3f}, "
            f"max {results[-1]['max_s']:.3f}, {args.runs} runs)",
            flush=True,
        )
    floor = results[0]["median_s"]
    for item in results[1:]:
        item["over_ping_s"] = round(item["median_s"] - floor, 3)
    data = {
        **_results.stamp(),
        "host": args.host,
        "query": spec,
        "results": results,
    }
    _results.write(args.output, data)


if __name__ == "__main__":
    main()
