# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Directories opened one component at a time with O_NOFOLLOW, relative to directory descriptors."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import (
    SafeFileError,
    check_name,
    components,
    kind_of,
    location,
    rel_parts,
    trusted,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import Owner

# Directory opens: never follow the last component, never leak the descriptor into children.
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40


def open_dir(path: str, follow_trusted: bool = True) -> int:
    """A descriptor of directory ``path``, opened component by component without following a link that a
    non-root user could have planted. Links in root-only directories are followed (at most 40)."""
    parts = components(path)
    fd = os.open("/", O_DIR)
    walked = "/"
    hops = 0
    try:
        while parts:
            name = parts.pop(0)
            try:
                nxt = os.open(name, O_DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.lstat(name, dir_fd=fd)
                here = os.path.join(walked, name)
                if not stat.S_ISLNK(st.st_mode):
                    raise SafeFileError(here, f"is a {kind_of(st.st_mode)}, not a directory") from None
                if not (follow_trusted and trusted(os.fstat(fd))):
                    raise SafeFileError(
                        here, "is a symbolic link in a directory that a non-root user can write; it is not followed"
                    ) from None
                hops += 1
                if hops > _MAX_LINKS:
                    raise SafeFileError(path, "too many levels of symbolic links") from None
                target = os.readlink(name, dir_fd=fd)
                # ``walked`` holds no link (each one was resolved on the way), so ``..`` in a trusted link's
                # target (volume_alias writes ``../../home/tt/...``) can be resolved by text.
                rest = components(os.path.normpath(os.path.join(walked, target)))
                parts = rest + parts
                os.close(fd)
                fd = os.open("/", O_DIR)
                walked = "/"
                continue
            os.close(fd)
            fd = nxt
            walked = os.path.join(walked, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def opened_dir(path: str, follow_trusted: bool = True) -> Iterator[int]:
    fd = open_dir(path, follow_trusted)
    try:
        yield fd
    finally:
        os.close(fd)


def open_nearest(path: str) -> tuple[int, str, list[str]]:
    """``(fd, existing, missing)``: a descriptor of the nearest existing directory of ``path`` (opened with
    ``open_dir``) and the names below it that are still missing."""
    missing: list[str]
    head, missing = os.path.normpath(path), []
    while True:
        try:
            return open_dir(head), head, missing
        except FileNotFoundError:
            head, name = os.path.split(head)
            if not name:
                raise
            missing.insert(0, name)


def make_path(path: str, mode: int = 0o755, owner: Owner | None = None) -> int:
    """A descriptor of directory ``path``, creating the missing part with ``mode`` and ``owner`` set on
    descriptors; a link planted by a user anywhere on the way is refused, never followed."""
    fd, existing, missing = open_nearest(path)
    if not missing:
        return fd
    try:
        return makedirs(fd, "/".join(missing), mode, owner, where=existing)
    finally:
        os.close(fd)


def open_subdir(dirfd: int, name: str, where: str | None = None) -> int:
    """Descriptor of the directory ``name`` (one component) in ``dirfd``; a link or other type is refused."""
    check_name(name)
    try:
        return os.open(name, O_DIR, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=dirfd)
            raise SafeFileError(location(where, name), f"is a {kind_of(st.st_mode)}, not a directory") from None
        raise


def _descend(dirfd: int, relpath: str, step: Callable[[int, str], int]) -> int:
    """Walk ``relpath`` below ``dirfd`` one component at a time with ``step(fd, name)``, which returns the next
    directory's descriptor; returns the last one (a new descriptor even for an empty ``relpath``)."""
    fd = os.dup(dirfd)
    try:
        for name in rel_parts(relpath):
            nxt = step(fd, name)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_relative(dirfd: int, relpath: str, where: str | None = None) -> int:
    """Descriptor of the directory ``relpath`` below ``dirfd``, no link followed on the way."""
    return _descend(dirfd, relpath, lambda fd, name: open_subdir(fd, name, where))


def makedirs(dirfd: int, relpath: str, mode: int = 0o755, owner: Owner | None = None, where: str | None = None) -> int:
    """Descriptor of ``relpath`` below ``dirfd``, creating missing directories with ``mode`` and ``owner``
    (set on the new descriptor). Existing components must be real directories."""
    return _descend(dirfd, relpath, lambda fd, name: ensure_dir(fd, name, mode, owner, where)[0])


def ensure_dir(
    dirfd: int, name: str, mode: int = 0o755, owner: Owner | None = None, where: str | None = None
) -> tuple[int, bool]:
    """``(fd, created)`` of directory ``name`` in ``dirfd``; a new one gets ``mode`` and ``owner``."""
    created = False
    try:
        os.mkdir(name, mode, dir_fd=dirfd)
        created = True
    except FileExistsError:
        pass
    fd = open_subdir(dirfd, name, where)
    if created:
        try:
            set_attrs(fd, mode, owner)
        except BaseException:
            os.close(fd)
            raise
    return fd, created


def fsync_dir(dirfd: int) -> None:
    with contextlib.suppress(OSError):
        os.fsync(dirfd)


def fsync_path(path: str) -> None:
    """``fsync_dir`` of the directory at ``path``, best effort: it is opened with ``open_dir``, so a link that a
    non-root user planted on the way is not followed, and a directory that cannot be opened is skipped."""
    with contextlib.suppress(OSError, SafeFileError), opened_dir(path) as dirfd:
        fsync_dir(dirfd)
