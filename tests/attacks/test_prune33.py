"""Issue 33: disk_prune, the root-run removal engine, against a hostile uid 1000 that owns the volume root and the
trees below the volumes (the kernel caches the server writes). Nothing outside the roots is touched, nothing
blocks, and every refusal names the path."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from conftest import MESH, MODEL, TIMEOUT, as_attacker, attacker, attacker_python

# The safe-file layer's MAX_TREE_DEPTH (plugins/module_utils/_fs/trees.py); the suite does not import the collection.
MAX_TREE_DEPTH = 400

OLD = f"volume_id_tt_transformers-{MODEL}-v0.14.0"
NEW = f"volume_id_tt_transformers-{MODEL}-v0.19.0"
TRASH = ".ttfleet-prune"

# A loop run as uid 1000 with its working directory inside the tree being removed (so the rename into root's trash
# does not take it away): it swaps NAME, a real directory, with a link to TARGET and back, atomically
# (renameat2 RENAME_EXCHANGE), as fast as it can, and makes a new directory whenever root removed the last one.
DIRSWAP = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
os.chdir(sys.argv[1])
name, target, until = sys.argv[2], sys.argv[3], time.monotonic() + float(sys.argv[4])
link = name.encode() + b".link"
flips = 0
while time.monotonic() < until:
    try:
        here, there = os.path.lexists(name), os.path.lexists(link)
        if not here and not there:
            os.symlink(target, link)
            os.mkdir(name)
        elif not here:
            os.mkdir(name) if os.path.islink(link) else os.symlink(target, name)
        elif not there:
            os.mkdir(link) if os.path.islink(name) else os.symlink(target, link)
        for _ in range(200):
            if libc.renameat2(AT_FDCWD, name.encode(), AT_FDCWD, link, RENAME_EXCHANGE) == 0:
                flips += 1
    except OSError:
        time.sleep(0.0005)
print(flips)
"""


def _volume(arena, name, owner=0):
    """A volume root-owned at its top (as the collection makes it) whose tensor caches are uid 1000's."""
    top = arena.root / name
    arena.mkdirs(top, owner=owner)
    cache = top / "tt_metal_cache" / f"cache_{MODEL}" / MESH
    arena.mkdirs(cache)
    arena.write(cache / "kernels" / "k.bin", os.urandom(4096))
    return top


def _prune(arena, check_mode=False, **extra):
    args = {
        "volume_root": str(arena.root),
        "needed_volumes": [NEW],
        "release_root": str(arena.private / "releases"),
        "report_file": str(arena.private / "prune" / "report.json"),
        "peer_run_dir": str(arena.private / "run"),
        "kinds": ["volumes", "kernel_caches", "staging", "spool"],
        **extra,
    }
    return arena.module("disk_prune", args, check_mode=check_mode, timeout=TIMEOUT)


def _items(result):
    return {item["name"]: item for item in result["items"]}


def test_links_planted_in_a_volume_are_removed_as_links_and_their_targets_stay(arena):
    old = _volume(arena, OLD)
    _volume(arena, NEW)
    cache = old / "tt_metal_cache" / f"cache_{MODEL}" / MESH
    attacker("ln", "-s", arena.victim, cache / "kernels" / "victim-file")
    attacker("ln", "-s", arena.victim_dir, cache / "victim-dir")
    aside = arena.root / NEW / "tt_metal_cache" / f"cache_{MODEL}" / f"{MESH}.ttfleet-aside-20261201T000000Z"
    arena.mkdirs(aside)
    attacker("ln", "-s", arena.victim_dir, aside / "into-victim")
    result = _prune(arena)
    assert not result.failed and not result.timed_out, result
    arena.assert_victims_intact()
    assert not old.exists() and not aside.exists() and not (arena.root / TRASH).exists()
    assert result["reclaimed_bytes"] >= 4096
    # The uid 1000 volume of the arena (not root's at its top) is left alone, named.
    assert (arena.volume).is_dir()
    assert _items(result)[arena.volume.name]["note"].startswith(f"{arena.volume} is owned by uid 1000, not root")


def test_an_alias_or_a_staging_link_to_outside_is_never_entered(arena):
    _volume(arena, NEW)
    attacker("ln", "-s", arena.victim_dir, arena.root / f"volume_id_tt_transformers-{MODEL}-v0.15.0")
    attacker("ln", "-s", arena.victim_dir, arena.root / ".ttfleet-staging")
    spool = arena.private / "spool"
    arena.mkdirs(spool / MODEL / MESH, owner=0)
    os.symlink(arena.victim_dir, spool / MODEL / MESH / "tt_transformers")
    result = _prune(arena, spool_dirs=[str(spool)])
    assert not result.failed and not result.timed_out, result
    arena.assert_victims_intact()
    assert not os.path.lexists(arena.root / f"volume_id_tt_transformers-{MODEL}-v0.15.0")
    assert any(f"{arena.root}/.ttfleet-staging: is a symlink, not a directory" in m for m in result["left_alone"])
    assert (
        f"{spool}/{MODEL}/{MESH}/tt_transformers is a symlink where a spool directory belongs; left alone"
        in (result["left_alone"])
    )


def test_a_directory_swapped_for_a_link_during_removal_never_leads_outside(arena):
    old = _volume(arena, OLD)
    _volume(arena, NEW)
    cache = old / "tt_metal_cache" / f"cache_{MODEL}" / MESH
    for n in range(3000):
        (cache / "kernels" / f"k{n}").write_bytes(b"k" * 64)
    arena.give(cache)
    loop = subprocess.Popen(
        as_attacker([attacker_python(), "-I", "-c", DIRSWAP, str(cache), "swapped", str(arena.victim_dir), "6"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    results = []
    try:
        time.sleep(0.5)
        # The first run renames the volume into root's trash; the loop goes on inside it while runs remove it.
        while loop.poll() is None and len(results) < 20:
            results.append(_prune(arena))
        flips = int(loop.communicate(timeout=TIMEOUT)[0] or 0)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.communicate()
    arena.assert_victims_intact()
    assert all(not r.timed_out and not r.failed for r in results), results
    assert flips > 100 and len(results) > 1, (flips, len(results))
    assert not old.exists()
    # With the loop stopped, the next run finishes what it left.
    final = _prune(arena)
    assert final["pending"] == [] and not (arena.root / TRASH).exists(), final


def test_fifos_are_skipped_at_the_top_and_unlinked_below_without_blocking(arena):
    old = _volume(arena, OLD)
    _volume(arena, NEW)
    fifo_volume = arena.root / f"volume_id_tt_transformers-{MODEL}-v0.16.0"
    attacker("mkfifo", fifo_volume)
    attacker("mkfifo", old / "tt_metal_cache" / f"cache_{MODEL}" / MESH / "kernels" / "pipe")
    aside = arena.root / NEW / "tt_metal_cache" / f"cache_{MODEL}" / f"{MESH}.ttfleet-aside-20261201T000000Z"
    attacker("mkfifo", aside)
    started = time.monotonic()
    result = _prune(arena)
    assert not result.failed and not result.timed_out and time.monotonic() - started < 15, result
    items = _items(result)
    assert items[fifo_volume.name]["action"] == "skip"
    assert items[fifo_volume.name]["note"] == f"{fifo_volume} is a fifo, not a directory; it is left alone"
    aside_item = next(item for item in result["items"] if item["kind"] == "kernel_caches")
    assert aside_item["note"] == f"{aside} is a fifo, not a directory; it is left alone"
    assert not old.exists() and fifo_volume.exists() and aside.exists()


def test_a_tree_deeper_than_the_layer_allows_is_refused_whole_naming_it(arena):
    old = _volume(arena, OLD)
    _volume(arena, NEW)
    top = old / "tt_metal_cache" / f"cache_{MODEL}" / MESH
    # Built by uid 1000, one level at a time from its working directory.
    script = f"import os\nfor _ in range({MAX_TREE_DEPTH + 5}):\n    os.mkdir('d')\n    os.chdir('d')\n"
    attacker(attacker_python(), "-I", "-c", script, cwd=top)
    result = _prune(arena)
    assert not result.failed and not result.timed_out, result
    item = _items(result)[OLD]
    assert item["action"] == "skip" and f"nested more than {MAX_TREE_DEPTH} directories deep" in item["note"]
    assert item["note"].startswith(f"{arena.root}/{OLD}/tt_metal_cache/cache_{MODEL}/{MESH}/d/d/")
    # Refused before anything was touched: the tree is where it was, whole.
    assert (top / "kernels" / "k.bin").exists() and not (arena.root / TRASH).exists()


def test_a_trash_planted_by_the_user_is_refused_and_nothing_goes_into_it(arena):
    old = _volume(arena, OLD)
    _volume(arena, NEW)
    attacker("mkdir", arena.root / TRASH)
    attacker("ln", "-s", arena.victim_dir, arena.root / TRASH / "escape")
    result = _prune(arena)
    assert not result.timed_out, result
    arena.assert_victims_intact()
    assert old.exists() and sorted(os.listdir(arena.root / TRASH)) == ["escape"]
    assert _items(result)[OLD]["action"] == "skip"
    assert f"{arena.root}/{TRASH}: is owned by uid 1000" in _items(result)[OLD]["note"]


def test_a_planted_file_outside_the_roots_is_never_touched(arena):
    _volume(arena, OLD)
    _volume(arena, NEW)
    outside = Path(arena.path) / f"volume_id_tt_transformers-{MODEL}-v0.13.0"
    arena.mkdirs(outside, owner=0)
    (outside / "keep").write_bytes(b"outside")
    result = _prune(arena, remove=[outside.name, "../victim-dir"], check_mode=True)
    assert result.failed and "remove holds '../victim-dir'" in result["msg"], result
    result = _prune(arena, remove=[outside.name])
    assert not result.failed, result
    arena.assert_victims_intact()
    assert (outside / "keep").read_bytes() == b"outside"
    assert any(f"remove names {outside.name}, which is not found" in m for m in result["left_alone"])
