# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the manifest of _weights.manifest."""

from __future__ import annotations

import os

from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import read_json_path
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import (
    build_manifest,
    identity_of,
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
