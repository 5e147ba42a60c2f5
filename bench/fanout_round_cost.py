#!/usr/bin/env python
"""What a fan-out round costs Ansible itself: a + b x pullers of the model in docs/benchmarks.md, on N lab hosts.

bench/model_cache_fanout.py times the transfers of the rounds through `docker exec`; this script times the part it
leaves out, the role's rounds as Ansible runs them. For each N (default 4, 8, 16) it starts N fresh containers of
the lab image and runs the real tasks of the weights fan-out, roles/model_cache/tasks/weights.yml (include_role
tasks_from: weights, with weights_round.yml as the role loops it), with the real modules: the first host fetches a
tiny real model (tests/lab/hf_model.py, about 1 MB) from the lab's Hugging Face mirror (tests/lab/hf_mirror.py,
a state directory of its own), then the others pull it from peers in doubling rounds, each holder serving with
weights_server, each pull checked against the anchored digest. The model is tiny and the hosts share the docker
bridge, so the transfers take milliseconds: what is timed is Ansible's cost per round on this controller. The
model_cache_plan result the role would register is given as a host variable (model_cache_plan.work, the plan's
work entry of each host), so no spec, release or volume plan runs. Uses the checkout's ansible.cfg (pipelining,
internal_poll_interval), forks = N.

A callback (written to the work directory) records the controller's clock at the start of every task; a round
runs from the start of the first task of its weights_round.yml to the start of the next round's (the last round:
to the next task after it). Prints, and writes to bench/results/fanout_round_cost.json, per N: rounds, pullers
and wall time of each round, the whole fan-out (from the first task after the anchors to the end of the stop of
the servers) and the playbook; then the least-squares fit of round time = a + b x pullers over all rounds.
Asserts nothing.
  bench/fanout_round_cost.py [--hosts 4,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fanout import fanout

IMAGE = "ttfleet-lab/debian:latest"
PREFIX = "fcb-"
REPO = "ttfleet-bench/Round-Model"
ROUND_FILE = "weights_round.yml"

PLAY = """
- name: The weights fan-out of roles/model_cache, on its own
  hosts: all
  gather_facts: false
  module_defaults:
    group/ttfleet.inference.weights:
      hf_endpoint: "{{ fcb_endpoint }}"
      host: "{{ inventory_hostname }}"
  tasks:
    - name: Run the role's fan-out tasks
      ansible.builtin.include_role:
        name: ttfleet.inference.model_cache
        tasks_from: weights
"""

# Stand-in callback of the bench: the controller's clock at every task start, and where the task comes from.
CALLBACK = """
from __future__ import annotations
import json, os, time
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "fcb_marks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.marks = []

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.marks.append([time.time(), task.get_path() or "", task.get_name()])

    def v2_playbook_on_stats(self, stats):
        self.marks.append([time.time(), "", "end"])
        with open(os.environ["FCB_MARKS"], "w") as handle:
            json.dump(self.marks, handle)
"""


def docker(*args, check=True):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def start_hosts(names):
    for name in names:
        docker("rm", "-f", name, check=False)
        docker("run", "-d", "--name", name, "--hostname", name, "--tmpfs", "/run", "--tmpfs", "/tmp",
               "--tmpfs", "/var/lib/tt-cache", IMAGE, "sleep", "infinity")  # fmt: skip
    for name in names:
        for _attempt in range(100):
            if docker("exec", name, "python3", "-c", "pass", check=False).returncode == 0:
                break
            time.sleep(0.1)


def rounds_of(marks):
    """[(start, end)] of each round, and the start and end of the whole fan-out, from the task marks."""
    paths = [path for _t, path, _n in marks if os.path.basename(path.rsplit(":", 1)[0]) == ROUND_FILE]
    if not paths:
        raise SystemExit("no task of weights_round.yml ran: the fan-out did not run")
    first = min(paths, key=lambda p: int(p.rsplit(":", 1)[1]))
    starts = [i for i, (_t, path, _n) in enumerate(marks) if path == first]
    rounds = []
    for k, i in enumerate(starts):
        if k + 1 < len(starts):
            j = starts[k + 1]
        else:
            j = i
            while os.path.basename(marks[j][1].rsplit(":", 1)[0]) == ROUND_FILE:
                j += 1
        rounds.append((marks[i][0], marks[j][0]))
    # The fan-out: from the first task after the anchors are fixed to the end of the play.
    anchors = max(i for i, (_t, _p, name) in enumerate(marks) if "Fix the digest" in name)
    return rounds, marks[anchors + 1][0], marks[-1][0]


def run(count, work, endpoint, revision):
    names = [f"{PREFIX}{i:02d}" for i in range(1, count + 1)]
    start_hosts(names)
    try:
        dest = "/var/lib/tt-cache/volume_id_bench/weights/Round-Model"
        entry = {"model": "Round-Model", "repo_id": REPO, "revision": revision, "revision_arg": revision,
                 "path_arg": "", "origin": "hf", "dest": dest, "site": "bench", "shareable": True,
                 "complete": False, "bytes": 1}  # fmt: skip
        inventory = {"all": {"hosts": {n: {} for n in names}, "vars": {
            "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3",
            "tt_device": "n150", "tt_models": [], "fcb_endpoint": endpoint,
            "model_cache_plan": {"work": [entry], "models": []}}}}  # fmt: skip
        with open(os.path.join(work, "hosts.json"), "w") as fh:
            json.dump(inventory, fh)
        marks_file = os.path.join(work, f"marks-{count}.json")
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORKS=str(count),
                   ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
                   ANSIBLE_CALLBACK_PLUGINS=os.path.join(work, "callbacks"),
                   ANSIBLE_CALLBACKS_ENABLED=_results.callbacks(ROOT, "fcb_marks"),
                   FCB_MARKS=marks_file)  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(
            ["ansible-playbook", "-i", os.path.join(work, "hosts.json"), os.path.join(work, "play.yml")],
            capture_output=True, text=True, env=env, cwd=ROOT, check=False,
        )  # fmt: skip
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"N={count}: the playbook failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
        with open(marks_file) as fh:
            marks = json.load(fh)
        rounds, fan_start, fan_end = rounds_of(marks)
        plan = fanout({n: [entry] for n in names}, names)
        pullers = [sum(1 for n in names if plan[n]["Round-Model"]["round"] == r) for r in range(1, len(rounds) + 1)]
        per_round = [round(b - a, 2) for a, b in rounds]
        return {"hosts": count, "rounds": len(per_round), "pullers": pullers, "round_s": per_round,
                "mean_round_s": round(statistics.mean(per_round), 2), "fanout_s": round(fan_end - fan_start, 2),
                "playbook_s": round(wall, 1)}  # fmt: skip
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)


def fit(results):
    """Least squares of round time = a + b x pullers over every round of every N."""
    points = [(p, s) for r in results for p, s in zip(r["pullers"], r["round_s"], strict=True)]
    pullers, seconds = [p for p, s in points], [s for p, s in points]
    mx, my = statistics.mean(pullers), statistics.mean(seconds)
    sxx = sum((p - mx) ** 2 for p in pullers)
    b = sum((p - mx) * (s - my) for p, s in points) / sxx if sxx else 0.0
    return {"a_s": round(my - b * mx, 3), "b_s": round(b, 3), "points": len(points)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4,8,16")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="fcb-") as work:
        with open(os.path.join(work, "play.yml"), "w") as fh:
            fh.write(PLAY)
        os.makedirs(os.path.join(work, "callbacks"))
        with open(os.path.join(work, "callbacks", "fcb_marks.py"), "w") as fh:
            fh.write(CALLBACK)
        state, vars_file = os.path.join(work, "mirror"), os.path.join(work, "mirror.yml")
        mirror = [sys.executable, os.path.join(ROOT, "tests", "lab", "hf_mirror.py")]
        started = subprocess.run(
            [*mirror, "start", "--repo", REPO, "--state", state, "--vars-file", vars_file, "--network", "bridge"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        info = json.loads(started.strip().splitlines()[-1])
        try:
            for count in [int(n) for n in args.hosts.split(",")]:
                result = run(count, work, info["endpoint"], info["revisions"][REPO])
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            subprocess.run([*mirror, "stop", "--state", state, "--vars-file", vars_file], check=False)
    model = fit(results)
    print(json.dumps(model))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "fanout_round_cost.json"), "w") as fh:
        json.dump({"machine": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"),
                   "results": results, "fit": model}, fh, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
