# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel caches: ``kernels.tar.zst`` archives, packed and unpacked through the zstd program.

Pure standard library; the host needs the ``zstd`` program (Python 3.11 has no zstd module).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tarfile
import threading
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import makedirs, open_relative
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    KernelError,
    refusal,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Any, Protocol, TypedDict

    from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import Owner
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import Scan

    class Unpacked(TypedDict):
        """What unpack returns."""

        sha256: str
        archive_bytes: int
        files: int
        bytes: int

    class Reader(Protocol):
        """A binary source read by blocks: an open file, a _Body."""

        def read(self, size: int = ..., /) -> bytes:
            ...


CHUNK = 1 << 20


def find_zstd(host: str) -> str:
    found = shutil.which("zstd") or next(
        (p for p in ("/usr/bin/zstd", "/usr/local/bin/zstd", "/bin/zstd") if os.access(p, os.X_OK)), None
    )
    if not found:
        raise KernelError(
            f"{host}: the zstd program is missing (kernel cache archives are .tar.zst): install the zstd package "
            "(apt-get install zstd); the role ttfleet.inference.model_cache installs it when a store is set"
        )
    return found


def _tarinfo(name: str, kind: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        info.mode = DIR_MODE
    else:
        info.size = size
        info.mode = EXEC_MODE if mode & 0o111 else FILE_MODE
    return info


def _abort(proc: subprocess.Popen[bytes], thread: threading.Thread) -> None:
    """Stop a zstd pipe and the thread that feeds or drains it."""
    proc.kill()
    thread.join()
    proc.wait()


@contextlib.contextmanager
def _piped(proc: subprocess.Popen[bytes], thread: threading.Thread, dirs: _OneDir) -> Iterator[None]:
    """The body that streams through a zstd pipe: any error stops the pipe and its thread; ``dirs`` is closed either
    way. Afterwards the caller waits for zstd with ``_finish``."""
    try:
        yield
    except BaseException:
        _abort(proc, thread)
        raise
    finally:
        dirs.close()


def _finish(proc: subprocess.Popen[bytes], thread: threading.Thread) -> int:
    """zstd's exit code, once the thread that fed or drained it is done."""
    thread.join()
    return proc.wait()


class _OneDir:
    """The descriptor of one directory below ``base`` at a time, opened by ``opener(base, relpath)``: scanned
    entries and archive members come sorted, so consecutive files mostly share their directory."""

    rel: str | None
    fd: int | None

    def __init__(self, base: int, opener: Callable[[int, str], int]) -> None:
        self.base = base
        self.opener = opener
        self.rel = self.fd = None

    def get(self, rel: str) -> int:
        if self.fd is None or rel != self.rel:
            self.close()
            self.fd = self.opener(self.base, rel)
            self.rel = rel
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.rel = self.fd = None


def pack(
    cache_fd: int,
    scan: Scan,
    out_fd: int,
    zstd: str,
    level: int = 3,
    progress: Progress | None = None,
    where: str = "",
) -> tuple[str, int]:
    """Tar the scanned entries of the directory ``cache_fd`` through ``zstd`` into the file ``out_fd``.

    Returns ``(sha256, archive_bytes)``, hashed while written (no second pass). Every file is opened relative to
    its directory's descriptor as a regular file: an entry swapped for a link or a special file since the scan is
    refused, never followed or opened. A file whose size changes while it is read fails the pack: the cache was
    not complete after all.
    """
    # Accepted bandit B603: fixed argv: zstd found on PATH, an int level.
    proc = subprocess.Popen(  # nosec B603
        [zstd, "-q", f"-{int(level)}", "-T0", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    digest = hashlib.sha256()
    state: dict[str, Any] = {"bytes": 0, "error": None}
    cache_uid = os.fstat(cache_fd).st_uid

    def drain() -> None:
        try:
            with os.fdopen(out_fd, "wb", closefd=False) as out:
                while True:
                    # stdin and stdout are pipes (subprocess.PIPE): never None.
                    block = cast("IO[bytes]", proc.stdout).read(CHUNK)
                    if not block:
                        break
                    digest.update(block)
                    out.write(block)
                    state["bytes"] += len(block)
                out.flush()
                os.fsync(out_fd)
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
            cast("IO[bytes]", proc.stdout).close()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    dirs = _OneDir(cache_fd, lambda base, rel: open_relative(base, rel, where))
    with _piped(proc, thread, dirs):
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel, kind, size, _mtime, mode in scan["entries"]:
                info = _tarinfo(rel, kind, size, mode)
                if kind == "dir":
                    tar.addfile(info)
                    continue
                full = os.path.join(where, rel)
                dirname, name = os.path.split(rel)
                try:
                    fd, st = open_file(dirs.get(dirname), name, where=os.path.join(where, dirname))
                except SafeFileError as exc:
                    raise refusal(
                        exc, "it was a regular file when the cache was scanned; harvest again once nothing writes to it"
                    ) from None
                with os.fdopen(fd, "rb") as handle:
                    if st.st_size != size:
                        raise KernelError(f"{full} changed size while the cache was packed; harvest again later")
                    # A hard link to a file of someone else (possible where fs.protected_hardlinks is off) is
                    # not the cache's own data.
                    if st.st_nlink > 1 and st.st_uid != cache_uid:
                        raise KernelError(
                            f"{full} is a hard link to a file owned by uid {st.st_uid}, not by the cache's owner; "
                            "it is not packed. Fix: remove it from the cache"
                        )
                    tar.addfile(info, handle)
                if progress is not None:
                    progress.advance(size, rel)
        cast("IO[bytes]", proc.stdin).close()
    rc = _finish(proc, thread)
    if state["error"] is not None:
        raise KernelError(f"writing the archive of {where} failed: {state['error']}")
    if rc != 0:
        raise KernelError(f"zstd failed with exit code {rc} while packing {where}")
    return digest.hexdigest(), state["bytes"]


def _member_parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or "\0" in name:
        raise KernelError(f"the archive holds an unsafe member name {name!r}; it was not written by this collection")
    return parts


def _read_exact(source: Reader, expected: int, push: Callable[[bytes], object]) -> int:
    """Pass exactly the first ``expected`` bytes of ``source`` to ``push``; a byte more is refused before it is
    passed on. Returns the bytes passed (fewer when the source ends early)."""
    done = 0
    while done < expected:
        block = source.read(min(CHUNK, expected - done))
        if not block:
            return done
        push(block)
        done += len(block)
    if source.read(1):
        raise KernelError(
            f"the archive runs past the {expected} bytes (archive_bytes) its manifest states; refused before "
            "unpacking more"
        )
    return done


def unpack(
    source: Reader,
    staging_fd: int,
    zstd: str,
    max_bytes: int,
    owner: Owner | None = None,
    progress: Progress | None = None,
    expected: int | None = None,
) -> Unpacked:
    """Extract a .tar.zst stream into the empty directory ``staging_fd``, hashing the stream as it is read.

    Only regular files and directories are written (no links, devices or absolute/parent paths), each created
    relative to its directory's descriptor (new files with O_EXCL, never through a link) and given ``owner`` on
    its descriptor; writing stops once more than ``max_bytes`` come out. With ``expected`` (the manifest's
    archive_bytes), exactly that many bytes of ``source`` are read: a longer source fails before its extra bytes
    reach zstd.
    Returns ``{"sha256", "archive_bytes", "files", "bytes"}``.
    """
    # Accepted bandit B603: fixed argv: zstd found on PATH, reading the archive from a pipe.
    proc = subprocess.Popen(  # nosec B603
        [zstd, "-q", "-d", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    digest = hashlib.sha256()
    state: dict[str, Any] = {"bytes": 0, "error": None}

    def push(block: bytes) -> None:
        digest.update(block)
        state["bytes"] += len(block)
        # stdin and stdout are pipes (subprocess.PIPE): never None.
        cast("IO[bytes]", proc.stdin).write(block)
        if progress is not None:
            progress.advance(len(block), ARCHIVE_NAME)

    def feed() -> None:
        try:
            if expected is not None:
                _read_exact(source, expected, push)
                return
            while True:
                block = source.read(CHUNK)
                if not block:
                    break
                push(block)
        except BrokenPipeError:
            pass
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
        finally:
            with contextlib.suppress(OSError):
                cast("IO[bytes]", proc.stdin).close()

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    files = total = 0
    dirs = _OneDir(staging_fd, lambda base, rel: makedirs(base, rel, DIR_MODE, owner))
    with _piped(proc, thread, dirs):
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    parts = _member_parts(member.name)
                    if member.isdir():
                        dirs.get("/".join(parts))
                        continue
                    if not member.isfile():
                        raise KernelError(
                            f"the archive holds {member.name!r}, which is not a regular file or directory; refused"
                        )
                    total += member.size
                    if total > max_bytes:
                        raise KernelError(
                            f"the archive unpacks to more than the {max_bytes} bytes its manifest states"
                        )
                    mode = EXEC_MODE if member.mode & 0o111 else FILE_MODE
                    fd = os.open(
                        parts[-1],
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                        dir_fd=dirs.get("/".join(parts[:-1])),
                    )
                    with os.fdopen(fd, "wb") as out:
                        # A regular file (member.isfile() above): extractfile never returns None for one.
                        shutil.copyfileobj(cast("IO[bytes]", tar.extractfile(member)), out, CHUNK)
                        out.flush()
                        set_attrs(fd, mode, owner)
                    files += 1
            # Read to the end, so the hash covers the whole archive (tar pads past its end-of-archive blocks).
            while cast("IO[bytes]", proc.stdout).read(CHUNK):
                pass
        except tarfile.TarError as exc:
            _abort(proc, thread)
            if state["error"] is not None:
                # The stream was cut (too long, too slow, broken): that, not the torn tar, is the cause.
                raise _read_failure(state["error"]) from None
            raise KernelError(
                f"the archive is not a readable tar.zst ({exc}); remove the store entry and harvest again"
            ) from None
    rc = _finish(proc, thread)
    if state["error"] is not None:
        raise _read_failure(state["error"])
    if rc != 0:
        raise KernelError(
            f"zstd could not decompress the archive (exit code {rc}); remove the store entry and harvest again"
        )
    return {"sha256": digest.hexdigest(), "archive_bytes": state["bytes"], "files": files, "bytes": total}


def _read_failure(error: BaseException) -> KernelError:
    if isinstance(error, KernelError):
        return error
    return KernelError(f"reading the archive failed: {error}")
