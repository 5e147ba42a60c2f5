# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Trees walked, removed, re-owned and copied without following a link or leaving the tree they started in."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import replacing, write_all
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, check_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import Owner

    # What ``walk`` yields: ``(reldir, dirfd, [(name, lstat), ...])``.
    WalkStep = tuple[str, int, list[tuple[str, os.stat_result]]]

# remove_tree refuses a tree nested deeper than this (a user could build one to crash root-run code).
MAX_TREE_DEPTH = 400


def walk(
    dirfd: int, where: str = "", onerror: Callable[[OSError | SafeFileError], object] | None = None
) -> Iterator[WalkStep]:
    """Yield ``(reldir, dirfd, entries)`` for ``dirfd`` and every directory below it, top down, where
    ``entries`` is a list of ``(name, lstat)``. Links are reported, never followed; a directory that is
    swapped for a link mid-walk is refused (``onerror`` gets the SafeFileError, else it is raised).
    The descriptor yielded is valid only until the next step."""
    stack = [("", os.dup(dirfd))]
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                entries = []
                with os.scandir(fd) as found:
                    for entry in found:
                        entries.append((entry.name, os.lstat(entry.name, dir_fd=fd)))
                entries.sort()
                yield rel, fd, entries
                for name, st in reversed(entries):
                    if stat.S_ISDIR(st.st_mode):
                        try:
                            sub = open_subdir(fd, name, os.path.join(where, rel))
                        except (OSError, SafeFileError) as exc:
                            if onerror is None:
                                raise
                            onerror(exc)
                            continue
                        stack.append((os.path.join(rel, name) if rel else name, sub))
            finally:
                os.close(fd)
    finally:
        for _rel, fd in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def remove_tree(
    dirfd: int,
    name: str,
    until: float | None = None,
    removed: Callable[[os.stat_result], object] | None = None,
) -> bool:
    """Remove ``name`` in ``dirfd`` and everything below it without following a link (links are removed
    as links). A missing name is fine. A tree nested deeper than MAX_TREE_DEPTH directories is refused
    (SafeFileError) before anything below that depth is touched.

    ``until`` (a ``time.monotonic()`` value) bounds the work: past it the removal stops between two entries and
    returns False, leaving the rest for another call; True when ``name`` is gone. ``removed`` gets the lstat of
    every entry unlinked or removed (what it freed)."""
    check_name(name)
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dirfd)
        if removed is not None:
            removed(st)
        return True
    # An explicit stack, not recursion: a tree that a user made can be deeper than Python's recursion limit, and
    # one descriptor per level is held (never '..', which a rename could point elsewhere).
    stack: list[tuple[int, str, int, Iterator[str]]] = []

    def descend(parent: int, child: str) -> None:
        if len(stack) >= MAX_TREE_DEPTH:
            raise SafeFileError(child, f"is nested more than {MAX_TREE_DEPTH} directories deep; remove it by hand")
        fd = open_subdir(parent, child)
        try:
            with os.scandir(fd) as found:
                names = [entry.name for entry in found]
        except BaseException:
            os.close(fd)
            raise
        stack.append((parent, child, fd, iter(names)))

    try:
        descend(dirfd, name)
        while stack:
            parent, child, fd, names = stack[-1]
            for entry in names:
                if until is not None and time.monotonic() >= until:
                    return False
                try:
                    est = os.lstat(entry, dir_fd=fd)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    descend(fd, entry)
                    break
                os.unlink(entry, dir_fd=fd)
                if removed is not None:
                    removed(est)
            else:
                stack.pop()
                dst = os.fstat(fd)
                os.close(fd)
                os.rmdir(child, dir_fd=parent)
                if removed is not None:
                    removed(dst)
        return True
    finally:
        for _parent, _child, fd, _names in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def own_tree(
    dirfd: int,
    owner: Owner | None = None,
    dir_mode: int | None = None,
    file_mode: int | None = None,
    where: str = "",
    exec_mode: int | None = None,
) -> tuple[int, list[str]]:
    """Give ``dirfd`` and every directory and regular file below it ``owner`` and modes, on descriptors,
    never following a link. Returns ``(changed, skipped)``: the count of entries changed and the relative
    paths of links and special files that were left alone. ``exec_mode`` is used for files with an
    execute bit when given."""
    changed = 0
    skipped = []
    if set_attrs(dirfd, dir_mode, owner):
        changed += 1
    for rel, fd, entries in walk(dirfd, where):
        for name, st in entries:
            path = os.path.join(rel, name) if rel else name
            if stat.S_ISDIR(st.st_mode):
                sub = open_subdir(fd, name, where)
                try:
                    changed += set_attrs(sub, dir_mode, owner)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                wanted = exec_mode if exec_mode is not None and st.st_mode & 0o111 else file_mode
                if wanted is not None and stat.S_IMODE(st.st_mode) == wanted and (
                    owner is None or (st.st_uid, st.st_gid) == tuple(owner)
                ):
                    continue
                ffd, fst = open_file(fd, name, where=where)
                try:
                    changed += set_attrs(ffd, wanted, owner, fst)
                finally:
                    os.close(ffd)
            else:
                skipped.append(path)
    return changed, skipped


def copy_file(
    src_dirfd: int,
    src_name: str,
    dst_dirfd: int,
    dst_name: str,
    mode: int = 0o644,
    owner: Owner | None = None,
    limit: int | None = None,
    chunk: int = 1 << 20,
) -> int:
    """Copy a regular file between directory descriptors through a random temporary name; the source must be
    a regular file (never a link) and at most ``limit`` bytes. Returns the bytes copied."""
    sfd, sst = open_file(src_dirfd, src_name)
    try:
        if limit is not None and sst.st_size > limit:
            raise SafeFileError(src_name, f"is larger than {limit} bytes")
        copied = 0
        with replacing(dst_dirfd, dst_name, mode, owner) as dfd:
            while True:
                block = os.read(sfd, chunk)
                if not block:
                    break
                copied += len(block)
                if limit is not None and copied > limit:
                    raise SafeFileError(src_name, f"grew past {limit} bytes while copied")
                write_all(dfd, block)
        return copied
    finally:
        os.close(sfd)
