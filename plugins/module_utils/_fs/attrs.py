# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Modes and ownership, changed on descriptors (fchmod/fchown), never by name."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

if TYPE_CHECKING:
    # ``(uid, gid)`` given to what is created or changed.
    Owner = tuple[int, int]


def set_attrs(fd: int, mode: int | None = None, owner: Owner | None = None, st: os.stat_result | None = None) -> bool:
    """fchmod/fchown ``fd`` to ``mode`` and ``owner`` (``(uid, gid)``) where they differ; True if changed.

    A root-owned file with other hard links is never made more readable: it could be a link to a
    root-only file that a user placed here (where ``fs.protected_hardlinks`` is off)."""
    st = st or os.fstat(fd)
    changed = False
    if mode is not None and stat.S_IMODE(st.st_mode) != mode:
        loosens = mode & ~stat.S_IMODE(st.st_mode)
        if loosens and st.st_uid == 0 and st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            raise SafeFileError(
                f"inode {st.st_ino}", "is a root-owned file with several hard links; its mode is not widened"
            )
        os.fchmod(fd, mode)
        changed = True
    if owner is not None and (st.st_uid, st.st_gid) != tuple(owner) and os.geteuid() == 0:
        os.fchown(fd, *owner)
        if mode is not None and mode & 0o6000:
            os.fchmod(fd, mode)
        changed = True
    return changed
