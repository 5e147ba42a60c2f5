#!/usr/bin/env python
"""What ansible-playbook pays, once per run, to build the AnsiballZ payload of each module a play calls.

The first task that calls a module makes its worker build the module's payload: ansible-core's ``recursive_finder``
parses the module and every module_utils file it reaches (``compile(..., PyCF_ONLY_AST)``) and zips them. The payload
is cached for the rest of the run only (in the run's own local temporary directory), so every run pays this for
every distinct module it calls, whatever the host count: at three hosts it weighs on each host's share of a re-run, at
a thousand it is nothing.

This script builds each module's payload with ansible-core's own ``recursive_finder``, each time in a freshly forked
child of a process that has loaded Ansible (as a worker of ansible-playbook would), --reps times, and prints the
median CPU milliseconds, the module_utils files and the source bytes of each payload, and their sum. The modules:
those whose payload a -vvv log of ansible-playbook shows it used (``--log``, the lines "Using module file ..."), or
by default those the collection's roles and playbooks call by name. Writes bench/results/module_build_cost.json.
Asserts nothing.

    .venv/bin/python bench/module_build_cost.py [--log run-vvv.log] [--reps 3]
"""

import argparse
import datetime
import glob
import io
import os
import re
import statistics
import sys
import time
import zipfile

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Actions that run on the controller only: no payload to build.
CONTROLLER_ONLY = {
    "assert",
    "debug",
    "fail",
    "set_fact",
    "set_stats",
    "include_tasks",
    "import_tasks",
    "include_role",
    "import_role",
    "meta",
    "pause",
    "script",
    "reboot",
}
# What the copy and template actions run on the host.
ACTION_MODULES = {"copy": ["stat", "copy", "file"], "template": ["stat", "copy", "file"]}


def named_modules():
    """The modules the collection's roles and playbooks call by their FQCN."""
    found = set()
    pattern = re.compile(r"^\s*-?\s*(ansible\.builtin|ttfleet\.inference)\.([a-z_]+):", re.M)
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")) + glob.glob(
        os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True
    ):
        with open(path, encoding="utf-8") as handle:
            for namespace, name in pattern.findall(handle.read()):
                if name in CONTROLLER_ONLY:
                    continue
                for module in ACTION_MODULES.get(name, [name]) if namespace == "ansible.builtin" else [name]:
                    found.add((namespace, module))
    return sorted(found)


def logged_modules(path):
    """The modules a -vvv log of ansible-playbook says it used."""
    found = set()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for source in re.findall(r"Using module file (\S+\.py)", handle.read()):
            name = os.path.basename(source)[:-3]
            namespace = "ansible.builtin" if "/ansible/modules/" in source else "ttfleet.inference"
            found.add((namespace, name))
    return sorted(found)


def module_path(namespace, name):
    if namespace == "ansible.builtin":
        import ansible.modules

        return os.path.join(os.path.dirname(ansible.modules.__file__), name + ".py")
    return os.path.join(ROOT, ".ansible", "collections", "ansible_collections", "ttfleet", "inference", "plugins",
                        "modules", name + ".py")  # fmt: skip


def build(namespace, name, pipe_w):
    """In a forked child: build the payload of one module as ansible-core does; write CPU seconds, files, bytes."""
    from ansible._internal._ansiballz import _builder
    from ansible._internal._datatag._tags import Origin
    from ansible.executor import module_common

    path = module_path(namespace, name)
    with open(path, "rb") as handle:
        data = handle.read()
    if namespace == "ansible.builtin":
        fqn = f"ansible.modules.{name}"
    else:
        fqn = f"ansible_collections.ttfleet.inference.plugins.modules.{name}"
    archive = zipfile.ZipFile(io.BytesIO(), "w", compression=zipfile.ZIP_DEFLATED)
    extensions = _builder.ExtensionManager.create(task_vars={})
    start = time.process_time()
    module_common.recursive_finder(
        name, fqn, Origin(path=path).tag(data), archive, datetime.datetime.now(datetime.timezone.utc), extensions
    )
    spent = time.process_time() - start
    files = archive.infolist()
    os.write(pipe_w, f"{spent:.6f} {len(files)} {sum(f.file_size for f in files)}\n".encode())


def measure(namespace, name):
    pipe_r, pipe_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(pipe_r)
        try:
            build(namespace, name, pipe_w)
        finally:
            os._exit(0)
    os.close(pipe_w)
    with os.fdopen(pipe_r) as handle:
        text = handle.read().split()
    os.waitpid(pid, 0)
    if len(text) != 3:
        sys.exit(f"building {namespace}.{name} failed (is ANSIBLE_COLLECTIONS_PATH the checkout's?)")
    return float(text[0]), int(text[1]), int(text[2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", help="a -vvv log of ansible-playbook: measure the modules it used")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(ROOT, ".ansible", "collections"))
    from ansible.cli.playbook import PlaybookCLI  # noqa: F401
    from ansible.executor import module_common  # noqa: F401
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([os.environ["ANSIBLE_COLLECTIONS_PATH"]])
    modules = logged_modules(args.log) if args.log else named_modules()
    if not modules:
        sys.exit(f"no module found{' in ' + args.log if args.log else ''}: a -vvv log says 'Using module file ...'")
    rows = []
    for namespace, name in modules:
        runs = [measure(namespace, name) for _rep in range(args.reps)]
        rows.append(
            {
                "module": f"{namespace}.{name}",
                "cpu_ms": round(statistics.median(r[0] for r in runs) * 1000, 1),
                "files": runs[0][1],
                "source_kb": round(runs[0][2] / 1024),
            }
        )
        print(f"{rows[-1]['module']:40} {rows[-1]['cpu_ms']:7.1f} ms {rows[-1]['files']:4} files "
              f"{rows[-1]['source_kb']:5} KB")  # fmt: skip
    total = round(sum(r["cpu_ms"] for r in rows) / 1000, 2)
    print(f"{len(rows)} modules: {total} CPU-s per run to build their payloads")
    result = {**_results.stamp(), "source": args.log or "roles and playbooks", "modules": rows, "total_cpu_s": total}
    _results.write(os.path.join(ROOT, "bench", "results", "module_build_cost.json"), result)


if __name__ == "__main__":
    main()
