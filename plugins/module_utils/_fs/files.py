# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Regular files opened relative to a directory descriptor (O_NOFOLLOW | O_NONBLOCK, checked with fstat) and read
with a size limit; links and special files are refused before a byte is read."""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, TypeVar, overload

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir, open_relative, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import (
    SafeFileError,
    check_name,
    kind_of,
    location,
)

_T = TypeVar("_T")

# File opens: O_NONBLOCK so a FIFO planted in place of a file cannot block the open (checked with fstat).
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
JSON_LIMIT = 1 << 20


def open_file(dirfd: int, name: str, flags: int = O_READ, where: str | None = None) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file ``name`` in ``dirfd``; links and special files are refused. With
    ``os.O_CREAT`` in ``flags`` a missing file is created 0600."""
    check_name(name)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SafeFileError(location(where, name), "is a symbolic link; it is not followed") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            st = os.lstat(name, dir_fd=dirfd)
            raise SafeFileError(location(where, name), f"is a {kind_of(st.st_mode)}, not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SafeFileError(location(where, name), f"is a {kind_of(st.st_mode)}, not a regular file")
    # Back to blocking reads: O_NONBLOCK only guarded the open.
    os.set_blocking(fd, True)
    return fd, st


def open_path(path: str, dirfd: int | None = None, flags: int = O_READ) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file at ``path``: an absolute path whose directory is opened with
    ``open_dir``, or a path relative to ``dirfd`` walked without following a link."""
    head, name = os.path.split(path)
    parent = open_dir(head or "/") if dirfd is None else open_relative(dirfd, head)
    try:
        return open_file(parent, name, flags, where=head)
    finally:
        os.close(parent)


def read_bytes(
    dirfd: int, name: str, limit: int, where: str | None = None, missing: bytes | None = None
) -> bytes | None:
    """Content of regular file ``name`` (at most ``limit`` bytes), or ``missing`` when it does not exist."""
    try:
        fd, st = open_file(dirfd, name, where=where)
    except FileNotFoundError:
        return missing
    with os.fdopen(fd, "rb") as handle:
        if st.st_size > limit:
            raise SafeFileError(location(where, name), f"is larger than {limit} bytes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise SafeFileError(location(where, name), f"is larger than {limit} bytes")
    return data


@overload
def read_json(
    dirfd: int, name: str, limit: int = ..., where: str | None = ..., missing: None = ...
) -> dict[str, Any] | None:
    ...


@overload
def read_json(
    dirfd: int, name: str, limit: int = ..., where: str | None = ..., *, missing: _T
) -> dict[str, Any] | _T:
    ...


def read_json(
    dirfd: int, name: str, limit: int = JSON_LIMIT, where: str | None = None, missing: object = None
) -> object:
    """A JSON object from regular file ``name``; ``missing`` when absent; SafeFileError when not a small
    regular file holding a JSON object."""
    raw = read_bytes(dirfd, name, limit, where=where, missing=None)
    if raw is None:
        return missing
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise SafeFileError(location(where, name), "is not valid JSON") from None
    if not isinstance(data, dict):
        raise SafeFileError(location(where, name), "does not hold a JSON object")
    return data


@overload
def read_json_path(path: str, limit: int = ..., missing: None = ...) -> dict[str, Any] | None:
    ...


@overload
def read_json_path(path: str, limit: int = ..., *, missing: _T) -> dict[str, Any] | _T:
    ...


def read_json_path(path: str, limit: int = JSON_LIMIT, missing: object = None) -> object:
    """``read_json`` by absolute path: the parent directory is opened with ``open_dir``."""
    directory, name = os.path.split(path)
    try:
        with opened_dir(directory) as dirfd:
            return read_json(dirfd, name, limit, where=directory, missing=missing)
    except FileNotFoundError:
        return missing
