# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The path store: a directory (local disk or an NFS share) of kernel cache entries, and its writer; the
temporary archive that every writer packs into."""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import (
    TEMP_PREFIX,
    create_temp,
    rename,
    unlink,
    write_atomic,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path, open_dir, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file, read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    DIR_MODE,
    FILE_MODE,
    MANIFEST_MAX,
    MANIFEST_NAME,
    NO_VLLM,
    SHA_NAME,
    KernelError,
    entry_parts,
    key_mismatch,
    refusal,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import (
    json_bytes,
    json_object,
    parse_sha_file,
)

if TYPE_CHECKING:
    from typing import BinaryIO

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key


class PathStore:
    """A directory (local disk or an NFS share) holding ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm>/``.

    Entries are opened with open_dir (a link is followed only in a root-only directory) and their files with
    open_file: a link or special file in an entry is refused, never followed or opened."""

    kind = "path"

    def __init__(self, root: str) -> None:
        if not root or not os.path.isabs(root):
            raise KernelError(f"store_path {root!r} must be an absolute directory, for example /mnt/kernel-store")
        self.root = os.path.normpath(root)

    def describe(self, key: Key | None = None) -> str:
        return os.path.join(self.root, *entry_parts(key)) if key else self.root

    def entry_dir(self, key: Key) -> str:
        return os.path.join(self.root, *entry_parts(key))

    def _read(self, key: Key, name: str, limit: int) -> bytes | None:
        """Content of ``name`` in the entry of ``key``; None when the entry or the file is missing."""
        entry = self.entry_dir(key)
        try:
            with opened_dir(entry) as fd:
                return read_bytes(fd, name, limit, where=entry)
        except FileNotFoundError:
            return None
        except SafeFileError as exc:
            raise refusal(exc, f"remove the store entry {entry} and harvest again") from None

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read(key, MANIFEST_NAME, MANIFEST_MAX)
        if raw is None:
            return None
        path = os.path.join(self.entry_dir(key), MANIFEST_NAME)
        return json_object(raw, path, "remove the store entry and harvest again")

    def read_sha(self, key: Key) -> str:
        path = os.path.join(self.entry_dir(key), SHA_NAME)
        raw = self._read(key, SHA_NAME, 4096)
        if raw is None:
            raise KernelError(f"{path} is missing; remove the entry and harvest again")
        return parse_sha_file(raw.decode("ascii", "replace"), path)

    def open_archive(self, key: Key, size: int | None = None) -> BinaryIO:
        """The archive as a file; ``size`` (archive_bytes) is enforced by unpack, which reads exactly that."""
        entry = self.entry_dir(key)
        try:
            with opened_dir(entry) as dirfd:
                fd, _st = open_file(dirfd, ARCHIVE_NAME, where=entry)
        except FileNotFoundError:
            raise KernelError(
                f"{os.path.join(entry, ARCHIVE_NAME)} is missing; remove the entry and harvest again"
            ) from None
        except SafeFileError as exc:
            raise refusal(exc, f"remove the store entry {entry} and harvest again") from None
        return os.fdopen(fd, "rb")

    def siblings(self, key: Key) -> list[Key]:
        """Keys of complete entries for the same model, mesh and impl_id with other commits."""
        base = os.path.join(self.root, key["model_name"], key["mesh"], key["impl_id"])
        found: list[Key] = []
        try:
            base_fd = open_dir(base)
        except (OSError, SafeFileError):
            return found
        try:
            # Entries sit two levels down (<tt_metal_commit>/<vllm>); links and unreadable parts are skipped.
            for rel, _fd, entries in walk(base_fd, base, onerror=lambda _exc: None):
                parts = rel.split("/")
                if len(parts) == 2 and any(n == MANIFEST_NAME and stat.S_ISREG(st.st_mode) for n, st in entries):
                    tmc, vllm = parts
                    found.append({**key, "tt_metal_commit": tmc, "vllm_commit": None if vllm == NO_VLLM else vllm})
        finally:
            os.close(base_fd)
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key: Key) -> _PathWriter:
        return _PathWriter(self, key)


class TempArchive:
    """The archive being packed: a random O_EXCL temporary file in ``directory``, which is held by descriptor from
    ``prepare`` to ``commit`` or ``abort``. Leftovers of an interrupted run (names starting with ``stale``) go
    first."""

    dir_fd: int | None
    fd: int | None
    tmp: str | None

    def __init__(self, directory: str, hint: str, stale: str, dir_mode: int = DIR_MODE) -> None:
        self.directory = directory
        self.hint = hint
        self.stale = stale
        self.dir_mode = dir_mode
        self.dir_fd = self.fd = self.tmp = None

    def prepare(self) -> int:
        """The descriptor to write the archive to."""
        try:
            self.dir_fd = make_path(self.directory, mode=self.dir_mode)
            with os.scandir(self.dir_fd) as entries:
                stale = [entry.name for entry in entries if entry.name.startswith(self.stale)]
            for name in stale:
                unlink(self.dir_fd, name)
            self.fd, self.tmp = create_temp(self.dir_fd, self.hint, FILE_MODE)
        except BaseException:
            self.abort()
            raise
        return self.fd

    def free_bytes(self) -> int:
        return free_bytes(cast(int, self.dir_fd))  # called between prepare and abort: set

    def abort(self) -> None:
        """Remove the temporary archive (if any) and close the descriptors; safe to call more than once."""
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                unlink(cast(int, self.dir_fd), self.tmp)  # tmp is only set after dir_fd
            self.tmp = None
        for fd in (self.fd, self.dir_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dir_fd = None


class _PathWriter(TempArchive):
    """Writes an entry: the archive into a temporary name renamed into place, then the sha, the manifest last."""

    def __init__(self, store: PathStore, key: Key) -> None:
        super().__init__(store.entry_dir(key), ARCHIVE_NAME, TEMP_PREFIX)

    def commit(self, sha256: str, manifest: JSON) -> None:
        # Called between prepare and abort: the descriptors and the temporary name are set.
        dir_fd, fd, tmp = cast(int, self.dir_fd), cast(int, self.fd), cast(str, self.tmp)
        # A replaced entry must never pair the new archive with the old manifest: drop the manifest first.
        unlink(dir_fd, MANIFEST_NAME)
        set_attrs(fd, FILE_MODE)
        rename(dir_fd, tmp, ARCHIVE_NAME)
        self.tmp = None
        write_atomic(dir_fd, SHA_NAME, f"{sha256}  {ARCHIVE_NAME}\n".encode(), FILE_MODE)
        write_atomic(dir_fd, MANIFEST_NAME, json_bytes(manifest), FILE_MODE)
        self.abort()
