# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Atomic writes: a new file with a random O_EXCL name, fsynced, given its mode and owner on the descriptor, renamed
into place inside the same directory."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import fsync_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, check_name

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import Owner

TEMP_PREFIX = ".ttfleet-tmp-"


def temp_name(hint: str = "") -> str:
    return f"{TEMP_PREFIX}{hint}{'.' if hint else ''}{secrets.token_hex(8)}"


def create_temp(dirfd: int, hint: str = "", mode: int = 0o600) -> tuple[int, str]:
    """``(fd, name)`` of a new empty file with a random name, created with O_EXCL (never an existing path) and
    open for reading and writing (what was written can be read back from the same inode)."""
    for _attempt in range(16):
        name = temp_name(hint)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
        except FileExistsError:
            continue
        return fd, name
    raise SafeFileError(hint or "temporary file", "no free random name after 16 tries")


def rename(dirfd: int, src: str, dst: str, dst_dirfd: int | None = None) -> None:
    """Rename ``src`` to ``dst`` (single names) relative to directory descriptors; a directory at ``dst``
    is never replaced."""
    check_name(src)
    check_name(dst)
    target_fd = dirfd if dst_dirfd is None else dst_dirfd
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(dst, dir_fd=target_fd)
        if stat.S_ISDIR(st.st_mode):
            raise SafeFileError(dst, "is a directory where a file belongs; move it away")
    os.rename(src, dst, src_dir_fd=dirfd, dst_dir_fd=target_fd)


def unlink(dirfd: int, name: str, missing_ok: bool = True) -> None:
    """Remove ``name`` (never a directory) from ``dirfd``."""
    check_name(name)
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        if not missing_ok:
            raise


@contextlib.contextmanager
def replacing(dirfd: int, name: str, mode: int = 0o644, owner: Owner | None = None) -> Iterator[int]:
    """Yield the descriptor of a new file with a random O_EXCL name in ``dirfd``; when the block ends without an
    error it is fsynced, given ``mode`` and ``owner`` on the descriptor and renamed over ``name``. On an error the
    temporary file is removed and ``name`` is untouched."""
    check_name(name)
    fd, tmp = create_temp(dirfd, name[:40])
    try:
        yield fd
        os.fsync(fd)
        set_attrs(fd, mode, owner)
        rename(dirfd, tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
    finally:
        os.close(fd)
    fsync_dir(dirfd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(
    dirfd: int, name: str, data: bytes, mode: int = 0o644, owner: Owner | None = None, where: str | None = None
) -> None:
    """Replace ``name`` in ``dirfd`` with ``data`` through a random O_EXCL temporary file, fsync and rename.
    Mode and owner are set on the descriptor before the rename."""
    with replacing(dirfd, name, mode, owner) as fd:
        write_all(fd, data)


def write_json(
    dirfd: int, name: str, data: Any, mode: int = 0o644, owner: Owner | None = None, where: str | None = None
) -> None:
    body = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
    write_atomic(dirfd, name, body, mode, owner, where)
