# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What the peer server hands out (the *catalog*), fixed when the server starts, for the weights of one model
(``kind="weights"``) and for the kernel caches of a kernel-store spool (``kind="kernels"``). One code path for both:

- ``weights``: the files that the directory's ``.ttfleet-manifest.json`` lists, and the manifest;
- ``kernels``: the three files of every complete store entry, ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/
  <vllm_commit>/{manifest.json, kernels.tar.zst, kernels.tar.zst.sha256}`` (the layout of
  ``_kernels.path_store.PathStore``).

The directory may be writable by a non-root user, so the catalog is found by a walk that never follows a link,
and each file is pinned by ``(st_dev, st_ino, size)``. The daemon keeps a descriptor of the directory and opens
a requested file per request component by component relative to it with ``O_NOFOLLOW``; a link, a special file
or any other inode or size than the pinned one is refused (403), a name outside the catalog is 404. A file
swapped for a link to an outside file is therefore never served. A file with several hard links is served only
when every local user could read it anyway (a planted hard link to a root-only file is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir, open_relative
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file, open_path, read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import ARCHIVE_NAME, SHA_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    MANIFEST_NAME as KERNEL_MANIFEST_NAME,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import SHORT_OF, PeerError, Refused, reason
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME

if TYPE_CHECKING:
    # (st_dev, st_ino, size) of a catalog file
    Pin = tuple[int, int, int]

KINDS = ("weights", "kernels")
KERNEL_ENTRY_FILES = (KERNEL_MANIFEST_NAME, ARCHIVE_NAME, SHA_NAME)
# model/mesh/impl_id/tt_metal_commit/vllm_commit
KERNEL_ENTRY_DEPTH = 5


def _disclosable(st: os.stat_result) -> bool:
    """Whether a regular file may go to a peer: a file with several hard links could be a link to a root-only
    file that a user placed here (where ``fs.protected_hardlinks`` is off), so it is served only when every
    local user could read it anyway."""
    return st.st_nlink <= 1 or bool(st.st_mode & stat.S_IROTH)


def _pin_file(dirfd: int, name: str) -> Pin | None:
    """``(st_dev, st_ino, size)`` of the regular file ``name`` in ``dirfd``; None when it is missing, a link,
    a special file or not disclosable."""
    try:
        fd, st = open_file(dirfd, name)
    except (OSError, SafeFileError):
        return None
    os.close(fd)
    return (st.st_dev, st.st_ino, st.st_size) if _disclosable(st) else None


def _pin_path(rootfd: int, rel: str) -> Pin | None:
    head, _sep, name = rel.rpartition("/")
    try:
        dirfd = open_relative(rootfd, head)
    except (OSError, SafeFileError):
        return None
    try:
        return _pin_file(dirfd, name)
    finally:
        os.close(dirfd)


class Catalog:
    """The files a server hands out, ``{relative path: (st_dev, st_ino, size)}``, pinned below the directory
    descriptor ``fd`` (which the daemon keeps and serves from)."""

    def __init__(self, directory: str, kind: str = "weights") -> None:
        if kind not in KINDS:
            raise PeerError(f"kind {kind!r} must be one of {', '.join(KINDS)}")
        self.directory = os.path.normpath(directory)
        self.kind = kind
        try:
            self.fd = open_dir(self.directory)
        except (OSError, SafeFileError) as exc:
            raise PeerError(f"cannot open {self.directory}: {reason(exc)}") from None
        try:
            self.files = self._weights() if kind == "weights" else self._kernels()
        except BaseException:
            os.close(self.fd)
            raise

    def _weights(self) -> dict[str, Pin]:
        try:
            manifest = read_json(self.fd, MANIFEST_NAME, where=self.directory)
        except (OSError, SafeFileError) as exc:
            raise PeerError(self._unreadable(reason(exc))) from None
        if manifest is None:
            raise PeerError(self._unreadable("it is missing"))
        listed = manifest.get("files")
        if not isinstance(listed, dict) or not listed:
            raise PeerError(
                f"{os.path.join(self.directory, MANIFEST_NAME)} lists no files; only complete weights can be served"
            )
        files: dict[str, Pin] = {}
        for rel in [MANIFEST_NAME, *listed]:
            if not isinstance(rel, str) or rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
                continue
            pin = _pin_path(self.fd, rel)
            if pin is not None:
                files[rel] = pin
        return files

    def _unreadable(self, problem: str) -> str:
        return (
            f"{self.directory} has no readable {MANIFEST_NAME} ({problem}); only weights this collection placed "
            "can be served"
        )

    def _kernels(self) -> dict[str, Pin]:
        files: dict[str, Pin] = {}
        for rel, dirfd, entries in walk(self.fd, self.directory, onerror=lambda _exc: None):
            if not rel or rel.count("/") != KERNEL_ENTRY_DEPTH - 1:
                continue
            regular = {name for name, st in entries if stat.S_ISREG(st.st_mode)}
            # manifest.json is written last: an entry without it (or without its archive) is incomplete.
            if not regular.issuperset(KERNEL_ENTRY_FILES):
                continue
            pins = {name: _pin_file(dirfd, name) for name in KERNEL_ENTRY_FILES}
            if all(pins.values()):
                # all() above: every pin is a tuple, none is None
                files.update({f"{rel}/{name}": cast("Pin", pin) for name, pin in pins.items()})
        if not files:
            raise PeerError(
                f"{self.directory} holds no complete kernel store entry (<model>/<mesh>/<impl_id>/<tt_metal_commit>/"
                f"<vllm_commit>/ with {', '.join(KERNEL_ENTRY_FILES)}); pack a cache into it first"
            )
        return files

    @property
    def digest(self) -> str:
        """A digest of what is served: a server started for another catalog is restarted."""
        body = json.dumps([self.kind, self.directory, sorted(self.files.items())])
        return hashlib.sha256(body.encode()).hexdigest()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_pinned(rootfd: int, rel: str, pin: Pin) -> tuple[int, int]:
    """``(fd, size)`` of the catalog file ``rel``, opened relative to ``rootfd`` without following a link;
    Refused(404) when it is gone, Refused(403) when it is not the very file pinned at start."""
    try:
        fd, st = open_path(rel, rootfd)
    except FileNotFoundError:
        raise Refused(404) from None
    except OSError as exc:
        # Out of descriptors or memory is the server's state, not the file's: the peer retries.
        raise Refused(503 if exc.errno in SHORT_OF else 403) from None
    except SafeFileError:
        raise Refused(403) from None
    if (st.st_dev, st.st_ino, st.st_size) != pin or not _disclosable(st):
        os.close(fd)
        raise Refused(403)
    return fd, st.st_size
