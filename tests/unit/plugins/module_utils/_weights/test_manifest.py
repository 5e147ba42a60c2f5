# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the manifest of _weights.manifest."""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json_path
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import (
    build_manifest,
    identity_of,
    manifest_digest,
    manifest_matches,
    write_manifest,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import TEMP_PREFIX

REPO = "ttfleet-lab/Tiny-Llama-2L"


def test_manifest_round_trip(tmp_path):
    identity = identity_of("hf", REPO, "c" * 40)
    files = [{"path": "config.json", "size": 3, "sha256": "d" * 64}]
    manifest = build_manifest(identity, files, "https://u:p@mirror.lab", "2026-11-30T00:00:00Z")
    path = write_manifest(str(tmp_path), manifest)
    assert path == str(tmp_path / ".ttfleet-manifest.json")
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    data = read_json_path(path)
    assert data == manifest
    assert data["endpoint"] == "https://********@mirror.lab"
    assert data["files"] == {"config.json": {"size": 3, "sha256": "d" * 64}}
    assert manifest_matches(data, identity)
    assert not manifest_matches(data, identity_of("hf", REPO, "e" * 40))
    assert not manifest_matches(data, identity_of("path", REPO, path="/x"))
    assert [name for name in os.listdir(tmp_path) if name.startswith(TEMP_PREFIX)] == []


def test_manifest_digest_is_the_canonical_part_only():
    files = [{"path": "b.bin", "size": 2, "sha256": "b" * 64}, {"path": "a.json", "size": 1, "sha256": "a" * 64}]
    digest = manifest_digest(REPO, "c" * 40, files)
    # Independent of order and of anything host-specific (where from, when verified, staging marks).
    assert digest == manifest_digest(REPO, "c" * 40, [dict(files[1], dest_ino=(1, 2), lfs=True), files[0]])
    body = {
        "schema": 1,
        "repo_id": REPO,
        "revision": "c" * 40,
        "files": {"a.json": {"size": 1, "sha256": "a" * 64}, "b.bin": {"size": 2, "sha256": "b" * 64}},
    }
    assert digest == hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    # The manifest a host writes gives the same digest as what it fetched.
    written = build_manifest(identity_of("peer", REPO, "c" * 40), files, "http://10.0.0.2:1", "2026-12-05T00:00:00Z")
    listed = [{"path": rel, **entry} for rel, entry in written["files"].items()]
    assert manifest_digest(written["repo_id"], written["revision"], listed) == digest


def test_manifest_digest_changes_with_any_file_size_digest_or_revision():
    files = [{"path": "a.bin", "size": 2, "sha256": "b" * 64}]
    digest = manifest_digest(REPO, "c" * 40, files)
    assert manifest_digest(REPO, "c" * 40, [dict(files[0], sha256="e" * 64)]) != digest
    assert manifest_digest(REPO, "c" * 40, [dict(files[0], size=3)]) != digest
    assert manifest_digest(REPO, "d" * 40, files) != digest
    assert manifest_digest(REPO, "c" * 40, [*files, {"path": "x", "size": 0, "sha256": "f" * 64}]) != digest


def test_manifest_digest_is_none_without_every_sha256():
    assert manifest_digest(REPO, "c" * 40, [{"path": "a", "size": 1, "sha256": None}]) is None
