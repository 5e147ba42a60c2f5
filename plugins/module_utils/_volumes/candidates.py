# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The volume the spec expects under a root, and the volumes it could be aliased to, best first."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    match_volume_name,
    version_key,
    volume_name,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import describe_volume

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]


def expected_volume(
    root: str, derived: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]] = (), sizes: bool = False
) -> JSON:
    """The volume the spec expects under ``root``.

    ``derived`` is the spec resolution: it needs ``impl_id``, ``model_name``
    and ``version``, and may carry ``volume_name`` and ``mesh``.
    """
    root = os.path.normpath(root)
    name = derived.get("volume_name") or volume_name(derived["impl_id"], derived["model_name"], derived["version"])
    path = os.path.join(root, name)
    for volume in volumes:
        if volume["path"] == path:
            entry: JSON = dict(volume)
            break
    else:
        try:
            entry = describe_volume(path, model_name=derived["model_name"], sizes=sizes)
        except FileNotFoundError:
            entry = {
                "name": name,
                "path": path,
                "root": root,
                "type": "absent",
                "is_link": False,
                "link_target": None,
                "realpath": None,
                "exists": False,
                "problems": [],
            }
    entry["is_alias"] = entry["type"] == "link"
    entry["mesh"] = derived.get("mesh")
    entry["tensor_cache_for_mesh"] = bool(
        derived.get("mesh") and derived.get("mesh") in entry.get("tensor_cache_meshes", ())
    )
    return entry


def _candidate_sort_key(candidate: Mapping[str, Any]) -> tuple[bool, bool, tuple[int, ...], float, bool, str]:
    vkey = version_key(candidate["version"])
    return (
        not candidate["tensor_cache_for_mesh"],
        vkey is None,
        tuple(-part for part in vkey) if vkey else (),
        -candidate["mtime"],
        candidate["is_link"],
        candidate["path"],
    )


def select_candidates(
    volumes: Iterable[Mapping[str, Any]], derived: Mapping[str, Any], expected: Mapping[str, Any]
) -> list[JSON]:
    """Volumes the expected name could be aliased to, best first.

    A candidate has the expected impl_id and model name (another version, a
    build label, or the expected name under another root), is a directory or a
    link to one with usable weights, and is not already what the expected path
    resolves to. Entries resolving to the same directory count once, the real
    directory preferred over links to it. Order: tensor cache for the expected
    mesh first, then versions before build labels and higher versions first,
    then newest mtime, then real directories before links.
    """
    impl_id = derived["impl_id"]
    model_name = derived["model_name"]
    mesh = derived.get("mesh")
    expected_real = expected.get("realpath") if expected.get("exists") else None
    chosen: dict[str, JSON] = {}
    for volume in volumes:
        if volume["path"] == expected["path"]:
            continue
        matched = match_volume_name(volume["name"], impl_id, model_name)
        if matched is None or not volume["exists"]:
            continue
        candidate: JSON = dict(volume)
        if candidate["model_name"] != model_name:
            # The generic parse split a label holding "-v" differently.
            candidate = describe_volume(volume["path"], model_name=model_name, sizes="size_bytes" in volume)
        candidate["impl_id"] = impl_id
        candidate["version"], candidate["label"] = matched
        if not candidate["weights"]["usable"]:
            continue
        if expected_real is not None and candidate["realpath"] == expected_real:
            continue
        candidate["tensor_cache_for_mesh"] = bool(mesh and mesh in candidate["tensor_cache_meshes"])
        previous = chosen.get(candidate["realpath"])
        if previous is None or (previous["is_link"] and not candidate["is_link"]):
            chosen[candidate["realpath"]] = candidate
    return sorted(chosen.values(), key=_candidate_sort_key)
