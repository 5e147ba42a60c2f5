# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The status file of module_utils._host.progress."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress


def test_progress_status_file(tmp_path):
    now = [100.0]
    seen = []
    status = str(tmp_path / "status.json")
    progress = Progress(1000, status, lambda *args: seen.append(args), interval=2.0, clock=lambda: now[0])
    progress.advance(100, "a")
    first = json.loads(Path(status).read_text())
    now[0] = 101.0
    progress.advance(100, "a")
    assert json.loads(Path(status).read_text()) == first  # throttled
    now[0] = 102.0
    progress.advance(300, "b")
    data = json.loads(Path(status).read_text())
    assert (data["done_bytes"], data["total_bytes"], data["file"], data["rate"], data["eta"]) == (
        500,
        1000,
        "b",
        250.0,
        2.0,
    )
    assert seen[-1] == (500, 1000, "b")
