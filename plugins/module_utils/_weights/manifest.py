# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: the manifest ``.ttfleet-manifest.json`` of a weights directory.

What it records for its source (``identity_of``), whether it matches, building and writing it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import FILE_MODE, scrub

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Identity, Owner


COMMIT_SOURCES = ("hf", "s3", "peer")
MANIFEST_SCHEMA = 1
MANIFEST_MAX_BYTES = 64 << 20


def read_manifest(dirfd: int | None, where: str) -> JSON | None:
    """The manifest in ``dirfd``, or None when it is absent or is no small regular file holding JSON (a link or
    FIFO planted in its place counts as absent: the files are then hashed and the manifest written anew)."""
    if dirfd is None:
        return None
    try:
        return read_json(dirfd, MANIFEST_NAME, MANIFEST_MAX_BYTES, where=where)
    except SafeFileError:
        return None


def identity_of(
    source: str, repo_id: str | None = None, revision: str | None = None, path: str | None = None
) -> dict[str, str | None]:
    """What a manifest must record for its files to count as this source's files.

    A repository at a commit is the same bytes wherever they come from, so hf, s3 and peer share one
    identity (repository and revision): weights pulled from a peer or a bucket count as converged for the
    Hub source and the other way round. A path source is identified by its directory.
    """
    if source in COMMIT_SOURCES:
        return {"repo_id": repo_id, "revision": revision}
    return {"source": "path", "repo_id": repo_id, "path": path}


def manifest_matches(manifest: object, identity: Identity) -> bool:
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        return False
    if not isinstance(manifest.get("files"), dict):
        return False
    return all(manifest.get(key) == value for key, value in identity.items())


def build_manifest(
    identity: Identity,
    files: Iterable[JSON],
    endpoint: str | None = None,
    verified_at: str | None = None,
    source: str | None = None,
) -> JSON:
    data = dict(identity)
    data.setdefault("source", source)
    data.update(
        schema=MANIFEST_SCHEMA,
        endpoint=scrub(endpoint) if endpoint else None,
        files={item["path"]: {"size": item["size"], "sha256": item["sha256"]} for item in files},
        verified_at=verified_at,
    )
    return data


def manifest_digest(repo_id: str | None, revision: str | None, files: Iterable[JSON]) -> str | None:
    """The sha256 of the canonical part of a manifest: repository, revision and each file's size and sha256.

    Nothing host-specific (where the files came from, when they were verified) takes part, so every host holding
    the same files of the same commit gets the same digest. The hosts that read the origin return it, and the
    controller hands it to the pullers of the fan-out (``expected_manifest_sha256``): a holder can then serve only
    the origin's files, whatever manifest it writes. None when a file has no sha256 (nothing to anchor).
    """
    listed = {}
    for item in files:
        digest = item.get("sha256")
        if not isinstance(digest, str) or not digest:
            return None
        listed[item["path"]] = {"size": item["size"], "sha256": digest}
    body = {"schema": MANIFEST_SCHEMA, "repo_id": repo_id, "revision": revision, "files": listed}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def manifest_body(manifest: Mapping[str, Any] | None) -> JSON:
    # Where the files came from (hf, s3, a peer) is history, not state: the same repository and commit with
    # the same files is converged whichever source is named now.
    return {key: value for key, value in (manifest or {}).items() if key not in ("verified_at", "source", "endpoint")}


def write_manifest(dest: str, manifest: JSON, owner: Owner | None = None) -> str:
    """Replace the manifest of ``dest`` atomically (random temporary name, rename inside dest)."""
    with opened_dir(dest) as dirfd:
        write_json(dirfd, MANIFEST_NAME, manifest, FILE_MODE, owner, where=dest)
    return os.path.join(dest, MANIFEST_NAME)
