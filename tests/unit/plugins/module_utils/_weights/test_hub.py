# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the Hub listing of _weights.hub (tree entries to file dicts)."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import hf_files
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError


def test_hf_files_reads_lfs_and_git_blobs():
    entries = [
        {"type": "directory", "path": "original", "oid": "1" * 40, "size": 0},
        {"type": "file", "path": "config.json", "oid": "2" * 40, "size": 10},
        {"type": "file", "path": "m.safetensors", "oid": "3" * 40, "size": 132, "lfs": {"oid": "4" * 64, "size": 99}},
        {"type": "file", "path": "original/c.pth", "oid": "5" * 40, "size": 1},
    ]
    files = hf_files(entries)
    assert [(f["path"], f["size"], f["lfs"], f["sha256"], f["blob_sha1"]) for f in files] == [
        ("config.json", 10, False, None, "2" * 40),
        ("m.safetensors", 99, True, "4" * 64, None),
    ]
    with pytest.raises(WeightsError, match="unusable file path"):
        hf_files([{"type": "file", "path": "../../etc/x", "oid": "2" * 40, "size": 1}])
