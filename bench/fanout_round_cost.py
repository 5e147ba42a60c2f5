#!/usr/bin/env python
"""What a fan-out round costs Ansible itself: the fixed cost c of the model in docs/benchmarks.md, on N lab hosts.

bench/model_cache_fanout.py times the transfers of the rounds through `docker exec`; this script times the part it
leaves out, the role's round as Ansible runs it. For each N (default 4, 8, 16) it starts N fresh containers of the
lab image, plans the fan-out of one model with the role's filter (ttfleet.inference.weights_fanout: the first host
holds it, the others need it) and runs the rounds as roles/model_cache/tasks/weights.yml does (include_tasks looped
over the rounds, the linear strategy), each round the four tasks of weights_round.yml with their conditions and
loops, and a real module run where the role runs one (the holders of the round run ansible.builtin.stat as their
"serve", the pullers run it as their "pull"); the report and the origin-fallback tasks loop over nothing, as in a round
where every pull succeeded. No bytes move: what is timed is Ansible's cost per round on this controller. Uses the
checkout's ansible.cfg settings (pipelining, internal_poll_interval), forks = N.

Prints, and writes to bench/results/fanout_round_cost.json, per N: rounds, the wall time of each round (from the
first task of the round to the first task of the next, by the controller's clock) and their mean. Asserts nothing.
  bench/fanout_round_cost.py [--hosts 4,8,16]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "ttfleet-lab/debian:latest"
PREFIX = "fcb-"

PLAY = """
- name: Rounds of a fan-out with the role's tasks, no transfer
  hosts: all
  gather_facts: false
  tasks:
    - name: Plan the fan-out with the role's filter
      ansible.builtin.set_fact:
        fcb_plan: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'fcb_work')))
          | ttfleet.inference.weights_fanout(ansible_play_hosts) }}"
      run_once: true

    - name: Run the rounds
      ansible.builtin.include_tasks: round.yml
      loop: "{{ range(1, (fcb_plan | ttfleet.inference.weights_fanout_rounds) + 1) | list }}"
      loop_control:
        loop_var: fcb_round

    - name: Mark the end
      ansible.builtin.set_fact:
        fcb_end: "{{ lookup('ansible.builtin.pipe', 'date +%s.%N') }}"
      run_once: true

    - name: Write the marks for the script
      ansible.builtin.copy:
        content: "{{ {'marks': fcb_marks, 'end': fcb_end | float} | to_json }}"
        dest: "{{ fcb_out }}"
        mode: "0644"
      delegate_to: localhost
      run_once: true
      vars:
        ansible_connection: local
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""

ROUND = """
- name: Mark the start of round {{ fcb_round }}
  ansible.builtin.set_fact:
    fcb_mark: "{{ lookup('ansible.builtin.pipe', 'date +%s.%N') }}"
  run_once: true
  register: fcb_marked

- name: Serve in round {{ fcb_round }}
  ansible.builtin.stat:
    path: /etc/hostname
  loop: "{{ ['M'] if fcb_round in fcb_plan[inventory_hostname]['M'].serve_rounds else [] }}"
  register: fcb_servers

- name: Pull in round {{ fcb_round }}
  vars:
    fcb_slot: "{{ fcb_plan[inventory_hostname]['M'] }}"
    fcb_urls: "{{ ([fcb_slot.peer] + fcb_slot.alternates) | map('extract', hostvars, 'fcb_servers')
      | map(attribute='results', default=[]) | flatten | list if fcb_slot.role == 'pull' else [] }}"
  ansible.builtin.stat:
    path: /etc/hostname
  loop: "{{ ['M'] if fcb_slot.role == 'pull' and fcb_slot.round == fcb_round else [] }}"
  failed_when: false
  register: fcb_pulled

- name: Report the pulls that needed another holder in round {{ fcb_round }}
  ansible.builtin.debug:
    msg: "{{ item }}"
  loop: "{{ fcb_pulled.results | default([]) | selectattr('peer_failures', 'defined') | list }}"

- name: Fetch from the origin what no holder could send in round {{ fcb_round }}
  ansible.builtin.stat:
    path: /etc/hostname
  loop: "{{ fcb_pulled.results | default([]) | selectattr('failed_pull', 'defined') | list }}"

- name: Keep the start of round {{ fcb_round }}
  ansible.builtin.set_fact:
    fcb_marks: "{{ (fcb_marks | default([])) + [fcb_mark | float] }}"
  run_once: true
"""


def docker(*args, check=True):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def start_hosts(names):
    for name in names:
        docker("rm", "-f", name, check=False)
        docker(
            "run", "-d", "--name", name, "--hostname", name, "--cap-add", "SYS_ADMIN",
            "--security-opt", "seccomp=unconfined", "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--tmpfs", "/run", "--tmpfs", "/tmp", IMAGE, "/lib/systemd/systemd",
        )  # fmt: skip
    for name in names:
        for _attempt in range(100):
            if docker("exec", name, "python3", "-c", "pass", check=False).returncode == 0:
                break
            time.sleep(0.1)


def run(count, work):
    names = [f"{PREFIX}{i:02d}" for i in range(1, count + 1)]
    start_hosts(names)
    try:
        inventory = {"all": {"hosts": {}, "vars": {
            "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}
        for index, name in enumerate(names):
            entry = {"model": "M", "repo_id": "org/M", "revision": "r" * 40, "site": "s", "shareable": True,
                     "complete": index == 0}  # fmt: skip
            inventory["all"]["hosts"][name] = {"fcb_work": [entry]}
        with open(os.path.join(work, "hosts.json"), "w") as fh:
            json.dump(inventory, fh)
        out = os.path.join(work, f"marks-{count}.json")
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORKS=str(count),
                   ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"))  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(
            ["ansible-playbook", "-i", os.path.join(work, "hosts.json"), "-e", f"fcb_out={out}",
             os.path.join(work, "play.yml")],
            capture_output=True, text=True, env=env, cwd=ROOT, check=False,
        )  # fmt: skip
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"N={count}: the playbook failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
        with open(out) as fh:
            facts = json.load(fh)
        marks = [*facts["marks"], facts["end"]]
        per_round = [round(b - a, 2) for a, b in itertools.pairwise(marks)]
        return {"hosts": count, "rounds": len(per_round), "round_s": per_round,
                "mean_round_s": round(statistics.mean(per_round), 2), "playbook_s": round(wall, 1)}  # fmt: skip
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4,8,16")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="fcb-") as work:
        with open(os.path.join(work, "play.yml"), "w") as fh:
            fh.write(PLAY)
        with open(os.path.join(work, "round.yml"), "w") as fh:
            fh.write(ROUND)
        for count in [int(n) for n in args.hosts.split(",")]:
            result = run(count, work)
            print(json.dumps(result))
            results.append(result)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "fanout_round_cost.json"), "w") as fh:
        json.dump({"machine": platform.node(), "cpus": os.cpu_count(), "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
