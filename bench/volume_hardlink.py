#!/usr/bin/env python
"""What it costs to give a new model version its own kernel cache: a volume whose weights are hardlinks of the old one.

Builds, under --dir, an old volume shaped like Qwen3-32B's on a QuietBox 2 (17 safetensors shards of --shard-gib GiB
as sparse files, tokenizer and config files, and a kernel cache of --cache-files files), then measures
``plan_hardlink`` + ``apply_hardlink`` (the work of ``volume_alias link: hardlink``) and a converged re-plan, and
reports the disk blocks of the inodes the new volume does not share with the old one: its directories and record.
Prints numbers and writes bench/results/volume_hardlink.json; asserts nothing.

    bench/volume_hardlink.py [--dir /var/tmp/ttfleet-bench] [--runs 5]
"""

import argparse
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import stamp, write

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import (
    apply_hardlink,
    plan_hardlink,
)

MODEL = "Qwen3-32B"
OLD = f"volume_id_tt_transformers-{MODEL}-v0.14.0"
NEW = f"volume_id_tt_transformers-{MODEL}-v0.17.0"


def build_old_volume(root, shards, shard_bytes, cache_files):
    volume = os.path.join(root, OLD)
    weights = os.path.join(volume, "weights", MODEL)
    os.makedirs(weights)
    for index in range(1, shards + 1):
        with open(os.path.join(weights, f"model-{index:05d}-of-{shards:05d}.safetensors"), "wb") as handle:
            handle.truncate(shard_bytes)  # sparse: the size of a shard without its disk use
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        with open(os.path.join(weights, name), "w") as handle:
            handle.write("{}\n")
    cache = os.path.join(volume, "tt_metal_cache", f"cache_{MODEL}", "P300x2")
    os.makedirs(cache)
    for index in range(cache_files):
        with open(os.path.join(cache, f"tensor_{index:06d}.bin"), "wb") as handle:
            handle.write(b"k" * 64)
    return volume


def inodes(path):
    found = {}
    for current, dirs, names in os.walk(path):
        for name in dirs + names:
            st = os.lstat(os.path.join(current, name))
            found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    st = os.lstat(path)
    found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return found


def new_disk_bytes(new, old):
    """Disk blocks of the inodes the new volume does not share with the old one (its directories, its record)."""
    shared = inodes(old)
    return sum(size for key, size in inodes(new).items() if key not in shared)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/var/tmp/ttfleet-bench")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shards", type=int, default=17)
    parser.add_argument("--shard-gib", type=float, default=3.6)
    parser.add_argument("--cache-files", type=int, default=5000)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "volume_hardlink.json"))
    args = parser.parse_args()

    work = os.path.join(args.dir, f"volume-hardlink-{os.getpid()}")
    os.makedirs(work)
    try:
        old = build_old_volume(work, args.shards, int(args.shard_gib * (1 << 30)), args.cache_files)
        new = os.path.join(work, NEW)
        create_s, replan_s, gained = [], [], []
        for _run in range(args.runs):
            if os.path.lexists(new):
                shutil.rmtree(new)
            started = time.perf_counter()
            plan = plan_hardlink(new, old, tt_metal_commit="b204341")
            apply_hardlink(plan)
            create_s.append(time.perf_counter() - started)
            gained.append(new_disk_bytes(new, old))
            started = time.perf_counter()
            again = plan_hardlink(new, old, tt_metal_commit="b204341")
            replan_s.append(time.perf_counter() - started)
            assert again["action"] == "none"
        result = {
            **stamp(),
            "volume": {
                "files_linked": plan["files"],
                "bytes_shared": plan["bytes"],
                "kernel_cache_files_left_behind": args.cache_files,
            },
            "runs": args.runs,
            "create_s_median": round(statistics.median(create_s), 4),
            "create_s_max": round(max(create_s), 4),
            "converged_replan_s_median": round(statistics.median(replan_s), 5),
            "disk_bytes_gained_median": int(statistics.median(gained)),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gib = result["volume"]["bytes_shared"] / (1 << 30)
    print(
        f"hardlinked volume: {result['volume']['files_linked']} files, {gib:.1f} GiB shared, "
        f"created in {result['create_s_median'] * 1000:.1f} ms (median of {args.runs}, max "
        f"{result['create_s_max'] * 1000:.1f} ms); converged re-plan "
        f"{result['converged_replan_s_median'] * 1000:.2f} ms; new disk blocks {result['disk_bytes_gained_median']} "
        "bytes (directories and record); the old kernel cache "
        f"({args.cache_files} files) was not linked"
    )
    write(args.out, result)


if __name__ == "__main__":
    main()
