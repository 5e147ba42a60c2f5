#!/usr/bin/env python
"""Idempotent re-run of site.yml on a converged fleet, next to a playbook of the same task count that does nothing.

Runs the playbook --warmup times (to converge), then --runs times, reading each recap; then runs a generated
baseline playbook with as many `ansible.builtin.ping` tasks per host as the converged re-run executed on the
busiest host (ok + changed + skipped), which is the cost floor of that many module round trips. Prints the
median wall times, their ratio and the changed count (0 on a converged fleet), and writes
bench/results/idempotence.json. Asserts nothing.

    make lab && .venv/bin/python bench/idempotence.py --inventory inventories/lab [--playbook site.yml]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)",
    re.M,
)


def env():
    return dict(
        os.environ,
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
        ANSIBLE_FORCE_COLOR="false",
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
        ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
    )


def run(inventory, playbook, extra=()):
    start = time.perf_counter()
    proc = subprocess.run(
        [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", inventory, playbook, *extra],
        cwd=ROOT,
        env=env(),
        text=True,
        capture_output=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"{playbook} failed with exit code {proc.returncode}")
    recap = {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"} for m in RECAP.finditer(proc.stdout)
    }
    return seconds, recap


def baseline_playbook(tasks, hosts, module):
    lines = [
        "---",
        "- name: Baseline, as many module round trips as the re-run, changing nothing",
        f"  hosts: {hosts}",
        "  gather_facts: false",
        "  tasks:",
    ]
    for index in range(tasks):
        lines += [f"    - name: Task {index + 1}", f"      {module}"]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default=os.path.join(ROOT, "inventories", "lab"))
    parser.add_argument("--playbook", default="site.yml")
    parser.add_argument("--hosts", default="all", help="host pattern of the baseline playbook")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "idempotence.json"))
    args = parser.parse_args()

    for _warmup in range(args.warmup):
        run(args.inventory, args.playbook)
    site_times, changed, tasks = [], [], 0
    for _run in range(args.runs):
        seconds, recap = run(args.inventory, args.playbook)
        site_times.append(seconds)
        changed.append(sum(item["changed"] for item in recap.values()))
        tasks = max(tasks, *(item["ok"] + item["changed"] + item["skipped"] for item in recap.values()))
    baselines = {}
    for label, module in (("ping", "ansible.builtin.ping:"), ("noop", "ansible.builtin.meta: noop")):
        with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=os.path.join(ROOT, "bench"), delete=False) as handle:
            handle.write(baseline_playbook(tasks, args.hosts, module))
            path = handle.name
        try:
            baselines[label] = statistics.median(run(args.inventory, path)[0] for _run in range(args.runs))
        finally:
            os.unlink(path)
    base_times = [baselines["ping"]]
    result = {
        **_results.stamp(),
        "inventory": args.inventory,
        "playbook": args.playbook,
        "hosts": len(recap),
        "tasks_per_host": tasks,
        "rerun_s": round(statistics.median(site_times), 2),
        "baseline_s": round(statistics.median(base_times), 2),
        "ratio": round(statistics.median(site_times) / statistics.median(base_times), 2),
        "noop_s": round(baselines["noop"], 2),
        "changed": changed,
        "runs": args.runs,
    }
    print(f"hosts {result['hosts']}, {tasks} tasks on the busiest host, median of {args.runs} runs")
    print(f"re-run of {args.playbook}: {result['rerun_s']} s   changed: {changed}")
    print(f"baseline ({tasks} x ping, one module round trip each): {result['baseline_s']} s   ratio: {result['ratio']}")
    print(f"floor ({tasks} x meta noop, no host contact): {result['noop_s']} s")
    _results.write(args.output, result)


if __name__ == "__main__":
    main()
