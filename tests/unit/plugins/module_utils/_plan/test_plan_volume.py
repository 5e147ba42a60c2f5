# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The volume plan (module_utils/_plan/volume.py): the releases whose specs date a candidate's kernel cache."""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import volume


def test_other_releases_are_the_siblings_of_the_current_one(tmp_path):
    releases = tmp_path / "releases"
    for tag in ("v0.16.0", "v0.18.0", "v0.20.0"):
        (releases / tag).mkdir(parents=True)
    (tmp_path / "current").symlink_to("releases/v0.20.0")
    found = volume.other_releases(None, str(tmp_path / "current"))
    assert found == [str(releases / "v0.16.0"), str(releases / "v0.18.0")]
    # A checkout outside the role's layout (or a spec file) has no siblings to consult unless they are named.
    assert volume.other_releases(None, str(tmp_path / "releases")) == []
    assert volume.other_releases(None, None) == []
    named = volume.other_releases([str(releases / "*")], str(releases / "v0.18.0"))
    assert named == [str(releases / "v0.16.0"), str(releases / "v0.20.0")]
