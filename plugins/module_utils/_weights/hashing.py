# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: digests of file contents, sha256 and the git blob sha1 the Hub's tree API gives."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON


HASH_CHUNK = 8 << 20


def blob_header(size: int) -> bytes:
    """Prefix git hashes before the content: the tree API's ``oid`` of a non-LFS file is sha1 of both."""
    return b"blob %d\0" % size


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(blob_header(len(content)) + content, usedforsecurity=False).hexdigest()


class Digests:
    """sha256 of the content, plus the git blob sha1 when the size is known up front."""

    def __init__(self, blob_size: int | None = None) -> None:
        self.sha256 = hashlib.sha256()
        self.sha1 = None
        if blob_size is not None:
            self.sha1 = hashlib.sha1(blob_header(blob_size), usedforsecurity=False)

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.sha1 is not None:
            self.sha1.update(data)

    def result(self) -> JSON:
        return {"sha256": self.sha256.hexdigest(), "blob_sha1": self.sha1.hexdigest() if self.sha1 else None}


def hash_file(path: str, blob: bool = False) -> JSON:
    """Digests of the regular file ``path`` read in 8 MiB blocks; ``blob`` adds the git blob sha1.

    Opened without following a link and refused when it is not a regular file (a FIFO never blocks)."""
    fd, st = open_path(path)
    with os.fdopen(fd, "rb") as handle:
        size = st.st_size
        digests = Digests(size if blob else None)
        while True:
            block = handle.read(HASH_CHUNK)
            if not block:
                break
            digests.update(block)
    result = digests.result()
    result["size"] = size
    return result


def hash_files(requests: Mapping[tuple[str, str], tuple[str, bool]], workers: int) -> dict[tuple[str, str], JSON]:
    """Hash ``{key: (path, blob)}`` in parallel; returns ``{key: digests}`` (a file that cannot be read, or is
    no regular file, becomes ``{"error"}``).

    hashlib releases the GIL on large blocks, so threads use several cores.
    """

    def one(item: tuple[tuple[str, str], tuple[str, bool]]) -> tuple[tuple[str, str], JSON]:
        key, (path, blob) = item
        try:
            return key, hash_file(path, blob)
        except SafeFileError as exc:
            return key, {"error": str(exc)}
        except OSError as exc:
            return key, {"error": f"{path}: {exc.strerror or exc}"}

    if not requests:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(requests)))) as pool:
        return dict(pool.map(one, sorted(requests.items())))
