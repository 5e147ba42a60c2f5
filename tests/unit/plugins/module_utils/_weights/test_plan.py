# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: planning and the disk check of _weights.plan."""

from __future__ import annotations

import os

import pytest
from unit_helpers import make_tree

from ansible_collections.ttfleet.inference.plugins.module_utils._weights import plan as plan_module
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import identity_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.plan import check_disk, plan_weights
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import list_path_source


def test_disk_preflight_message(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "free_bytes", lambda path: 5 << 30)
    dest = str(tmp_path / "vol" / "weights" / "M")
    assert check_disk(dest, 0, 10 << 30, "qb2-1", "M") is None
    with pytest.raises(WeightsError) as exc:
        check_disk(dest, 3 << 30, 10 << 30, "qb2-1", "the weights of org/M")
    msg = str(exc.value)
    assert msg.startswith("qb2-1: not enough free space for the weights of org/M in " + dest)
    assert f"the filesystem of {tmp_path} needs 13.0 GiB (3.0 GiB still to fetch + 10.0 GiB margin" in msg
    assert "has 5.0 GiB free" in msg


def test_plan_classifies_dest(tmp_path):
    src, dest = str(tmp_path / "src"), str(tmp_path / "vol" / "weights" / "M")
    make_tree(src, {"a.json": b"aaaa", "b.bin": b"bbbb", "c.bin": b"cccc", "d/e.txt": b"eeee", "f": b"ffff"})
    make_tree(dest, {"a.json": b"aaaa", "b.bin": b"bb", "c.bin": b"cxcc", "notes.txt": b"mine"})
    os.symlink(os.path.join(src, "f"), os.path.join(dest, "f"))
    files = list_path_source(src)
    identity = identity_of("path", path=src)
    plan = plan_weights(files, dest, identity, "auto", 2)
    assert plan["verified"] == "sha256"
    assert plan["missing"] == ["d/e.txt"]
    assert plan["wrong_size"] == ["b.bin"]
    assert plan["corrupt"] == ["c.bin"]
    assert plan["not_regular"] == ["f"]
    assert plan["to_fetch"] == ["b.bin", "c.bin", "d/e.txt", "f"]
    assert plan["extra"] == ["notes.txt"]
    assert plan["complete"] is False
    assert (plan["files_total"], plan["bytes_total"]) == (5, 20)
