#!/usr/bin/env python
"""A simulated fleet of N hosts over SSH: site.yml from bare, a converged re-run, the weights fan-out, two slices.

Each host is a container of the lab image (tests/lab/build-image.sh: Debian 12, real systemd as PID 1, Python) plus
openssh-server and an unprivileged admin user `fsadmin` with key authentication and passwordless sudo, named fs-<i>
on the network fs-net. The controller reaches every host over real SSH (ansible.cfg's ssh_args, pipelining) and
becomes root through real sudo. What is faked, as the lab fakes it (tests/lab/lab.py): the Tenstorrent devices
(/dev/tenstorrent nodes, a hugetlbfs mount, the tt-smi stand-in and its n150 snapshot); the Docker engine is not there
at all (tt_host_install_docker: false, the docker preflight check skipped) and so neither is serving: site.yml runs
with --skip-tags serve,metrics. tt-inference-server is installed for real from the lab's site mirror, the weights are
fetched for real by the model_cache role from the lab's Hugging Face mirror (tests/lab/hf_mirror.py, a ~44 MB model
with --hidden 1024) and fanned out host to host. docs/benchmarks.md "Simulated fleet" lists it all.

For each N (default 16, 32, 64) it starts N fresh hosts (4 model_cache_sites of N/4 hosts) and measures:

  converge      site.yml from bare: wall s, controller CPU s per host, tasks with host contact per host
  rerun         the converged re-run of site.yml: the same, and its changed count (0 expected)
  fanout        every host's weights removed, then site.yml --tags model_cache (the fan-out through the role) minus
                a converged --tags model_cache run: wall s, pull rounds per site, origin bytes / model bytes (4 = once
                per site)
  slices        (at the largest N, unless --no-slices) the weights removed again and two ansible-runner jobs side
                by side, each limited to two sites: wall s, origin bytes of both, the hosts of each job that read
                the origin

Controller CPU is the user+system time of ansible-playbook and all its children (RUSAGE_CHILDREN) plus the ssh
ControlPersist masters, which daemonize out of that tree: every run gets its own ControlPath directory, and the
masters found there are read from /proc/<pid>/stat and then stopped. The model of docs/benchmarks.md, a per round
(the seeds' origin fetch counted as one) plus b per host that fetches, is fitted on the fan-out runs. Prints the
numbers and writes bench/results/fleet_scale.json; asserts nothing.

    flock /tmp/ttfleet-cpu.lock .venv/bin/python bench/fleet_scale.py [--sizes 16,32,64] [--keep] [--no-slices]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, ".venv", "bin")
PREFIX = "fs-"
NETWORK = "fs-net"
LABEL = "ttfleet.fleet_scale"
ADMIN = "fsadmin"
REPO = "meta-llama/Llama-3.2-1B-Instruct"
SITES = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The lab image plus sshd and the admin user; node_exporter (the metrics role's) masked: no metrics here.
DOCKERFILE = f"""FROM {{base}}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      openssh-server >/dev/null && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \\
 && touch -d @0 /var/lib/apt/lists \\
 && useradd -m -s /bin/bash {ADMIN} && install -d -o {ADMIN} -g {ADMIN} -m 0700 /home/{ADMIN}/.ssh \\
 && echo '{ADMIN} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{ADMIN} && chmod 0440 /etc/sudoers.d/{ADMIN} \\
 && ln -sf /dev/null /etc/systemd/system/prometheus-node-exporter.service
"""
# What the hosts need beyond the lab's group_vars (inventories/lab/group_vars/all/main.yml, n150.yml).
FLEET_VARS = f"""---
# Written by bench/fleet_scale.py: the simulated fleet over SSH as {ADMIN} with sudo.
ansible_connection: ssh
ansible_user: {ADMIN}
ansible_become: true
ansible_python_interpreter: /usr/bin/python3
# No Docker engine and no Tenstorrent APT repository on the simulated hosts (docs/benchmarks.md "Simulated fleet").
tt_host_install: false
tt_host_install_docker: false
tt_host_checks: {{device_type: fail, hugepages: fail, hugepages_pages: warn, docker: skip, disk: warn, ram: warn,
                 firmware: fail, kmd: fail}}
site_metrics: false
"""
SKIP_TAGS = "serve,metrics"


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def _load(rel, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab = _load("tests/lab/lab.py", "lab")
# Its rounds from the task marks and its fit of round time = a + b x pullers: the measure of the issue-19 model.
round_cost = _load("bench/fanout_round_cost.py", "fanout_round_cost")


def docker(*args, check=True, stdin=None):
    proc = subprocess.run(["docker", *args], input=stdin, capture_output=True, text=True, check=False)
    if check and proc.returncode:
        raise SystemExit(f"docker {' '.join(args[:3])} failed: {proc.stderr.strip()[-1000:]}")
    return proc.stdout


def ensure_image():
    text = DOCKERFILE.format(base=lab.ensure_image())
    tag = f"ttfleet-lab/fs-host:{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode:
        log(f"building {tag}")
        docker("build", "-q", "-t", tag, "-", stdin=text)
    return tag


def containers():
    out = docker("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}")
    return [name for name in out.split() if name.startswith(PREFIX)]


def down(network=True):
    names = containers()
    if names:
        docker("rm", "-f", *names)
    if (
        network
        and subprocess.run(["docker", "network", "inspect", NETWORK], capture_output=True, check=False).returncode == 0
    ):
        docker("network", "rm", NETWORK, check=False)


def host_mem_kb(name):
    """Resident memory of every process of a host (its PIDs as the machine sees them), kB."""
    total = 0
    for pid in docker("top", name, "-eo", "pid").split()[1:]:
        try:
            with open(f"/proc/{pid}/status") as handle:
                total += next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def check_inotify(n):
    """systemd takes several inotify instances per host, from one per-user limit (128 by default): past it, hosts stop
    booting ("Failed to create inotify object: Too many open files") and `systemctl is-system-running --wait` hangs."""
    with open("/proc/sys/fs/inotify/max_user_instances") as handle:
        limit = int(handle.read())
    if limit < 8 * n + 256:
        raise SystemExit(f"fs.inotify.max_user_instances is {limit}: {n} systemd hosts need about {8 * n + 256} "
                         f"(sysctl -w fs.inotify.max_user_instances={max(1024, 8 * n + 256)})")  # fmt: skip


def mem_available_mb():
    with open("/proc/meminfo") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("MemAvailable:")) // 1024


def start_hosts(n, image, work):
    """N hosts, each provisioned as an n150 the lab's way (device nodes, hugepages, tt-smi snapshot)."""
    down(network=False)
    lab_dir = os.path.join(work, "lab-dir")
    if not os.path.isdir(lab_dir):
        # One read-only site mirror of tt-inference-server and its wheelhouse for every host (lab.py copies them in).
        lab.ensure_ttis_repo()
        os.makedirs(lab_dir)
        shutil.copytree(os.path.join(lab.TTIS_LAB, "wheels"), os.path.join(lab_dir, "wheels"))
        subprocess.run(["git", "clone", "-q", "--mirror", os.path.join(lab.TTIS_LAB, "tt-inference-server.bundle"),
                        os.path.join(lab_dir, "tt-inference-server.git")], check=True)  # fmt: skip
    names = [f"{PREFIX}{i + 1:03d}" for i in range(n)]
    started = time.monotonic()
    for name in names:
        docker("run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL,
               "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--cgroupns=host",
               "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
               "-v", f"{work}/id.pub:/home/{ADMIN}/.ssh/authorized_keys:ro",
               "-v", f"{lab_dir}:{lab.HOST_LAB_DIR}:ro",
               "--stop-signal", "SIGRTMIN+3", image, "/lib/systemd/systemd")  # fmt: skip

    def provision(name):
        lab.wait_for_systemd(name)  # at most 120 s: a host past the inotify limit never finishes booting
        docker("exec", "-i", name, "sh", "-s", stdin=lab.provision_script("n150"))
        lab.write_snapshot(name, lab.snapshot("n150", name))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(provision, names))
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    addresses = {name: docker("inspect", name, "--format", fmt).strip() for name in names}
    return names, addresses, time.monotonic() - started


def write_inventory(work, names, addresses):
    inv = os.path.join(work, "inventory")
    shutil.rmtree(inv, ignore_errors=True)
    os.makedirs(os.path.join(inv, "group_vars", "all"))
    shutil.copy(os.path.join(ROOT, "inventories", "lab", "group_vars", "all", "main.yml"),
                os.path.join(inv, "group_vars", "all", "00_lab.yml"))  # fmt: skip
    shutil.copy(os.path.join(ROOT, "inventories", "lab", "group_vars", "n150.yml"),
                os.path.join(inv, "group_vars", "n150.yml"))  # fmt: skip
    with open(os.path.join(inv, "group_vars", "all", "10_fleet.yml"), "w") as handle:
        handle.write(FLEET_VARS)
    shutil.copy(os.path.join(work, "mirror.yml"), os.path.join(inv, "group_vars", "all", "zz_lab_mirror.yml"))
    per_site = math.ceil(len(names) / SITES)
    lines = ["---", "all:", "  vars:", f"    ansible_ssh_private_key_file: {work}/id", "  children:",
             "    n150:", "      children:"]  # fmt: skip
    for site in range(SITES):
        lines.append(f"        site_{site + 1}:")
    for site in range(SITES):
        members = names[site * per_site : (site + 1) * per_site]
        lines += [f"    site_{site + 1}:", f"      vars: {{model_cache_site: site-{site + 1}}}", "      hosts:"]
        lines += [f"        {n}: {{ansible_host: {addresses[n]}}}" for n in members]
    with open(os.path.join(inv, "hosts.yml"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return inv


def cpu_of_masters(control_dir):
    """User+system CPU s of the ssh ControlPersist masters of a run (found by their ControlPath); then stops them."""
    total, pids = 0.0, []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().decode(errors="replace")
            if control_dir not in cmdline:
                continue
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the ")": state is field 3 of stat(5), so utime (14) and stime (15) are at 11 and 12 here.
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        pids.append(int(pid))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return total, len(pids)


def env_for(work, tag):
    # Short: a socket path (ControlPath %C, 40 characters, plus the 17 ssh adds while binding) must fit in 108 bytes.
    control = tempfile.mkdtemp(prefix="cp", dir=work)
    contact = os.path.join(work, f"contact-{tag}.json")
    env = dict(
        os.environ,
        LANG="C.UTF-8", LC_ALL="C.UTF-8", ANSIBLE_NOCOLOR="true", ANSIBLE_FORCE_COLOR="false",
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
        ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
        ANSIBLE_HOST_KEY_CHECKING="false",
        # ssh_args (ControlMaster, ControlPersist) from ansible.cfg, as operators run it; the fleet's host keys are
        # new at every start.
        ANSIBLE_SSH_COMMON_ARGS="-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR",
        ANSIBLE_SSH_CONTROL_PATH_DIR=control,
        ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "bench", "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED=_results.callbacks(ROOT, "ttfleet_contact", "ttfleet_marks"),
        TTFLEET_CONTACT_FILE=contact,
        TTFLEET_MARKS_FILE=os.path.join(work, f"marks-{tag}.json"),
    )  # fmt: skip
    return env, control, contact


def playbook(work, inv, tag, n, extra=()):
    """One ansible-playbook run: wall, controller CPU (tree + ControlPersist masters), tasks with host contact."""
    env, control, contact = env_for(work, tag)
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", inv, "--forks", "50", "site.yml", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    masters, count = cpu_of_masters(control)
    with open(os.path.join(work, f"{tag}.log"), "w") as handle:
        handle.write(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-2000:])
        raise SystemExit(f"{tag}: ansible-playbook failed ({proc.returncode}); log {work}/{tag}.log")
    with open(contact) as handle:
        counts = json.load(handle)
    changed = sum(int(line.split(" changed=")[1].split()[0]) for line in proc.stdout.splitlines()
                  if " changed=" in line and " ok=" in line)  # fmt: skip
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(tree + masters, 1),
        "cpu_per_host_s": round((tree + masters) / n, 2),
        "ssh_master_cpu_s": round(masters, 1),
        "ssh_masters": count,
        "tasks_per_host": round(sum(c["contact"] for c in counts.values()) / max(1, len(counts)), 1),
        "changed": changed,
    }


def wipe_weights(names):
    """Every host loses its weights (the volumes' weights directories), as a host that never had them."""
    script = f"rm -rf {'/var/lib/tt-cache'}/volume_id_*/weights"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: docker("exec", n, "sh", "-c", script), names))


def origin_bytes(state):
    with open(os.path.join(state, "origin.jsonl")) as handle:
        entries = [json.loads(line) for line in handle if line.strip()]
    return sum(e["bytes"] for e in entries if "/resolve/" in e["path"])


def reset_origin(state):
    open(os.path.join(state, "origin.jsonl"), "w").close()


def slices(work, inv, names, state, model_bytes):
    """Two ansible-runner jobs side by side, sites 1+2 and sites 3+4, each fanning out inside its own sites."""
    import ansible_runner

    wipe_weights(names)
    reset_origin(state)
    jobs = {}
    start = time.perf_counter()
    for index, limit in enumerate(("site_1:site_2", "site_3:site_4")):
        env, control, _contact = env_for(work, f"slice{index + 1}")
        env.pop("ANSIBLE_CALLBACKS_ENABLED")
        private = os.path.join(work, f"runner-{index + 1}")
        os.makedirs(os.path.join(private, "project"), exist_ok=True)
        thread, runner = ansible_runner.run_async(
            private_data_dir=private, playbook=os.path.join(ROOT, "site.yml"), inventory=inv, limit=limit,
            tags="model_cache", envvars={k: v for k, v in env.items() if k.startswith(("ANSIBLE_", "LANG", "LC_"))},
            forks=50, quiet=True,
        )  # fmt: skip
        jobs[limit] = (thread, runner, control, time.perf_counter())
    out = []
    for limit, (thread, runner, control, t0) in jobs.items():
        thread.join()
        seeds = sorted({e["event_data"]["host"] for e in runner.events if e.get("event") == "runner_on_ok"
                        and e["event_data"].get("task") == "Fetch the weights from their origin"})  # fmt: skip
        masters, _count = cpu_of_masters(control)
        out.append({"limit": limit, "status": runner.status, "rc": runner.rc, "ssh_master_cpu_s": round(masters, 1),
                    "wall_s": round(time.perf_counter() - t0, 1), "origin_readers": seeds})  # fmt: skip
    total = origin_bytes(state)
    result = {"wall_s": round(time.perf_counter() - start, 1), "jobs": out,
              "origin_bytes": total, "origin_per_model": round(total / model_bytes, 3)}  # fmt: skip
    print(f"slices: {json.dumps(result)}", flush=True)
    return result


def one(n, image, work, state, model_bytes, args):
    log(f"N={n}: starting hosts")
    before = mem_available_mb()
    names, addresses, start_s = start_hosts(n, image, work)
    fleet_mb = before - mem_available_mb()
    mem = [host_mem_kb(name) for name in names[:4]]
    inv = write_inventory(work, names, addresses)
    log(f"N={n}: {start_s:.0f} s to start; site.yml from bare")
    reset_origin(state)
    skip = ["--skip-tags", SKIP_TAGS]
    converge = playbook(work, inv, f"converge-{n}", n, skip)
    converge["origin_per_model"] = round(origin_bytes(state) / model_bytes, 3)
    log(f"N={n}: converged re-run")
    rerun = playbook(work, inv, f"rerun-{n}", n, skip)
    log(f"N={n}: fan-out through model_cache")
    converged_mc = playbook(work, inv, f"mc-converged-{n}", n, ["--tags", "model_cache"])
    wipe_weights(names)
    reset_origin(state)
    fan = playbook(work, inv, f"fanout-{n}", n, ["--tags", "model_cache"])
    fan["origin_per_model"] = round(origin_bytes(state) / model_bytes, 3)
    fan["rounds"] = math.ceil(math.log2(math.ceil(n / SITES)))
    fan["pullers"] = n - SITES
    fan["fanout_s"] = round(fan["wall_s"] - converged_mc["wall_s"], 1)
    fan["converged_model_cache"] = converged_mc
    fan.update(round_times(work, f"fanout-{n}", n))
    fan["fleet_mem_after_mb"] = before - mem_available_mb()
    result = {"hosts": n, "start_s": round(start_s, 1), "host_rss_mb": round(sum(mem) / len(mem) / 1024, 1),
              "fleet_mem_mb": fleet_mb,
              "converge": converge, "rerun": rerun, "fanout": fan}  # fmt: skip
    if not args.no_slices and n == max(int(s) for s in args.sizes.split(",")):
        result["slices"] = slices(work, inv, names, state, model_bytes)
    print(json.dumps({k: v for k, v in result.items() if k != "slices"}), flush=True)
    return result


def pullers_per_round(n):
    """The pulls of each round over the 4 sites of N/4 hosts, one seed each: a site's holders double every round."""
    per_site, holders, out = math.ceil(n / SITES), 1, []
    while holders < per_site:
        pulls = min(holders, per_site - holders)
        out.append(pulls * SITES)
        holders += pulls
    return out


def round_times(work, tag, n):
    """Each pull round's wall time from the run's task marks (bench/fanout_round_cost.py's rounds_of), with its
    pullers: the points of round time = a + b x pullers, the issue-19 model's own measure, here over SSH."""
    with open(os.path.join(work, f"marks-{tag}.json")) as handle:
        marks = json.load(handle)
    rounds, _start, _end = round_cost.rounds_of(marks)
    out = {"round_s": [round(end - start, 2) for start, end in rounds], "round_pullers": pullers_per_round(n)}
    # The controller's CPU over each round (ttfleet_marks' .cpu: ansible-playbook and its reaped workers at each
    # mark), what a controller with cores of its own would spend; the wall time above also waits for the hosts,
    # which run on the same two cores here.
    with contextlib.suppress(FileNotFoundError):
        with open(os.path.join(work, f"marks-{tag}.json.cpu")) as handle:
            cpu = json.load(handle)
        at = {mark[0]: index for index, mark in enumerate(marks)}
        out["round_cpu_s"] = [round(cpu[at[end]] - cpu[at[start]], 2) for start, end in rounds]
    return out


def round_fit(runs, key="round_s"):
    """round time (key round_s) or the controller's CPU of a round (round_cpu_s) = a + b x pullers, over every round
    of every N that has it (bench/fanout_round_cost.py's fit)."""
    results = [{"pullers": r["fanout"]["round_pullers"], "round_s": r["fanout"][key]}
               for r in runs if key in r["fanout"]]  # fmt: skip
    if sum(len(r["round_s"]) for r in results) < 2:
        return None
    return round_cost.fit(results)


def fit(runs):
    """Least squares of fanout_s = a x (rounds + 1) + b x hosts over the runs (None with fewer than two).

    The seeds' origin fetch is one more round, with the seeds as its fetchers: every host fetches once."""
    pts = [(r["fanout"]["rounds"] + 1, r["hosts"], r["fanout"]["fanout_s"]) for r in runs]
    if len(pts) < 2:
        return None
    s_rr = sum(r * r for r, _p, _y in pts)
    s_pp = sum(p * p for _r, p, _y in pts)
    s_rp = sum(r * p for r, p, _y in pts)
    s_ry = sum(r * y for r, _p, y in pts)
    s_py = sum(p * y for _r, p, y in pts)
    det = s_rr * s_pp - s_rp * s_rp
    if not det:
        return None
    return {"a_s": round((s_ry * s_pp - s_py * s_rp) / det, 3), "b_s": round((s_py * s_rr - s_ry * s_rp) / det, 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64")
    parser.add_argument("--hidden", type=int, default=1024, help="the model's hidden size (1024: ~44 MB of weights)")
    parser.add_argument("--keep", action="store_true", help="leave the last fleet and the mirror running")
    parser.add_argument("--no-slices", action="store_true", help="skip the two ansible-runner slices")
    parser.add_argument("--output", default=os.path.join(ROOT, "bench", "results", "fleet_scale.json"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="fleet-scale-")
    os.chmod(work, 0o755)
    state = os.path.join(work, "hf-mirror")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()  # fmt: skip
    check_inotify(max(int(s) for s in args.sizes.split(",")))
    image = ensure_image()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(work, "id")], check=True)
    os.chmod(os.path.join(work, "id.pub"), 0o644)
    results = []
    mirror_vars = os.path.join(work, "mirror.yml")
    try:
        down()
        docker("network", "create", "--label", LABEL, NETWORK)
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "lab", "hf_mirror.py"), "start", "--repo", REPO,
                        "--state", state, "--network", NETWORK, "--vars-file", mirror_vars,
                        "--hidden", str(args.hidden)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        with open(os.path.join(state, "models.json")) as handle:
            files = json.load(handle)[REPO]["files"]
        model_bytes = sum(item["size"] for path, item in files.items() if not path.startswith("original/"))
        for n in [int(s) for s in args.sizes.split(",")]:
            # The mirror listens on the network's gateway: the network outlives each N's hosts.
            results.append(one(n, image, work, state, model_bytes, args))
    finally:
        if not args.keep:
            mirror = os.path.join(ROOT, "tests", "lab", "hf_mirror.py")
            subprocess.run([sys.executable, mirror, "stop", "--state", state, "--vars-file", mirror_vars],
                           check=False)  # fmt: skip
            down()
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept the fleet and {work}")
    data = {**_results.stamp(), "commit": commit, "model": REPO, "model_bytes": model_bytes, "sites": SITES,
            "skipped_tags": SKIP_TAGS, "results": results, "fanout_fit": fit(results),
            "round_fit": round_fit(results), "round_cpu_fit": round_fit(results, "round_cpu_s")}  # fmt: skip
    fits = {"sizes": data["fanout_fit"], "rounds": data["round_fit"], "round_cpu": data["round_cpu_fit"]}
    print(f"fan-out fits: {json.dumps(fits)}", flush=True)
    _results.write(args.output, data)


if __name__ == "__main__":
    main()
