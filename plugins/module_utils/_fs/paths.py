# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The one safe-file layer for root-run code in directories that a non-root user can write.

Volumes, ``weights/``, ``tt_metal_cache/``, staging directories and kernel spools may be writable by the
container UID, which is often also a login user. Everything here works on directory descriptors, the way
systemd-tmpfiles and OpenSSH do:

- a path is opened one component at a time with ``O_NOFOLLOW``; a symbolic link is followed only where it
  sits in a directory that only root can change (``/var/run -> /run`` stays usable, a link planted by a
  user never is);
- files are opened relative to a directory descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
  ``fstat``: a FIFO, device or socket is refused before a single byte is read, so nothing can block;
- new files get random names created with ``O_EXCL`` and are renamed into place inside the same directory;
- ownership and modes are changed on descriptors (``fchown``/``fchmod``), never by name;
- walks never follow links and never leave the tree they started in.

Pure standard library (hosts run Python >= 3.10); Linux semantics.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError


class SafeFileError(FleetError):
    """A path that root-run code refuses to touch: a link, a special file, something too large."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def kind_of(mode: int) -> str:
    """``file``, ``directory``, ``symlink``, ``fifo``, ``socket``, ``char device``, ``block device``."""
    for test, name in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "char device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "unknown"


def trusted(st: os.stat_result) -> bool:
    """True when only root can change the entries of the directory described by ``st``."""
    return st.st_uid == 0 and not st.st_mode & 0o022


def untrusted_dir(dirfd: int, directory: str, why: str) -> str | None:
    """None when only root can change the entries of the open directory ``dirfd``, else the message: who can, ``why``
    that matters (for example "so it cannot hold secrets") and the fix. Only root needs the check: a test runs as
    its own user."""
    st = os.fstat(dirfd)
    if os.geteuid() != 0 or trusted(st):
        return None
    return (
        f"{directory} (owner uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}) can be changed by a user other than "
        f"root, {why}: make it root's with mode 0755 (chown root: {directory}; chmod go-w {directory})."
    )


def components(path: str) -> list[str]:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise SafeFileError(path, "not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SafeFileError(path, "holds '..'; give the path without it")
    return parts


def rel_parts(relpath: str) -> list[str]:
    parts = [p for p in str(relpath).split("/") if p not in ("", ".")]
    for part in parts:
        check_name(part)
    return parts


def check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise SafeFileError(name, "is not a single file name")


def location(where: str | None, name: str) -> str:
    return os.path.join(where, name) if where else name
