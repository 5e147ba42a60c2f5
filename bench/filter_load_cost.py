#!/usr/bin/env python
"""What a task's worker pays to resolve one of the collection's filters, through ansible-core's own loader.

ansible-playbook forks a worker per task and host, and each worker starts with the plugin caches of the parent. The
first ``ttfleet.inference.<filter>`` a worker's templates name makes ansible-core's Jinja2Loader import every filter
file of the collection (it walks them all: plugins/loader.py, Jinja2Loader.get_with_context), with whatever each file
imports at its top. This script forks --workers children from a process that has loaded Ansible as
ansible-playbook has by its first task (ansible.builtin's filters and the collection's metadata, but no collection
filter: the strategy mostly does not template them), and in each child
times the resolution of --filter, then of a second filter. It prints the median and the 90th percentile in
milliseconds, and the modules of the collection a child had imported afterwards, and writes
bench/results/filter_load_cost.json. Asserts nothing.

    .venv/bin/python bench/filter_load_cost.py [--workers 40] [--filter serve_unit_plan]
"""

import argparse
import os
import statistics
import sys
import time

import _results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTION = "ansible_collections.ttfleet.inference."


def child(names, pipe_w):
    """In a forked worker: resolve each filter name through the filter loader; write the timings and the count of the
    collection's modules then imported."""
    from ansible.plugins.loader import filter_loader

    out = []
    for name in names:
        start = time.perf_counter()
        plugin = filter_loader.get(name)
        out.append(time.perf_counter() - start)
        if plugin is None:
            out[-1] = -1.0
    modules = sorted(m for m in sys.modules if m.startswith(COLLECTION + "plugins.module_utils."))
    os.write(pipe_w, (" ".join(f"{t:.6f}" for t in out) + "\n" + " ".join(modules) + "\n").encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=40)
    parser.add_argument("--filter", default="serve_unit_plan", help="the first filter each worker resolves")
    parser.add_argument("--second", default="weights_round", help="the second filter, from another file")
    args = parser.parse_args()
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(ROOT, ".ansible", "collections"))
    # As ansible-playbook: the CLI's imports and the collection loader installed, before any fork.
    from ansible import context  # noqa: F401
    from ansible.cli.playbook import PlaybookCLI  # noqa: F401
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([os.environ["ANSIBLE_COLLECTIONS_PATH"]])
    # What the parent of the workers has loaded by the first task: ansible.builtin's filters (its own templates use
    # them) and the collection's metadata (it resolved the modules of the play's tasks).
    from ansible.plugins.loader import filter_loader, module_loader

    filter_loader.get("ansible.builtin.to_json")
    module_loader.find_plugin("ttfleet.inference.model_weights")
    names = [f"ttfleet.inference.{args.filter}", f"ttfleet.inference.{args.second}"]
    first, second, modules = [], [], set()
    for _worker in range(args.workers):
        pipe_r, pipe_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(pipe_r)
            try:
                child(names, pipe_w)
            finally:
                os._exit(0)
        os.close(pipe_w)
        with os.fdopen(pipe_r) as handle:
            timings, imported = handle.read().split("\n")[:2]
        os.waitpid(pid, 0)
        one, two = (float(t) for t in timings.split())
        if one < 0 or two < 0:
            sys.exit(f"the filter loader did not find {names}: is ANSIBLE_COLLECTIONS_PATH the checkout's?")
        first.append(one * 1000)
        second.append(two * 1000)
        modules.update(imported.split())

    def summary(values):
        ordered = sorted(values)
        return {
            "median_ms": round(statistics.median(ordered), 2),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        }

    result = {
        **_results.stamp(),
        "workers": args.workers,
        "first_filter": names[0],
        "first": summary(first),
        "second_filter": names[1],
        "second": summary(second),
        "module_utils_imported": len(modules),
    }
    print(
        f"{names[0]} in a fresh worker: median {result['first']['median_ms']} ms (p90 {result['first']['p90_ms']}); "
        f"then {names[1]}: median {result['second']['median_ms']} ms; {len(modules)} module_utils modules imported"
    )
    _results.write(os.path.join(ROOT, "bench", "results", "filter_load_cost.json"), result)


if __name__ == "__main__":
    main()
