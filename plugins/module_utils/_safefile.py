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

import contextlib
import errno
import json
import os
import secrets
import stat
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    # ``(uid, gid)`` given to what is created or changed.
    Owner = tuple[int, int]
    # What ``walk`` yields: ``(reldir, dirfd, [(name, lstat), ...])``.
    WalkStep = tuple[str, int, list[tuple[str, os.stat_result]]]

_T = TypeVar("_T")

TEMP_PREFIX = ".ttfleet-tmp-"
# Directory opens: never follow the last component, never leak the descriptor into children.
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# File opens: O_NONBLOCK so a FIFO planted in place of a file cannot block the open (checked with fstat).
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_LINKS = 40
JSON_LIMIT = 1 << 20
# remove_tree refuses a tree nested deeper than this (a user could build one to crash root-run code).
MAX_TREE_DEPTH = 400


class SafeFileError(Exception):
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


# ---------------------------------------------------------------------------
# Directories


def _components(path: str) -> list[str]:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise SafeFileError(path, "not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SafeFileError(path, "holds '..'; give the path without it")
    return parts


def open_dir(path: str, follow_trusted: bool = True) -> int:
    """A descriptor of directory ``path``, opened component by component without following a link that a
    non-root user could have planted. Links in root-only directories are followed (at most 40)."""
    parts = _components(path)
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
                rest = _components(os.path.normpath(os.path.join(walked, target)))
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
    _check_name(name)
    try:
        return os.open(name, O_DIR, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=dirfd)
            raise SafeFileError(_where(where, name), f"is a {kind_of(st.st_mode)}, not a directory") from None
        raise


def _descend(dirfd: int, relpath: str, step: Callable[[int, str], int]) -> int:
    """Walk ``relpath`` below ``dirfd`` one component at a time with ``step(fd, name)``, which returns the next
    directory's descriptor; returns the last one (a new descriptor even for an empty ``relpath``)."""
    fd = os.dup(dirfd)
    try:
        for name in _rel_parts(relpath):
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


def _rel_parts(relpath: str) -> list[str]:
    parts = [p for p in str(relpath).split("/") if p not in ("", ".")]
    for part in parts:
        _check_name(part)
    return parts


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise SafeFileError(name, "is not a single file name")


def _where(where: str | None, name: str) -> str:
    return os.path.join(where, name) if where else name


def fsync_dir(dirfd: int) -> None:
    with contextlib.suppress(OSError):
        os.fsync(dirfd)


# ---------------------------------------------------------------------------
# Attributes


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


# ---------------------------------------------------------------------------
# Files


def open_file(dirfd: int, name: str, flags: int = O_READ, where: str | None = None) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file ``name`` in ``dirfd``; links and special files are refused. With
    ``os.O_CREAT`` in ``flags`` a missing file is created 0600."""
    _check_name(name)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SafeFileError(_where(where, name), "is a symbolic link; it is not followed") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            st = os.lstat(name, dir_fd=dirfd)
            raise SafeFileError(_where(where, name), f"is a {kind_of(st.st_mode)}, not a regular file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SafeFileError(_where(where, name), f"is a {kind_of(st.st_mode)}, not a regular file")
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
            raise SafeFileError(_where(where, name), f"is larger than {limit} bytes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise SafeFileError(_where(where, name), f"is larger than {limit} bytes")
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
        raise SafeFileError(_where(where, name), "is not valid JSON") from None
    if not isinstance(data, dict):
        raise SafeFileError(_where(where, name), "does not hold a JSON object")
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
    _check_name(src)
    _check_name(dst)
    target_fd = dirfd if dst_dirfd is None else dst_dirfd
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(dst, dir_fd=target_fd)
        if stat.S_ISDIR(st.st_mode):
            raise SafeFileError(dst, "is a directory where a file belongs; move it away")
    os.rename(src, dst, src_dir_fd=dirfd, dst_dir_fd=target_fd)


def unlink(dirfd: int, name: str, missing_ok: bool = True) -> None:
    """Remove ``name`` (never a directory) from ``dirfd``."""
    _check_name(name)
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
    _check_name(name)
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(
    dirfd: int, name: str, data: bytes, mode: int = 0o644, owner: Owner | None = None, where: str | None = None
) -> None:
    """Replace ``name`` in ``dirfd`` with ``data`` through a random O_EXCL temporary file, fsync and rename.
    Mode and owner are set on the descriptor before the rename."""
    with replacing(dirfd, name, mode, owner) as fd:
        _write_all(fd, data)


def write_json(
    dirfd: int, name: str, data: Any, mode: int = 0o644, owner: Owner | None = None, where: str | None = None
) -> None:
    body = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
    write_atomic(dirfd, name, body, mode, owner, where)


# ---------------------------------------------------------------------------
# Trees


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


def remove_tree(dirfd: int, name: str) -> None:
    """Remove ``name`` in ``dirfd`` and everything below it without following a link (links are removed
    as links). A missing name is fine. A tree nested deeper than MAX_TREE_DEPTH directories is refused
    (SafeFileError) before anything below that depth is touched."""
    _check_name(name)
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dirfd)
        return
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
                try:
                    est = os.lstat(entry, dir_fd=fd)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    descend(fd, entry)
                    break
                os.unlink(entry, dir_fd=fd)
            else:
                stack.pop()
                os.close(fd)
                os.rmdir(child, dir_fd=parent)
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
                _write_all(dfd, block)
        return copied
    finally:
        os.close(sfd)
