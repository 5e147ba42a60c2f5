# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the digests of _weights.hashing."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import (
    git_blob_sha1,
    hash_file,
    hash_files,
)


def test_git_blob_sha1_matches_git(tmp_path):
    assert git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    content = b'{"model_type": "llama"}\n'
    (tmp_path / "f").write_bytes(content)
    out = subprocess.run(["git", "hash-object", str(tmp_path / "f")], capture_output=True, text=True, check=True)
    assert git_blob_sha1(content) == out.stdout.strip()
    digests = hash_file(str(tmp_path / "f"), blob=True)
    assert digests == {"sha256": hashlib.sha256(content).hexdigest(), "blob_sha1": out.stdout.strip(), "size": 24}


@pytest.mark.skipif(os.geteuid() != 0, reason="the layout and the planted files need root")
def test_hash_file_refuses_links_and_fifos(tmp_path, no_hang):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    for name in ("fifo", "link"):
        with pytest.raises(SafeFileError):
            hash_file(str(tmp_path / name))
    got = hash_files({"k": (str(tmp_path / "fifo"), False)}, 1)
    assert "is a fifo, not a regular file" in got["k"]["error"]
