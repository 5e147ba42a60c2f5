#!/usr/bin/env python
"""The whole job on one machine: a simulated fleet, site.yml, a chat completion per instance, the fleet report.

    tests/lab/demo.py [--hosts p300x2,n150,n300]      (make demo; make lab-down removes everything again)

1. starts one lab host per device type (tests/lab/lab.py up; a p300x2 is a QuietBox 2 with its factory volume),
2. serves a tiny real model over the Hugging Face protocol (tests/lab/hf_mirror.py: olah behind a byte counter),
3. builds the stand-in inference image under the images the v0.20.0 specs name and copies it into every host,
4. runs site.yml (tt_host -> inference_server -> model_cache -> serve),
5. sends a chat completion to every served instance through its published port with its bearer key,
6. runs the status playbook and prints where the report is, then a short table.
Lab only: nothing here is part of the collection.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import load_spec_file
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve

SPEC = os.path.join(ROOT, "tests", "fixtures", "specs", "release_model_spec-v0.20.0.json.gz")
INVENTORY = os.path.join(ROOT, "inventories", "lab")
ARCHIVE = "/var/lib/ttfleet-lab/serve-image.tar"
STARTED = time.monotonic()


def step(text):
    print(f"\n==> [{time.monotonic() - STARTED:6.0f} s] {text}", flush=True)


def run(argv, capture=False):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"))
    proc = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=capture, check=False)
    if proc.returncode != 0:
        if capture:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"demo: {' '.join(argv[:3])} ... failed with exit code {proc.returncode}")
    return proc.stdout if capture else ""


def python(*args, capture=False):
    return run([sys.executable, *args], capture=capture)


DEVICE_TYPES = ("n150", "n300", "t3k", "galaxy", "p150", "p150x4", "p150x8", "p300", "p300x2")


def lab_hosts():
    """Host vars of the lab inventory, with tt_device set from the device-type group as the tt role does."""
    data = json.loads(
        run(
            [os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", INVENTORY, "--list"],
            capture=True,
        )
    )
    hostvars = data["_meta"]["hostvars"]
    for group in DEVICE_TYPES:
        for host in data.get(group, {}).get("hosts", []):
            hostvars[host].setdefault("tt_device", group)
    return hostvars


def images(hostvars):
    catalog = load_spec_file(SPEC)
    wanted = set()
    for hv in hostvars.values():
        device = hv.get("tt_device") or ""
        for entry in hv.get("tt_models") or []:
            spec = resolve(catalog, entry["name"], entry.get("device") or device, impl=entry.get("impl"))
            wanted.add(spec["docker_image"])
    return sorted(wanted)


def chat(host):
    """Every instance of a host: its state file, its key (read as root on the host), one chat completion."""
    ip = run(
        ["docker", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", host],
        capture=True,
    ).strip()
    names = run(
        ["docker", "exec", host, "sh", "-c", "ls /var/lib/ttfleet/serve/*.json 2>/dev/null || true"], capture=True
    ).split()
    rows = []
    for path in names:
        state = json.loads(run(["docker", "exec", host, "cat", path], capture=True))
        env = run(["docker", "exec", host, "cat", f"/etc/ttfleet/serve/{state['instance']}.env"], capture=True)
        key = next(
            (line.split("=", 1)[1] for line in env.splitlines() if line.startswith(("VLLM_API_KEY=", "API_KEY="))), ""
        )
        url = f"http://{ip}:{state['port']}/v1/chat/completions"
        body = json.dumps(
            {"model": state["hf_model_repo"], "messages": [{"role": "user", "content": "Say hello to the fleet."}]}
        ).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.load(response)["choices"][0]["message"]["content"]
                code = response.status
        except urllib.error.HTTPError as exc:
            answer, code = exc.reason, exc.code
        except OSError as exc:
            answer, code = str(exc), None
        rows.append((host, state["instance"], state["model"], url, code, " ".join(str(answer).split())[:60]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default=os.environ.get("LAB_HOSTS", "p300x2,n150,n300"))
    args = parser.parse_args()

    step(f"lab hosts {args.hosts} (systemd containers with simulated Tenstorrent boards)")
    python("tests/lab/lab.py", "up", "--hosts", args.hosts)
    hostvars = lab_hosts()
    repos = sorted({"meta-llama/Llama-3.2-1B-Instruct"})
    step(f"Hugging Face mirror (olah) with tiny real models of {', '.join(repos)}")
    python("tests/lab/hf_mirror.py", "start", *[f"--repo={repo}" for repo in repos])
    wanted = images(hostvars)
    step(f"stand-in inference image as {len(wanted)} spec image(s), copied into {len(hostvars)} hosts")
    python(
        "tests/lab/lab.py",
        "serve-image",
        *[f"--tag={image}" for image in wanted],
        *[f"--copy={host}:{ARCHIVE}" for host in sorted(hostvars)],
    )
    step("ansible-playbook site.yml (tt_host -> inference_server -> model_cache -> serve)")
    run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY, "site.yml"])
    step("a chat completion to every served instance, through its published port, with its bearer key")
    rows = [row for host in sorted(hostvars) for row in chat(host)]
    for host, instance, model, url, code, answer in rows:
        print(f"  {host:16} {instance:24} {model:24} {code}  {answer}")
        print(f"  {'':16} {url}")
    step("fleet report (ansible-playbook ttfleet.inference.status)")
    reports = os.path.join(ROOT, "reports")
    run(
        [
            os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
            "-i",
            INVENTORY,
            "playbooks/status.yml",
            "-e",
            f"status_report_dir={reports}",
        ]
    )
    failed = [row for row in rows if row[4] != 200]
    print(f"\nreport: {reports}/fleet-status.html (and fleet-status.json)")
    print(f"{len(rows)} instances answered, {len(failed)} failed; {time.monotonic() - STARTED:.0f} s in all.")
    print("make lab-down removes the lab hosts and the mirror.")
    if failed or not rows:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
