# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Free space and sizes: how much room a path or a directory descriptor has, in words for people."""

from __future__ import annotations

import os


def human_bytes(count: float) -> str:
    """``1.5 GiB`` style text, binary units as tt-inference-server counts disk."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def nearest_existing(path: str) -> str:
    """``path`` or its nearest existing parent directory (for free-space checks of a path still to make)."""
    current = os.path.normpath(path)
    while not os.path.isdir(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def free_bytes(target: int | str) -> int:
    """Bytes available to root on the filesystem of ``target``: a directory descriptor or a path."""
    st = os.fstatvfs(target) if isinstance(target, int) else os.statvfs(nearest_existing(target))
    return st.f_bavail * st.f_frsize
