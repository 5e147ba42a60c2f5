#!/usr/bin/env python
"""How fast disk_prune's engine sizes and removes a volume, and how long a 62 GB QuietBox 2 volume would take.

Builds, under --dir, a volume of --files small files (a kernel cache: 64 bytes each, 100 per directory) and 17 sparse
weight shards of --shard-gib GiB, and a volume holding one dense file of --dense-mib MiB (real extents to free), then
times the engine's own steps on each: ``usage`` (the hardlink-aware size walk), the rename into the root-only trash,
and ``empty`` (the fd-relative removal). Prints entries/s and bytes/s, and projects a 62 GB volume of the QuietBox 2
mix (--qb2-files kernel-cache files, 62 GB of data) from the two rates. Writes bench/results/prune_removal.json;
asserts nothing.

    bench/prune_removal.py [--dir /var/tmp/ttfleet-bench] [--files 200000] [--dense-mib 2048]
"""

import argparse
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import stamp, write

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import (
    empty,
    open_trash,
    to_trash,
    usage,
)

NAME = "volume_id_tt_transformers-Qwen3-32B-v0.14.0"
GIB = 1 << 30


def build(volume, files, shards, shard_bytes):
    cache = os.path.join(volume, "tt_metal_cache", "cache_Qwen3-32B", "P300x2")
    for index in range(files):
        sub = os.path.join(cache, f"k{index // 100:05d}")
        if index % 100 == 0:
            os.makedirs(sub)
        with open(os.path.join(sub, f"t{index:06d}.bin"), "wb") as handle:
            handle.write(b"k" * 64)
    weights = os.path.join(volume, "weights", "Qwen3-32B")
    os.makedirs(weights)
    for index in range(1, shards + 1):
        with open(os.path.join(weights, f"model-{index:05d}-of-{shards:05d}.safetensors"), "wb") as handle:
            handle.truncate(shard_bytes)


def build_dense(volume, dense_bytes):
    os.makedirs(volume)
    block = os.urandom(1 << 20)
    with open(os.path.join(volume, "dense.bin"), "wb") as handle:
        for _mib in range(dense_bytes >> 20):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())


def measure(root, name):
    """``(usage, size walk s, rename s, removal s, freed bytes, pending)`` of the engine on ``root/name``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found, size_s = timed(lambda: usage(fd, name, root))
        trash = open_trash(fd, root, create=True)
        try:
            moved, rename_s = timed(lambda: to_trash(fd, name, trash, "volumes"))
            (_done, pending, freed, _problems), remove_s = timed(lambda: empty(trash, [moved], None))
        finally:
            os.close(trash)
    finally:
        os.close(fd)
    return found, size_s, rename_s, remove_s, freed, pending


def timed(func):
    started = time.monotonic()
    value = func()
    return value, time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/var/tmp/ttfleet-bench")
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--shard-gib", type=float, default=3.6)
    parser.add_argument("--dense-mib", type=int, default=2048)
    parser.add_argument("--qb2-files", type=int, default=60_000, help="kernel-cache files in a QuietBox 2 volume")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "prune_removal.json"))
    args = parser.parse_args()

    root = os.path.join(args.dir, "prune-removal")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    _built, build_s = timed(lambda: build(os.path.join(root, NAME), args.files, 17, int(args.shard_gib * GIB)))
    found, size_s, rename_s, remove_s, _freed, pending = measure(root, NAME)
    build_dense(os.path.join(root, NAME + "-dense"), args.dense_mib << 20)
    _dense, _dense_size_s, _rename, dense_s, dense_freed, dense_pending = measure(root, NAME + "-dense")
    shutil.rmtree(root, ignore_errors=True)
    entries = found.entries
    per_entry = (size_s + remove_s) / entries
    per_byte = dense_s / max(dense_freed, 1)
    qb2_entries = args.qb2_files + args.qb2_files // 100 + 30
    projected = qb2_entries * per_entry + 62e9 * per_byte
    result = {
        **stamp(),
        "entries": entries,
        "build_s": round(build_s, 2),
        "size_walk_s": round(size_s, 3),
        "size_walk_entries_per_s": round(entries / size_s),
        "rename_s": round(rename_s, 6),
        "remove_s": round(remove_s, 3),
        "remove_entries_per_s": round(entries / remove_s),
        "dense_bytes": dense_freed,
        "dense_remove_s": round(dense_s, 4),
        "dense_remove_bytes_per_s": round(dense_freed / max(dense_s, 1e-9)),
        "qb2_files": args.qb2_files,
        "qb2_62gb_projection_s": round(projected, 1),
        "pending": len(pending) + len(dense_pending),
    }
    print(f"built {entries} entries ({args.files} small files, 17 sparse shards) in {build_s:.1f} s")
    print(f"size walk: {size_s:.2f} s, {entries / size_s:,.0f} entries/s (hardlink-aware, no link followed)")
    print(f"rename into the trash: {rename_s * 1000:.2f} ms")
    print(f"removal: {remove_s:.2f} s, {entries / remove_s:,.0f} entries/s")
    rate = dense_freed / max(dense_s, 1e-9) / 1e9
    print(f"dense file: {dense_freed / 2**20:.0f} MiB freed in {dense_s:.3f} s, {rate:.1f} GB/s")
    print(
        f"a 62 GB QuietBox 2 volume ({args.qb2_files} kernel-cache files, 62 GB of weights): about {projected:.0f} s "
        "to size and remove (default time_limit 900 s)"
    )
    write(args.out, result)


if __name__ == "__main__":
    main()
