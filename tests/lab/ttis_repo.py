#!/usr/bin/env python
"""A local stand-in for the tt-inference-server (TTIS) git repository, for the lab and molecule only.

Builds, under .cache/ttis-lab/ (reused while its inputs are unchanged):

    tt-inference-server.git        bare repository (`git update-server-info` done, servable over dumb HTTP)
    tt-inference-server.bundle     git bundle of every branch and tag
    tt-inference-server-<tag>.tar.gz  `git archive` of each tag (GitHub layout: one top directory, the
                                      commit id in the pax header, no .git)
    wheels/                        the PyYAML wheel the inference_server role pins, and tt-smi and tt-flash at the
                                   tt_host role's pins with their dependencies, for hosts without PyPI
    manifest.json                  paths, and the commit of every tag and branch

Releases v0.18.0, v0.20.0 and v0.25.0 are tags on release branches of the same name, as upstream does
it; each branch has one more commit after its tag, so a checkout of the branch instead of the tag is
visible (another commit, VERSION ending in "+branch"). Each tagged tree holds the real
release_model_spec.json of that release (tests/fixtures/specs, trimmed of perf_reference), a VERSION
file and tests/lab/files/ttis-run.py as run.py, a LAB STAND-IN that is not tenstorrent's run.py.
Releases v0.20.1 to v0.20.5 are LAB releases that upstream never made (tests/faults' five upgrades in a row):
v0.20.0's spec with every model's version pin, tt_metal_commit and image tag moved on by one step per release
(lab_series_spec), so each upgrade gives every model a new volume and a new kernel cache, as real upgrades do.
Commits have fixed authors and dates, so their ids are the same on every machine.

    tests/lab/ttis_repo.py [--force]     build when missing or stale, print the manifest
"""
import argparse
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, ".cache", "ttis-lab")
SPECS = os.path.join(ROOT, "tests", "fixtures", "specs")
RUN_PY = os.path.join(ROOT, "tests", "lab", "files", "ttis-run.py")
ROLE_DEFAULTS = os.path.join(ROOT, "roles", "inference_server", "defaults", "main.yml")
TT_HOST_DEFAULTS = os.path.join(ROOT, "roles", "tt_host", "defaults", "main.yml")
# Release dates of upstream's tags (v0.25.0: the one the tenstorrent wheel pins).
RELEASES = [
    ("v0.18.0", "2026-07-10T12:00:00Z"),
    ("v0.20.0", "2026-08-14T12:00:00Z"),
    ("v0.25.0", "2026-10-23T12:00:00Z"),
]
# LAB releases derived from v0.20.0 (see lab_series_spec): tags of their own, on top of the real ones.
LAB_SERIES_BASE = "v0.20.0"
LAB_SERIES = [(f"v0.20.{step}", f"2026-08-{14 + step:02d}T12:00:00Z") for step in range(1, 6)]
README = """# tt-inference-server (LAB STAND-IN)

Made by ttfleet.inference's tests/lab/ttis_repo.py for tests. Only release_model_spec.json is real
(tenstorrent/tt-inference-server {tag}); run.py is a stand-in that starts nothing.
"""


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def git(*args, cwd=None, date=None, capture=False):
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "ttfleet lab",
        "GIT_AUTHOR_EMAIL": "lab@ttfleet.invalid",
        "GIT_COMMITTER_NAME": "ttfleet lab",
        "GIT_COMMITTER_EMAIL": "lab@ttfleet.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, text=True, stdout=subprocess.PIPE if capture else None
    )
    return proc.stdout.strip() if capture else None


def role_defaults(path):
    import yaml

    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def lab_series_spec(step):
    """The release_model_spec.json (dict) of LAB release v0.20.<step>: v0.20.0's, with each spec's version pin moved on
    by <step> patch releases, its tt_metal_commit replaced by a digest of the old one and the step, and its image tag
    (``<version>-<tt_metal_commit>-<vllm_commit>``) following both."""
    with gzip.open(os.path.join(SPECS, f"release_model_spec-{LAB_SERIES_BASE}.json.gz"), "rb") as handle:
        spec = json.load(handle)
    spec["release_version"] = f"0.20.{step}"

    def move(node):
        if isinstance(node, dict):
            if isinstance(node.get("tt_metal_commit"), str) and isinstance(node.get("version"), str):
                old_version, old_commit = node["version"], node["tt_metal_commit"]
                parts = old_version.split(".")
                if len(parts) == 3 and all(part.isdigit() for part in parts):
                    node["version"] = f"{parts[0]}.{parts[1]}.{int(parts[2]) + step}"
                node["tt_metal_commit"] = hashlib.sha256(f"{old_commit}-lab-{step}".encode()).hexdigest()[:7]
                image = node.get("docker_image")
                if isinstance(image, str):
                    node["docker_image"] = image.replace(
                        f":{old_version}-{old_commit}-", f":{node['version']}-{node['tt_metal_commit']}-"
                    )
            for value in node.values():
                move(value)
        elif isinstance(node, list):
            for value in node:
                move(value)

    move(spec)
    return spec


def pyyaml_version():
    return str(role_defaults(ROLE_DEFAULTS)["inference_server_pyyaml_version"])


def tool_pins():
    """tt-smi and tt-flash at the tt_host role's default pins (the lab's wheels carry them for offline installs)."""
    defaults = role_defaults(TT_HOST_DEFAULTS)
    return [f"tt-smi=={defaults['tt_host_tt_smi_version']}", f"tt-flash=={defaults['tt_host_tt_flash_version']}"]


def inputs_digest(pyyaml):
    digest = hashlib.sha256()
    paths = [os.path.abspath(__file__), RUN_PY] + [
        os.path.join(SPECS, f"release_model_spec-{tag}.json.gz") for tag, _date in RELEASES
    ]
    for path in paths:
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(pyyaml.encode())
    digest.update(" ".join(tool_pins()).encode())
    return digest.hexdigest()


def write(path, data, mode=0o644):
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def build(work, pyyaml):
    tree = os.path.join(work, "work")
    git("init", "-q", "-b", "main", tree)
    with open(RUN_PY, "rb") as handle:
        run_py = handle.read()
    tags, branches = {}, {}
    series = {tag: step for step, (tag, _date) in enumerate(LAB_SERIES, start=1)}
    # main carries the real releases; the LAB series has a branch of its own from v0.20.0 (lab-series), so that main
    # and every real tag keep the commits they had before it existed.
    for tag, date in RELEASES + LAB_SERIES:
        if tag == LAB_SERIES[0][0]:
            git("checkout", "-q", "-b", "lab-series", f"refs/tags/{LAB_SERIES_BASE}", cwd=tree)
        line = "lab-series" if tag in series else "main"
        version = tag[1:]
        if tag in series:
            data = (json.dumps(lab_series_spec(series[tag]), indent=2, sort_keys=True) + "\n").encode()
        else:
            with gzip.open(os.path.join(SPECS, f"release_model_spec-{tag}.json.gz"), "rb") as handle:
                data = handle.read()
        write(os.path.join(tree, "release_model_spec.json"), data)
        write(os.path.join(tree, "VERSION"), f"{version}\n".encode())
        write(os.path.join(tree, "run.py"), run_py, 0o755)
        write(os.path.join(tree, "README.md"), README.format(tag=tag).encode())
        git("add", "-A", cwd=tree)
        git("commit", "-q", "-m", f"Release {tag} (lab stand-in)", cwd=tree, date=date)
        git("tag", "-a", tag, "-m", f"Release {tag}", cwd=tree, date=date)
        tags[tag] = git("rev-parse", f"refs/tags/{tag}^{{commit}}", cwd=tree, capture=True)
        # The release branch carries the tag's name and moves on after the tag.
        git("checkout", "-q", "-b", tag, cwd=tree)
        write(os.path.join(tree, "VERSION"), f"{version}+branch\n".encode())
        git("commit", "-q", "-am", f"Post-release fix on branch {tag}", cwd=tree, date=date)
        branches[tag] = git("rev-parse", f"refs/heads/{tag}", cwd=tree, capture=True)
        git("checkout", "-q", line, cwd=tree)
    git("checkout", "-q", "main", cwd=tree)
    branches["main"] = git("rev-parse", "refs/heads/main", cwd=tree, capture=True)

    bare = os.path.join(work, "tt-inference-server.git")
    git("clone", "-q", "--bare", tree, bare)
    git("update-server-info", cwd=bare)
    git("bundle", "create", "-q", os.path.join(work, "tt-inference-server.bundle"), "--all", cwd=tree)
    archives = {}
    for tag, _date in RELEASES + LAB_SERIES:
        name = f"tt-inference-server-{tag}.tar.gz"
        git("archive", "--format=tar.gz", f"--prefix=tt-inference-server-{tag[1:]}/", "-o",
            os.path.join(work, name), f"refs/tags/{tag}", cwd=tree)
        archives[tag] = name
    shutil.rmtree(tree)

    wheels = os.path.join(work, "wheels")
    # The lab's hosts are Debian 12 (CPython 3.11) and Debian 13 (CPython 3.13), x86_64; they install from this with
    # --no-index.
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    for python in ("3.11", "3.13"):
        target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                  "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", wheels]
        subprocess.run([*pip, "--no-deps", *target, f"PyYAML=={pyyaml}"], check=True)
        # The tools venv of tt_host with every dependency: scenarios that only need the tools installed
        # (tt_host_pip_extra_args --no-index) skip a minute of PyPI resolution per converge.
        subprocess.run([*pip, *target, *tool_pins()], check=True)
    return {
        "bare": "tt-inference-server.git",
        "bundle": "tt-inference-server.bundle",
        "archives": archives,
        "wheels": "wheels",
        "tags": tags,
        "branches": branches,
        "pyyaml_version": pyyaml,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    args = parser.parse_args()
    # Molecule scenarios run side by side (tests/run-tests.sh): one builds, the others wait and then find it built.
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure(args.force)


def ensure(force):
    pyyaml = pyyaml_version()
    digest = inputs_digest(pyyaml)
    manifest_path = os.path.join(OUT, "manifest.json")
    if not force and os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        if manifest.get("inputs") == digest:
            print(json.dumps(manifest, indent=2))
            return
    log(f"building the lab tt-inference-server repository in {os.path.relpath(OUT, ROOT)}")
    work = OUT + ".tmp"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    manifest = {"inputs": digest, "root": OUT, **build(work, pyyaml)}
    write(os.path.join(work, "manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())
    shutil.rmtree(OUT, ignore_errors=True)
    os.replace(work, OUT)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
