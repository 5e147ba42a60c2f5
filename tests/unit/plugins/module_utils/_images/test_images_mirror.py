# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""image_mirror's logic (_images.mirror): credentials per registry, the copy between two registries."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._images import mirror
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError


def test_image_mirror_binds_the_old_options_to_one_registry():

    params = {
        "registry_credentials": [],
        "source_registry": None,
        "source_username": "fleet",
        "source_password": "pw",
        "target_username": None,
        "target_password": None,
    }
    with pytest.raises(ImageError, match="never sent to every origin: give both with source_registry"):
        mirror.logins_of(params, {"site.example:5000"})
    params["source_registry"] = "ghcr.io"
    assert set(mirror.logins_of(params, {"site.example:5000"})) == {"ghcr.io"}
    params.update(target_username="push", target_password="pp")
    with pytest.raises(ImageError, match=r"the targets name a\.example:5000, b\.example:5000"):
        mirror.logins_of(params, {"a.example:5000", "b.example:5000"})
    assert mirror.logins_of(params, {"a.example:5000"})["a.example:5000"].auth == ("push", "pp")
