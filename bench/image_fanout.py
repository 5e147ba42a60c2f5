#!/usr/bin/env python
"""Fan-out of a TTIS image over N lab hosts through the site registry: origin bytes, wall time, slowest host.

For each N (default 1, 4, 8) the script starts a site cache host and N hosts of the lab image on their own Docker
network, gives the hosts a Docker engine (Debian's docker.io) and the cache host ttfleet.inference.site_registry
(Debian's docker-registry, htpasswd, TLS from a lab CA), all outside the timing. The origin is tests/lab/registry.py
(Debian's docker-registry behind tests/tools/counting_proxy.py) holding the lab's stand-in image under a spec image
name. Then it times the collection's image path as the serve role runs it (roles/serve/tasks/images.yml):
registry_auth on every host, image_mirror once on the cache host (origin -> site registry), container_image on every
host (site registry -> engine). It prints and writes to bench/results/image_fanout.json:

  origin_ratio   bytes of blobs the origin sent / the image's bytes (1.0 is the goal: once per site)
  wall_s         the timed playbook, seconds (Ansible's own start-up included)
  copy_s         the site copy (image_mirror), seconds
  slowest_s      the slowest host's pull (container_image's own seconds)
  site_bytes     bytes the site registry served (N x the image when every host pulled it all)

Asserts nothing.  bench/image_fanout.py [--hosts 1,4,8] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETWORK = "ttfleet-bench-img"
IMAGE = "ttfleet-lab/debian:latest"
SERVE_IMAGE = (
    "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.19.0-b204341-9bd099c"
)
# LAB SECRET (benchmark only).
PASSWORD = "bench-Registry-pw-" + "3k9"

PREP = """
- name: Site registry
  hosts: cache
  gather_facts: false
  roles: [ttfleet.inference.site_registry]
- name: Docker engines
  hosts: fleet
  gather_facts: false
  tasks:
    - name: Install docker.io
      ansible.builtin.apt: {name: docker.io, update_cache: true, install_recommends: false}
    - name: Start it
      ansible.builtin.systemd_service: {name: docker.service, state: started}
"""

TIMED = """
- name: Fetch the image once per site
  hosts: fleet
  gather_facts: false
  tasks:
    - name: Store the credentials
      ttfleet.inference.registry_auth:
        registry: "{{ site }}"
        username: fleet
        password: "{{ password }}"
        ca_cert: "{{ ca }}"
      no_log: true
    - name: Copy the image into the site registry
      ttfleet.inference.image_mirror:
        images: [{source: "{{ image }}", target: "{{ image | regex_replace('^ghcr.io', site) }}"}]
        upstream: {ghcr.io: "{{ origin }}"}
        plain_http: ["{{ origin }}"]
        target_username: fleet
        target_password: "{{ password }}"
        target_ca_cert: "{{ ca }}"
      delegate_to: bimg-cache
      run_once: true
      register: copied
    - name: Pull it
      ttfleet.inference.container_image:
        images: [{image: "{{ image | regex_replace('^ghcr.io', site) }}", origin: "{{ image }}"}]
"""


def run(*argv, check=True, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    return proc


def ansible_env():
    env = dict(os.environ)
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(ROOT, ".ansible", "collections"))
    env.update(ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="0", LANG="C.UTF-8")
    return env


def start_host(name, work, count):
    # An engine data directory of its own per run: a host of an earlier N would otherwise have the image already.
    docker_dir = os.path.join(work, f"{name}-{count}-docker")
    os.makedirs(docker_dir, exist_ok=True)
    run("docker", "rm", "-f", name, check=False)
    run(
        "docker", "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK,
        "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt", "seccomp=unconfined",
        "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
        "--tmpfs", "/tmp", "-v", f"{docker_dir}:/var/lib/docker", "--label", "ttfleet.bench=image_fanout",
        "--stop-signal", "SIGRTMIN+3", IMAGE, "/lib/systemd/systemd",
    )  # fmt: skip


def origin_blob_bytes(log_path):
    total = 0
    with open(log_path) as handle:
        for line in handle:
            entry = json.loads(line)
            if entry["method"] == "GET" and "/blobs/sha256:" in entry["path"]:
                total += entry["bytes"]
    return total


def run_fanout(count, work, origin, tls, size):
    hosts = [f"bimg-{index}" for index in range(1, count + 1)]
    for name in ["bimg-cache", *hosts]:
        start_host(name, work, count)
    site = "bimg-cache:5000"
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "community.docker.docker",
                "ansible_python_interpreter": "/usr/bin/python3",
                "site": site,
                "password": PASSWORD,
                "ca": tls["ca"],
                "image": SERVE_IMAGE,
                "origin": origin["lab_image_origin_registry"],
                "site_registry_users": [{"username": "fleet", "password": PASSWORD}],
                "site_registry_tls_cert": tls["certs"]["bimg-cache"]["cert"],
                "site_registry_tls_key": tls["certs"]["bimg-cache"]["key"],
            },
            "children": {"cache": {"hosts": {"bimg-cache": {}}}, "fleet": {"hosts": {h: {} for h in hosts}}},
        }
    }
    inv_path = os.path.join(work, f"inventory-{count}.json")
    with open(inv_path, "w") as handle:
        json.dump(inventory, handle)
    env = ansible_env()
    playbook = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
    for name, text in (("prep", PREP), ("timed", TIMED)):
        with open(os.path.join(work, f"{name}.yml"), "w") as handle:
            handle.write(text)
    run(playbook, "-i", inv_path, "--forks", str(count + 1), os.path.join(work, "prep.yml"), env=env)
    open(os.path.join(work, "origin", "origin.jsonl"), "w").close()
    started = time.monotonic()
    timed_env = dict(env, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    proc = run(playbook, "-i", inv_path, "--forks", str(count + 1), os.path.join(work, "timed.yml"), env=timed_env)
    wall = time.monotonic() - started
    # The json callback's document follows any progress lines the action plugins printed while the pulls ran.
    start = 0 if proc.stdout.startswith("{\n") else proc.stdout.index("\n{\n") + 1
    report = json.loads(proc.stdout[start:])
    tasks = {task["task"]["name"]: task["hosts"] for task in report["plays"][0]["tasks"]}
    pulls = [result["seconds"] for result in tasks["Pull it"].values()]
    copied = tasks["Copy the image into the site registry"].values()
    copy_s = next((r["seconds"] for r in copied if "seconds" in r), None)
    site_log = run(
        "docker", "exec", "bimg-cache", "journalctl", "-u", "docker-registry", "-o", "cat", "--no-pager"
    ).stdout
    site_bytes = 0
    for line in site_log.splitlines():
        if '"GET /v2/' in line and "/blobs/sha256:" in line and '" 200 ' in line:
            site_bytes += int(line.split('" 200 ', 1)[1].split()[0])
    origin_bytes = origin_blob_bytes(os.path.join(work, "origin", "origin.jsonl"))
    for name in ["bimg-cache", *hosts]:
        run("docker", "rm", "-f", name, check=False)
    return {
        "hosts": count,
        "image_bytes": size,
        "origin_bytes": origin_bytes,
        "origin_ratio": round(origin_bytes / size, 3),
        "site_bytes": site_bytes,
        "wall_s": round(wall, 1),
        "copy_s": copy_s,
        "slowest_s": max(pulls, default=None),
        "pulls": sorted(pulls),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,4,8")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "image_fanout.json"))
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ttfleet-image-fanout-")
    run("docker", "network", "create", NETWORK, check=False)
    py = sys.executable
    tar = run(py, os.path.join(ROOT, "tests", "lab", "lab.py"), "serve-image", f"--tag={SERVE_IMAGE}").stdout
    state = os.path.join(work, "origin")
    registry = os.path.join(ROOT, "tests", "lab", "registry.py")
    origin = json.loads(
        run(py, registry, "start", f"--network={NETWORK}", f"--state={state}", f"--vars-file={state}/origin.yml",
            f"--image-tar={tar.strip().splitlines()[-1]}", f"--tag={SERVE_IMAGE}").stdout.strip().splitlines()[-1]
    )  # fmt: skip
    tls = json.loads(run(py, registry, "ca", f"--state={state}", "--name=bimg-cache").stdout)
    size = origin["lab_image_sizes"][SERVE_IMAGE]["bytes"]
    results = {"machine": f"{platform.node()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "runs": []}
    try:
        for count in [int(n) for n in args.hosts.split(",")]:
            results["runs"].append(run_fanout(count, work, origin, tls, size))
            print(json.dumps(results["runs"][-1]), flush=True)
    finally:
        run(py, registry, "stop", f"--state={state}", check=False)
        run("docker", "network", "rm", NETWORK, check=False)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
