"""A host's long life (issue 33): five upgrades in a row on one host, across the lab's LAB releases v0.20.1 to v0.20.5
(tests/lab/ttis_repo.py: every model's version pin and tt_metal_commit move on with each), so that every upgrade
gives the served model a new volume (weights hardlinked) and a new kernel cache.

Two n150 lab hosts side by side, each with its volume root on a tmpfs of its own (a disk whose use is exact):
- ft-n150-7 upgrades with upgrade_prune: true: after each upgrade the volume root holds no more than the current and
  the previous release's need (the weights once, two kernel caches), and a rollback after the last prune serves;
- ft-n150-8 upgrades without prune, with a disk margin that its third new kernel cache breaks: the preflight of its
  fourth upgrade refuses, and its message names the bytes prune would reclaim and the command; that command then
  reclaims them and the upgrade goes through.
The lab stand-in compiles nothing: after each start the case writes KERNEL_MIB of "compiled kernels" into the tensor
cache the server uses, as the container user, where a real server's first start would (LAB STAND-IN of that step).
The disk curve goes to tests/output/faults/long-life.json (docs/benchmarks.md, "Disk over five upgrades").
"""

from __future__ import annotations

import gzip
import json
import os
import re

import lab as labmod
import pytest
from conftest import OUT, ROOT, finish_playbook, host_sh, log, run_playbook, sh, start_playbook
from ttis_repo import LAB_SERIES, LAB_SERIES_BASE, lab_series_spec

pytestmark = pytest.mark.faults

PRUNED = "ft-n150-7"
UNPRUNED = "ft-n150-8"
KERNEL_MIB = 512
TMPFS_MIB = 3840
SITE = os.path.join(ROOT, "playbooks", "site.yml")
UPGRADE = os.path.join(ROOT, "playbooks", "upgrade.yml")
ROLLBACK = os.path.join(ROOT, "playbooks", "rollback.yml")
PRUNE = os.path.join(ROOT, "playbooks", "prune.yml")
ROOT_DIR = "/var/lib/tt-cache"
MODEL_KEY = ("meta-llama/Llama-3.2-1B-Instruct", "N150", "vLLM", "tt_transformers")
MIB = 1 << 20
GIB = 1 << 30


def series_images():
    """The n150 Llama-3.2-1B-Instruct image of v0.20.0 and of each LAB release after it."""
    base = os.path.join(ROOT, "tests", "fixtures", "specs", f"release_model_spec-{LAB_SERIES_BASE}.json.gz")
    with gzip.open(base) as handle:
        specs = [json.load(handle)] + [lab_series_spec(step) for step in range(1, len(LAB_SERIES) + 1)]
    images = []
    for spec in specs:
        node = spec["model_specs"]
        for key in MODEL_KEY:
            node = node[key]
        images.append(node["docker_image"])
    return images


def disk(host):
    """(bytes used on the volume root's tmpfs, volume directories, kernel-cache bytes under them)."""
    used = int(host_sh(host, f"df -B1 --output=used {ROOT_DIR} | tail -1").stdout.strip())
    names = host_sh(host, f"find {ROOT_DIR} -mindepth 1 -maxdepth 1 -name 'volume_id_*' -printf '%f\\n'").stdout.split()
    return used, sorted(names)


def compile_kernels(host):
    """LAB STAND-IN of a first start's kernel compile: KERNEL_MIB in the tensor cache of the running volume."""
    state = json.loads(host_sh(host, "cat /var/lib/ttfleet/serve/*.json").stdout)
    found = host_sh(host, f"find {state['volume']}/tt_metal_cache -name lab-standin-kernels.txt")
    marker = (found.stdout.split() or [""])[0]
    assert marker, f"{host}: the stand-in wrote no kernels file under {state['volume']}"
    target = os.path.join(os.path.dirname(marker), "lab-compiled-kernels.bin")
    host_sh(
        host,
        f"[ -e {target} ] || setpriv --reuid 1000 --regid 1000 --clear-groups "
        f"dd if=/dev/zero of={target} bs=1M count={KERNEL_MIB} status=none",
    )
    return state


def release_of(host):
    return os.path.basename(host_sh(host, "readlink /opt/tt-inference-server/current", check=False).stdout.strip())


def health_of(host):
    state = json.loads(host_sh(host, "cat /var/lib/ttfleet/serve/*.json").stdout)
    return host_sh(
        host, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{state['port']}/health", check=False
    ).stdout.strip()


def write_host_vars(host, values):
    path = os.path.join(OUT, "inventory", "host_vars", f"{host}.yml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("---\n" + "".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))


@pytest.mark.slow
@pytest.mark.case("five upgrades in a row, with and without prune")
def test_five_upgrades(lab, case):
    case.expected = (
        f"with upgrade_prune the volume root of {PRUNED} stays within the current and previous release's need after "
        f"each of five upgrades, and a rollback after the prune serves; without it, the preflight of {UNPRUNED}'s "
        "fourth upgrade refuses and names the bytes prune would reclaim and the command, which then frees them"
    )
    hosts = {PRUNED: "n150", UNPRUNED: "n150"}
    lab.add_hosts(hosts)
    curve = {"kernel_mib": KERNEL_MIB, "tmpfs_mib": TMPFS_MIB, PRUNED: [], UNPRUNED: []}
    try:
        images = series_images()
        labmod.SERVE_IMAGE_CACHE = os.path.join(OUT, "serve-image")
        with labmod.cache_lock("serve-image"):
            tarball = labmod.serve_image(images)
        for host in hosts:
            host_sh(
                host,
                f"mkdir -p /var/lib/ttfleet-lab {ROOT_DIR} && mount -t tmpfs -o size={TMPFS_MIB}m,mode=0755 "
                f"tmpfs {ROOT_DIR}",
            )
            sh("docker", "cp", tarball, f"{host}:/var/lib/ttfleet-lab/serve-image.tar")
        write_host_vars(PRUNED, {"upgrade_prune": True, "tt_host_disk_margin_gb": 0})
        write_host_vars(UNPRUNED, {"upgrade_prune": False, "tt_host_disk_margin_gb": 0})
        limit = ",".join(hosts)
        # The first fetch: the spec's min_disk_gb (22 GB for a first download) does not fit the tmpfs, and the lab's
        # model is tiny; the upgrades after it fetch nothing and check only the margin.
        checks = {
            "device_type": "fail",
            "hugepages": "fail",
            "hugepages_pages": "warn",
            "docker": "fail",
            "disk": "warn",
            "ram": "fail",
            "firmware": "fail",
            "kmd": "fail",
        }
        run = run_playbook(
            "long-life-site",
            SITE,
            {"inference_server_version": LAB_SERIES_BASE, "serve_start_timeout": 300, "tt_host_checks": checks},
            limit=limit,
        )
        assert run.rc == 0, f"site.yml failed: {run.messages()[:3]}"
        for host in hosts:
            compile_kernels(host)
            curve[host].append({"release": LAB_SERIES_BASE, "used": disk(host)[0], "volumes": disk(host)[1]})
        weights = curve[PRUNED][0]["used"] - KERNEL_MIB * MIB
        # The unpruned host's margin, in whole GB as the role takes it: its third new kernel cache leaves less free
        # space than this, its second does not (with room to spare: the preflight rounds free space to 0.01 GB).
        free_after = [TMPFS_MIB * MIB - curve[UNPRUNED][0]["used"] - n * KERNEL_MIB * MIB for n in (2, 3)]
        margin = round(sum(free_after) / 2 / GIB)
        assert free_after[1] + 0.1 * GIB < margin * GIB < free_after[0] - 0.1 * GIB, (free_after, margin)
        write_host_vars(UNPRUNED, {"upgrade_prune": False, "tt_host_disk_margin_gb": margin})
        refused = None
        for step, (tag, _date) in enumerate(LAB_SERIES, start=1):
            procs = {
                host: start_playbook(
                    f"long-life-{host}-{tag}",
                    UPGRADE,
                    {"inference_server_version": tag, "serve_start_timeout": 300},
                    limit=host,
                )
                for host in hosts
                if host == PRUNED or refused is None
            }
            runs = {host: finish_playbook(proc, timeout=1200) for host, proc in procs.items()}
            assert runs[PRUNED].rc == 0, f"{PRUNED} upgrade to {tag} failed: {runs[PRUNED].messages()[:3]}"
            compile_kernels(PRUNED)
            used, names = disk(PRUNED)
            curve[PRUNED].append({"release": tag, "used": used, "volumes": names})
            log(f"{PRUNED} on {tag}: {used / MIB:.0f} MiB used, volumes {names}")
            if UNPRUNED in runs:
                if runs[UNPRUNED].rc == 0:
                    compile_kernels(UNPRUNED)
                    used, names = disk(UNPRUNED)
                    curve[UNPRUNED].append({"release": tag, "used": used, "volumes": names})
                else:
                    refused = (step, tag, " ".join(runs[UNPRUNED].messages()))
        # The pruned host: the weights once and two kernel caches (current, previous), plus manifests and the
        # stand-in's small files; never a third cache.
        bound = weights + 2 * KERNEL_MIB * MIB + 16 * MIB
        over = [point for point in curve[PRUNED][1:] if point["used"] > bound or len(point["volumes"]) > 2]
        # A rollback after the last prune: the previous release's volume and cache were kept.
        back = run_playbook("long-life-rollback", ROLLBACK, {"serve_start_timeout": 300}, limit=PRUNED)
        rolled = (back.rc, release_of(PRUNED), health_of(PRUNED))
        # Without prune: the refusal names the reclaimable bytes and the command; running it frees them.
        assert refused is not None, f"{UNPRUNED} was never refused: {curve[UNPRUNED]}"
        before_prune = disk(UNPRUNED)[0]
        pruned = run_playbook("long-life-prune", PRUNE, {}, limit=UNPRUNED)
        after_prune = disk(UNPRUNED)[0]
        retry = run_playbook(
            f"long-life-{UNPRUNED}-retry",
            UPGRADE,
            {"inference_server_version": refused[1], "serve_start_timeout": 300},
            limit=UNPRUNED,
        )
        curve["unpruned_refused_at"] = refused[1]
        curve["unpruned_prune"] = {"before": before_prune, "after": after_prune, "retry_rc": retry.rc}
        with open(os.path.join(OUT, "long-life.json"), "w", encoding="utf-8") as handle:
            json.dump(curve, handle, indent=2)
        said = re.sub(r"\s+", " ", refused[2])[:300]
        points = ", ".join(f"{p['release']} {p['used'] / MIB:.0f}" for p in curve[PRUNED])
        case.observed = (
            f"{PRUNED} MiB used: {points} (bound {bound / MIB:.0f}); rollback rc {rolled[0]}, on {rolled[1]}, health "
            f"{rolled[2]}; {UNPRUNED} refused at upgrade {refused[0]} ({refused[1]}): "
            f"{said}; prune {before_prune / MIB:.0f} -> {after_prune / MIB:.0f} MiB, "
            f"retry rc {retry.rc}"
        )
        assert not over, f"{PRUNED} held more than the current and previous release's need: {over}"
        assert rolled == (0, LAB_SERIES[-2][0], "200"), rolled
        assert refused[0] == 4, refused
        assert "ttfleet.inference.prune" in refused[2] and UNPRUNED in refused[2], refused[2]
        assert re.search(r"reclaim\w*\D{0,40}\d", refused[2]), refused[2]
        assert pruned.rc == 0 and before_prune - after_prune >= KERNEL_MIB * MIB, (pruned.rc, before_prune, after_prune)
        assert retry.rc == 0, retry.messages()[:3]
    finally:
        for host in hosts:
            path = os.path.join(OUT, "inventory", "host_vars", f"{host}.yml")
            if os.path.exists(path):
                os.unlink(path)
        lab.remove_hosts(list(hosts))
