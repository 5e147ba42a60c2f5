#!/usr/bin/env python
"""Serving gap of a rolling upgrade: poll /health of every instance of a fleet while upgrade.yml runs.

    bench/upgrade_gap.py --inventory INV [--playbook playbooks/upgrade.yml] [-e VAR=VALUE ...] [--limit HOSTS]
                         [--interval 0.2] [--out bench/results/upgrade_gap.json]

Before the run it asks every host for its instances (ttfleet.inference.fleet_status: instance, port); then one
thread per instance GETs http://<host address>:<port>/health every --interval seconds while ansible-playbook runs
the upgrade, and for a few seconds after it ends. Host addresses are the container addresses for hosts reached
with the community.docker.docker connection (the lab), ansible_host otherwise.

Per instance it reports every gap (from the first poll that did not get 200 to the next one that did: unit stop
-> healthy again, to within one poll interval) and their total; per host the span from its first instance going
down to its last coming back; for the fleet the time-weighted share of instances serving during the rollout and
the lowest share seen. Prints a table and writes JSON; asserts nothing (the exit status is the playbook's).
With images that change, `-e serve_image_prefetch=false` measures the gap without the pre-pull (the unit's docker run
pulls while the instance is down) for a comparison with the default.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ansible_env():
    env = dict(os.environ)
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(ROOT, ".ansible", "collections"))
    env.setdefault("LANG", "C.UTF-8")
    env.setdefault("LC_ALL", "C.UTF-8")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    return env


def tool(name):
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


def fleet_instances(inventory, limit):
    """{host: [{instance, port}]} from fleet_status on every host, with each host's address."""
    env = ansible_env()
    env.update({"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"})
    argv = [tool("ansible"), limit or "all", "-i", inventory, "-m", "ttfleet.inference.fleet_status", "-a", "timeout=2"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        raise SystemExit(f"fleet_status gave no JSON (rc {out.returncode}): {out.stderr[-2000:]}") from None
    hosts = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed") or result.get("unreachable"):
                    raise SystemExit(f"{host}: fleet_status failed: {result.get('msg')}")
                hosts[host] = {
                    "release": result.get("release"),
                    "instances": [{"instance": i["instance"], "port": i["port"]} for i in result["instances"]],
                }
    inv = json.loads(
        subprocess.run(
            [tool("ansible-inventory"), "-i", inventory, "--list"],
            env=ansible_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    hostvars = inv.get("_meta", {}).get("hostvars", {})
    for host, entry in hosts.items():
        entry["address"] = host_address(host, hostvars.get(host, {}))
    return hosts


def host_address(host, hostvars):
    if hostvars.get("ansible_connection") in ("community.docker.docker", "docker"):
        name = hostvars.get("ansible_host", host)
        return subprocess.run(
            ["docker", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    return hostvars.get("ansible_host", host)


class Poller(threading.Thread):
    def __init__(self, url, interval, stop):
        super().__init__(daemon=True)
        self.url, self.interval, self.stop = url, interval, stop
        self.samples = []  # (monotonic seconds, healthy)

    def run(self):
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=max(self.interval, 0.5)) as response:
                    ok = response.status == 200
            except (urllib.error.URLError, OSError, ValueError):
                ok = False
            self.samples.append((started, ok))
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def gaps_of(samples):
    """[(down_at, up_at)] from the first unhealthy poll to the next healthy one; up_at None if never healthy again."""
    gaps, down = [], None
    for at, ok in samples:
        if not ok and down is None:
            down = at
        elif ok and down is not None:
            gaps.append((down, at))
            down = None
    if down is not None:
        gaps.append((down, None))
    return gaps


def serving_share(pollers, start, end, step=0.1):
    """Time-weighted and lowest share of instances answering 200, sampled every step seconds in [start, end]."""
    if not pollers or end <= start:
        return None, None
    cursors = [0] * len(pollers)
    state = [True] * len(pollers)
    total, lowest, n = 0.0, 1.0, 0
    at = start
    while at <= end:
        for k, poller in enumerate(pollers):
            samples = poller.samples
            while cursors[k] < len(samples) and samples[cursors[k]][0] <= at:
                state[k] = samples[cursors[k]][1]
                cursors[k] += 1
        share = sum(state) / len(state)
        total += share
        lowest = min(lowest, share)
        n += 1
        at += step
    return total / n, lowest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--playbook", default=os.path.join(ROOT, "playbooks", "upgrade.yml"))
    parser.add_argument("-e", "--extra-vars", action="append", default=[])
    parser.add_argument("--limit", default="")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to keep polling after the playbook")
    parser.add_argument("--log", default="", help="file for the playbook's output (default: beside --out)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "upgrade_gap.json"))
    args = parser.parse_args(argv)

    hosts = fleet_instances(args.inventory, args.limit)
    stop = threading.Event()
    pollers = {}
    for host, entry in hosts.items():
        for inst in entry["instances"]:
            poller = Poller(f"http://{entry['address']}:{inst['port']}/health", args.interval, stop)
            pollers[(host, inst["instance"])] = poller
            poller.start()
    time.sleep(max(1.0, 3 * args.interval))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    log_path = args.log or os.path.splitext(args.out)[0] + ".log"
    argv_pb = [tool("ansible-playbook"), "-i", args.inventory, args.playbook]
    for extra in args.extra_vars:
        argv_pb += ["-e", extra]
    if args.limit:
        argv_pb += ["--limit", args.limit]
    wall_start = datetime.datetime.now(datetime.timezone.utc)
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run(argv_pb, env=ansible_env(), stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    end = time.monotonic()
    time.sleep(args.settle)
    stop.set()
    for poller in pollers.values():
        poller.join(timeout=5)

    instances, per_host = [], {}
    for (host, name), poller in pollers.items():
        gaps = gaps_of([s for s in poller.samples if s[0] >= start])
        closed = [(d, u) for d, u in gaps if u is not None]
        row = {
            "host": host,
            "instance": name,
            "url": poller.url,
            "polls": len(poller.samples),
            "gaps_s": [round(u - d, 2) for d, u in closed],
            "down_total_s": round(sum(u - d for d, u in closed), 2),
            "still_down": any(u is None for _down, u in gaps),
            "first_down_s": round(gaps[0][0] - start, 2) if gaps else None,
        }
        instances.append(row)
        span = per_host.setdefault(host, {"host": host, "down_at": None, "up_at": None, "instances": 0})
        span["instances"] += 1
        for down, up in gaps:
            span["down_at"] = down if span["down_at"] is None else min(span["down_at"], down)
            if up is not None:
                span["up_at"] = up if span["up_at"] is None else max(span["up_at"], up)
    host_rows = []
    for span in per_host.values():
        gap = (span["up_at"] - span["down_at"]) if span["down_at"] is not None and span["up_at"] else 0.0
        longest = max((max(r["gaps_s"], default=0.0) for r in instances if r["host"] == span["host"]), default=0.0)
        host_rows.append(
            {
                "host": span["host"],
                "instances": span["instances"],
                "gap_span_s": round(gap, 2),
                "longest_instance_gap_s": longest,
                "release_before": hosts[span["host"]]["release"],
            }
        )
    mean_share, lowest_share = serving_share(list(pollers.values()), start, end)
    result = {
        "date": wall_start.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "playbook": os.path.relpath(args.playbook, ROOT),
        "extra_vars": args.extra_vars,
        "limit": args.limit,
        "rc": rc,
        "duration_s": round(end - start, 1),
        "poll_interval_s": args.interval,
        "instances_total": len(pollers),
        "serving_share_mean": None if mean_share is None else round(mean_share, 4),
        "serving_share_min": lowest_share,
        "hosts": sorted(host_rows, key=lambda r: r["host"]),
        "instances": sorted(instances, key=lambda r: (r["host"], r["instance"])),
        "log": log_path,
    }
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)

    print(
        f"upgrade {' '.join(args.extra_vars)}: rc {rc}, {result['duration_s']} s, {len(pollers)} instances, "
        f"polled every {args.interval} s"
    )
    print(f"{'host':<18} {'instance':<24} {'gaps (s)':<18} {'down total (s)':>14}")
    for row in result["instances"]:
        gaps = ", ".join(f"{g:.1f}" for g in row["gaps_s"]) or "-"
        print(
            f"{row['host']:<18} {row['instance']:<24} {gaps:<18} {row['down_total_s']:>14.1f}"
            + ("  STILL DOWN" if row["still_down"] else "")
        )
    for row in result["hosts"]:
        print(
            f"{row['host']}: serving gap span {row['gap_span_s']:.1f} s over {row['instances']} instance(s), "
            f"longest instance gap {row['longest_instance_gap_s']:.1f} s"
        )
    if mean_share is not None:
        print(f"share of instances serving during the rollout: mean {mean_share:.1%}, lowest {lowest_share:.1%}")
    print(f"wrote {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
