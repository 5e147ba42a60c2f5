# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel cache store entries, whatever the store (a directory, an HTTP server, an S3 bucket).

An entry holds three files: ``kernels.tar.zst`` (a tar of the cache directory compressed with the zstd program), its
sha256 in ``kernels.tar.zst.sha256`` (sha256sum format) and ``manifest.json`` (the key, counts, sha256). The manifest
is written last: an entry without one is incomplete and never read.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    KEY_FIELDS,
    KernelError,
    key_mismatch,
    mismatch_text,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import Scan


SCHEMA = 1
KIND = "ttfleet.kernel_cache"
SHA_MAX = 4096  # a kernels.tar.zst.sha256 file (sha256sum format: one line)
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


def json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def json_object(raw: bytes, where: str, fix: str) -> JSON:
    """The JSON object in ``raw`` (a manifest read from a store); KernelError naming ``where`` and ``fix``."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise KernelError(f"{where} is not JSON; {fix}") from None
    if not isinstance(data, dict):
        raise KernelError(f"{where} is not a JSON object; {fix}")
    return data


def build_manifest(
    key: Key,
    sha256: str,
    archive_bytes: int,
    scan: Scan,
    host: str,
    evidence: str | None,
    now: float | None = None,
) -> JSON:
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "key": {field: key.get(field) for field in KEY_FIELDS},
        "archive": ARCHIVE_NAME,
        "compression": "zstd",
        "sha256": sha256,
        "archive_bytes": archive_bytes,
        "files": scan["files"],
        "bytes": scan["bytes"],
        "host": host,
        "evidence": evidence,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }


def check_manifest(manifest: JSON, key: Key, where: str) -> JSON:
    """A store manifest that describes an archive of exactly ``key``; raises otherwise."""
    if manifest.get("kind") != KIND or manifest.get("schema") != SCHEMA:
        raise KernelError(
            f"{where} is not a kernel cache manifest of schema {SCHEMA}; remove the entry and harvest again"
        )
    found = cast("dict[str, Any]", manifest.get("key")) if isinstance(manifest.get("key"), dict) else {}
    if key_mismatch(found, key):
        raise KernelError(
            f"{mismatch_text(where, found, key)}; this store entry is misplaced: remove it and harvest again"
        )
    sha = str(manifest.get("sha256") or "")
    counts = [manifest.get(name) for name in ("files", "bytes", "archive_bytes")]
    if not HEX64_RE.match(sha) or not all(isinstance(c, int) and c >= 0 for c in counts):
        raise KernelError(f"{where} lacks a sha256, file count or byte counts; remove the entry and harvest again")
    return manifest


def parse_sha_file(text: str, where: str) -> str:
    fields = text.split()
    if not fields or not HEX64_RE.match(fields[0].lower()):
        raise KernelError(f"{where} does not start with a sha256; remove the entry and harvest again")
    return fields[0].lower()
