# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Disk given back: what a tree frees (hardlinks counted once, and only when every link goes), and its removal
through a root-only trash directory, bounded in time and resumable.

An item is first renamed (same filesystem, relative to directory descriptors) into ``<root>/.ttfleet-prune``, a
0700 root-owned directory checked after it is opened, under a random name; then the trash is emptied with
``remove_tree`` until a deadline. What is left is finished by the next run. Nothing here follows a link, opens a
special file or enters a tree through a link; a tree deeper than MAX_TREE_DEPTH is refused before it is touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import (
    SafeFileError,
    check_name,
    kind_of,
    location,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import MAX_TREE_DEPTH, remove_tree

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

# The trash beside what is removed (one per root: the volume root, each spool, the release root).
TRASH_NAME = ".ttfleet-prune"
TRASH_MODE = 0o700
# The part of an item's name kept in its trash name (a name is at most 255 bytes; 17 go to the random suffix).
_NAME_KEEP = 200


class Usage:
    """The inodes of one tree: ``{(st_dev, st_ino): [st_nlink, bytes, links seen]}``; bytes are st_blocks * 512."""

    def __init__(self) -> None:
        self.inodes: dict[tuple[int, int], list[int]] = {}
        self.entries = 0

    def add(self, st: os.stat_result) -> None:
        self.entries += 1
        key = (st.st_dev, st.st_ino)
        # A directory's link count counts its subdirectories, not other names of it: it goes with its tree.
        nlink = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink
        found = self.inodes.setdefault(key, [nlink, st.st_blocks * 512, 0])
        found[2] += 1

    @property
    def bytes(self) -> int:
        """What removing this tree alone frees."""
        return freed([self])


def freed(usages: Iterable[Usage]) -> int:
    """Bytes freed by removing all of ``usages`` together: an inode counts once, and only when every one of its
    links is among them (the weights of a volume hardlinked into a newer one free nothing)."""
    seen: dict[tuple[int, int], list[int]] = {}
    for usage in usages:
        for key, (nlink, size, count) in usage.inodes.items():
            entry = seen.setdefault(key, [nlink, size, 0])
            entry[2] += count
    return sum(size for nlink, size, count in seen.values() if count >= nlink)


def check_top(dirfd: int, name: str, where: str, owners: tuple[int, ...] = (0,)) -> os.stat_result:
    """The lstat of ``name`` in ``dirfd`` when it is a directory owned by one of ``owners``; a link, a special file
    or another owner is refused (SafeFileError naming ``<where>/<name>``)."""
    check_name(name)
    st = os.lstat(name, dir_fd=dirfd)
    path = location(where, name)
    if stat.S_ISLNK(st.st_mode):
        raise SafeFileError(path, "is a symbolic link where a directory was expected; it is not followed")
    if not stat.S_ISDIR(st.st_mode):
        raise SafeFileError(path, f"is a {kind_of(st.st_mode)}, not a directory; it is left alone")
    if st.st_uid not in owners:
        raise SafeFileError(path, f"is owned by uid {st.st_uid}, not root; it is left alone (remove it by hand)")
    return st


def usage(dirfd: int, name: str, where: str = "") -> Usage:
    """The inodes of ``name`` in ``dirfd`` and everything below it, never following a link (a link is an inode of
    its own). One descriptor per level is held; a tree deeper than MAX_TREE_DEPTH is refused naming the path."""
    check_name(name)
    found = Usage()
    st = os.lstat(name, dir_fd=dirfd)
    found.add(st)
    if not stat.S_ISDIR(st.st_mode):
        return found
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []

    def descend(parent: int, child: str, rel: str) -> None:
        if len(stack) >= MAX_TREE_DEPTH:
            raise SafeFileError(
                location(where, rel), f"is nested more than {MAX_TREE_DEPTH} directories deep; remove it by hand"
            )
        fd = open_subdir(parent, child, location(where, os.path.dirname(rel)))
        try:
            stack.append((fd, rel, iter(list(os.scandir(fd)))))
        except BaseException:
            os.close(fd)
            raise

    try:
        descend(dirfd, name, name)
        while stack:
            fd, rel, entries = stack[-1]
            for entry in entries:
                try:
                    est = os.lstat(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                found.add(est)
                if stat.S_ISDIR(est.st_mode):
                    descend(fd, entry.name, f"{rel}/{entry.name}")
                    break
            else:
                stack.pop()
                os.close(fd)
    finally:
        for fd, _rel, _entries in stack:
            with contextlib.suppress(OSError):
                os.close(fd)
    return found


def open_trash(dirfd: int, where: str, create: bool) -> int | None:
    """A descriptor of ``.ttfleet-prune`` in ``dirfd`` (None when it is missing and ``create`` is off): made 0700,
    and checked after it is opened to be a root-only directory of this user. One that someone else made, or that
    others can enter, is refused and never entered."""
    made = False
    if create:
        try:
            os.mkdir(TRASH_NAME, TRASH_MODE, dir_fd=dirfd)
            made = True
        except FileExistsError:
            pass
    try:
        fd = open_subdir(dirfd, TRASH_NAME, where)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or (st.st_mode & 0o077 and not made):
        os.close(fd)
        raise SafeFileError(
            location(where, TRASH_NAME),
            f"is owned by uid {st.st_uid} or open to others (mode {stat.S_IMODE(st.st_mode):o}); disk_prune uses it as "
            "its root-only trash: remove it by hand",
        )
    if made:
        set_attrs(fd, TRASH_MODE)
    return fd


def to_trash(dirfd: int, name: str, trash_fd: int, label: str) -> str:
    """Rename ``name`` in ``dirfd`` into the trash under ``<label>.<name>.<random>``; returns that name. The trash
    is root-only, so no one else can take the random name in between."""
    check_name(name)
    for _attempt in range(16):
        moved = f"{label}.{name[:_NAME_KEEP]}.{secrets.token_hex(8)}"
        try:
            os.lstat(moved, dir_fd=trash_fd)
        except FileNotFoundError:
            break
    else:
        raise SafeFileError(name, "no free random name in the trash after 16 tries")
    try:
        os.rename(name, moved, src_dir_fd=dirfd, dst_dir_fd=trash_fd)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EBUSY):
            raise SafeFileError(
                name, "is a mount point or on another filesystem than the trash; unmount it or remove it by hand"
            ) from None
        raise
    return moved


def trash_label(moved: str) -> tuple[str, str]:
    """``(label, original name)`` of a trash entry that ``to_trash`` named."""
    label, _dot, rest = moved.partition(".")
    original, _dot, _random = rest.rpartition(".")
    return label, original or rest


def empty(
    trash_fd: int,
    names: Iterable[str],
    until: float | None,
    progress: Callable[[int, str], object] | None = None,
) -> tuple[list[str], list[str], int, list[str]]:
    """Remove the trash entries ``names`` until ``until`` (monotonic). Returns ``(done, pending, freed bytes,
    problems)``: an unlinked inode frees its blocks when it was its last link. ``progress(bytes, name)`` gets what
    each removed entry freed."""
    done: list[str] = []
    pending: list[str] = []
    problems: list[str] = []
    total = [0]
    current = [""]

    def count(st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
            total[0] += st.st_blocks * 512
            if progress is not None:
                progress(st.st_blocks * 512, current[0])

    for name in names:
        current[0] = name
        try:
            finished = remove_tree(trash_fd, name, until, count)
        except (OSError, SafeFileError) as exc:
            problems.append(f"{name}: {exc}")
            pending.append(name)
            continue
        (done if finished else pending).append(name)
    return done, pending, total[0], problems
