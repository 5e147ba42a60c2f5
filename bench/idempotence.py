#!/usr/bin/env python
"""Idempotent re-run of site.yml on a converged fleet, next to a playbook of the same task count that does nothing.

Also reports the controller's cost per host: CPU seconds of ansible-playbook and everything it ran on the
controller (its forks, the connection's docker/ssh clients), divided by the host count, and the task results that
contacted each host (bench/callback_plugins/ttfleet_contact.py: not skipped, not a controller-only action, not
delegated to localhost). --mitogen runs every playbook under mitogen's mitogen_linear strategy (pip install
mitogen==0.3.54 into .venv first).

Runs the playbook --warmup times (to converge), then --runs times, reading each recap; then runs a generated
baseline playbook with as many `ansible.builtin.ping` tasks per host as the converged re-run executed on the
busiest host (ok + changed + skipped), which is the cost floor of that many module round trips. Prints the
median wall times, their ratio and the changed count (0 on a converged fleet), and writes
bench/results/idempotence.json. Asserts nothing.

    make lab && .venv/bin/python bench/idempotence.py --inventory inventories/lab [--playbook site.yml]
"""

import argparse
import json
import os
import re
import resource
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


MITOGEN = False
COSTS = []


def mitogen_env():
    """The variables that put ansible-playbook on mitogen_linear (from the ansible_mitogen installed in .venv)."""
    try:
        import ansible_mitogen  # optional: only for --mitogen
    except ImportError as exc:
        raise SystemExit(f"--mitogen needs mitogen in .venv: .venv/bin/pip install mitogen==0.3.54 ({exc})") from exc
    return {
        "ANSIBLE_STRATEGY_PLUGINS": os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy"),
        "ANSIBLE_STRATEGY": "mitogen_linear",
    }


def run(inventory, playbook, extra=()):
    start = time.perf_counter()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.NamedTemporaryFile("r", suffix=".json") as contact:
        proc = subprocess.run(
            [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", inventory, playbook, *extra],
            cwd=ROOT,
            env=dict(
                env(),
                **(mitogen_env() if MITOGEN else {}),
                ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "bench", "callback_plugins"),
                ANSIBLE_CALLBACKS_ENABLED=_results.callbacks(ROOT, "ttfleet_contact"),
                TTFLEET_CONTACT_FILE=contact.name,
            ),
            text=True,
            capture_output=True,
            check=False,
        )
        text = contact.read()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = time.perf_counter() - start
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    COSTS.append({"playbook": os.path.basename(playbook), "cpu_s": cpu, "contact": json.loads(text) if text else {}})
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
    parser.add_argument(
        "--output", default=None,
        help="results file (default bench/results/idempotence.json; idempotence-mitogen.json with --mitogen)",
    )
    parser.add_argument("--mitogen", action="store_true", help="run every playbook under mitogen_linear")
    args = parser.parse_args()
    global MITOGEN
    MITOGEN = args.mitogen
    output = args.output or os.path.join(ROOT, "bench", "results", f"idempotence{'-mitogen' if MITOGEN else ''}.json")

    for _warmup in range(args.warmup):
        run(args.inventory, args.playbook)
    site_times, changed, tasks, site_costs = [], [], 0, []
    for _run in range(args.runs):
        seconds, recap = run(args.inventory, args.playbook)
        site_costs.append(COSTS[-1])
        site_times.append(seconds)
        changed.append(sum(item["changed"] for item in recap.values()))
        tasks = max(tasks, *(item["ok"] + item["changed"] + item["skipped"] for item in recap.values()))
    baselines, baseline_cpu = {}, {}
    for label, module in (("ping", "ansible.builtin.ping:"), ("noop", "ansible.builtin.meta: noop")):
        # A run killed before its finally leaves the file behind: .gitignore keeps bench/.baseline-*.yml out of git.
        with tempfile.NamedTemporaryFile(
            "w", prefix=".baseline-", suffix=".yml", dir=os.path.join(ROOT, "bench"), delete=False
        ) as handle:
            handle.write(baseline_playbook(tasks, args.hosts, module))
            path = handle.name
        try:
            baselines[label] = statistics.median(run(args.inventory, path)[0] for _run in range(args.runs))
            baseline_cpu[label] = statistics.median(cost["cpu_s"] for cost in COSTS[-args.runs:])
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
        "strategy": "mitogen_linear" if MITOGEN else "linear",
        # Controller CPU seconds of one re-run divided by the hosts, and per host the results with host contact.
        "controller_cpu_s_per_host": round(statistics.median(c["cpu_s"] for c in site_costs) / max(len(recap), 1), 2),
        "contact_per_host": site_costs[-1]["contact"],
        # The same for the ping baseline (as many pings per host as the re-run has tasks), in the same run.
        "ping_cpu_s_per_host": round(baseline_cpu["ping"] / max(len(recap), 1), 2),
        "cpu_ratio_to_ping": round(
            statistics.median(c["cpu_s"] for c in site_costs) / max(baseline_cpu["ping"], 1e-9), 2
        ),
    }
    print(f"hosts {result['hosts']}, {tasks} tasks on the busiest host, median of {args.runs} runs")
    print(f"re-run of {args.playbook}: {result['rerun_s']} s   changed: {changed}")
    print(f"baseline ({tasks} x ping, one module round trip each): {result['baseline_s']} s   ratio: {result['ratio']}")
    print(f"floor ({tasks} x meta noop, no host contact): {result['noop_s']} s")
    print(f"controller CPU per host per re-run: {result['controller_cpu_s_per_host']} s ({result['strategy']}); "
          f"{tasks} x ping: {result['ping_cpu_s_per_host']} s per host, ratio {result['cpu_ratio_to_ping']}")
    for host, counts in sorted(result["contact_per_host"].items()):
        print(f"  {host}: {counts['contact']} results with host contact, {counts['controller']} controller-only, "
              f"{counts['skipped']} skipped")
    _results.write(output, result)


if __name__ == "__main__":
    main()
