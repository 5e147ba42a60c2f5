# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel caches: looking at a cache on the host (what it holds, and whether it is complete)."""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import TypedDict

    # A scanned entry: (relpath, kind, size, mtime_ns, mode).
    ScanEntry = tuple[str, str, int, int, int]

    class Scan(TypedDict):
        """What scan_cache returns."""

        exists: bool
        files: int
        bytes: int
        newest_mtime: float | None
        entries: list[ScanEntry]
        temp: list[str]
        special: list[str]


# Names that mean a writer is still at work (or died mid-write): a cache holding one is not complete.
DEFAULT_TEMP_PATTERNS = (
    "*.tmp",
    "*.temp",
    "*.part",
    "*.partial",
    "*.incomplete",
    "*.lock",
    "*.swp",
    "*~",
    ".nfs*",
    TEMP_PREFIX + "*",
)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def empty_scan() -> Scan:
    return {"exists": False, "files": 0, "bytes": 0, "newest_mtime": None, "entries": [], "temp": [], "special": []}


def scan_cache(target: int | str, temp_patterns: Sequence[str] = DEFAULT_TEMP_PATTERNS) -> Scan:
    """Regular files and directories under ``target``, a directory descriptor or a path (links are not followed).

    Returns ``{"exists", "files", "bytes", "newest_mtime", "entries", "temp", "special"}`` where
    ``entries`` is a sorted list of ``(relpath, kind, size, mtime_ns, mode)`` and ``temp``/``special``
    list the relative paths of in-progress files and of anything that is neither a file nor a directory.
    """
    if not isinstance(target, int):
        try:
            fd = open_dir(target)
        except FileNotFoundError:
            return empty_scan()
        try:
            return scan_cache(fd, temp_patterns)
        finally:
            os.close(fd)
    result = empty_scan()
    result["exists"] = True
    newest = os.fstat(target).st_mtime
    for rel_dir, _fd, entries in walk(target):
        for name, est in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            newest = max(newest, est.st_mtime)
            if _matches(name, temp_patterns):
                result["temp"].append(rel)
            if stat.S_ISDIR(est.st_mode):
                result["entries"].append((rel, "dir", 0, est.st_mtime_ns, est.st_mode & 0o777))
            elif stat.S_ISREG(est.st_mode):
                result["entries"].append((rel, "file", est.st_size, est.st_mtime_ns, est.st_mode & 0o777))
                result["files"] += 1
                result["bytes"] += est.st_size
            else:
                result["special"].append(rel)
    result["entries"].sort()
    result["temp"].sort()
    result["special"].sort()
    result["newest_mtime"] = newest
    return result


def completeness_problems(scan: Scan, path: str, quiet_seconds: float = 0, now: float | None = None) -> list[str]:
    """Why the scanned cache is not complete (empty when it is).

    Complete means: the directory exists, holds at least one non-empty regular file, holds nothing but
    regular files and directories, no in-progress or temporary file, and nothing in it changed during the
    last ``quiet_seconds`` (a server still capturing traces keeps writing).
    """
    if not scan["exists"]:
        return [f"{path} does not exist"]
    problems = []
    if scan["files"] == 0 or scan["bytes"] == 0:
        problems.append(f"{path} holds no data ({scan['files']} files, {scan['bytes']} bytes)")
    if scan["temp"]:
        problems.append(f"{path} holds in-progress or temporary files: {', '.join(scan['temp'][:5])}")
    if scan["special"]:
        special = ", ".join(scan["special"][:5])
        problems.append(f"{path} holds entries that are neither files nor directories: {special}")
    if quiet_seconds and scan["newest_mtime"] is not None:
        now = time.time() if now is None else now
        age = now - scan["newest_mtime"]
        if age < quiet_seconds:
            problems.append(
                f"{path} changed {max(age, 0):.0f} s ago, less than quiet_seconds={quiet_seconds}: the server may "
                "still be writing kernels; harvest again later"
            )
    return problems
