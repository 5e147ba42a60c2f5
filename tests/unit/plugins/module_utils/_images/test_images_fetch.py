# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""container_image's logic (_images.fetch): the plan, check mode, the result and the diff."""

from __future__ import annotations

import pytest
from images_helpers import save_tar

from ansible_collections.ttfleet.inference.plugins.module_utils._images import fetch
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent


def test_check_mode_on_a_host_without_its_engine_yet_counts_every_image_to_fetch(tmp_path):
    # A bare host under --check: tt_host would install the engine in the same run, so the plan is "fetch it all".

    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, ["reg.example:5000/tt/x:1.0"])
    item = {"image": "reg.example:5000/tt/x:1.0", "archive": str(archive), "archive_sha256": image_id}
    params = {"images": [item], "pull": True}
    warnings = []
    engine = Engine(str(tmp_path / "none.sock"))
    plan = fetch.plan(params, engine, True, warnings.append)
    size = archive.stat().st_size
    assert [(e["source"], e["size"], e["record"], e["expected_id"]) for e in plan] == [
        ("archive", size, None, image_id)
    ]
    assert len(warnings) == 1 and "no Docker engine answers" in warnings[0] and "check mode" in warnings[0]
    # A real run still fails with the fix named.
    with pytest.raises(EngineAbsent, match="install and start it"):
        fetch.plan(params, engine, False, warnings.append)
