# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What the preflight checks count per model: its spec's requirements and whether its weights are on the host.

It resolves specs (``_spec``) and scans volumes (``_volumes``), both above ``_host``, so it lives here and
``_host.preflight.evaluate`` takes its summaries as input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve_entry
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.candidates import (
    expected_volume,
    select_candidates,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import check_path_text
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import expand_roots, scan_roots

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    # A model entry or a summary.
    JSON = dict[str, Any]


def model_summaries(
    catalog: Any,
    models: Iterable[Mapping[str, Any]],
    device: str,
    volume_root: object,
    preseeded_roots: Iterable[str] | None = (),
) -> tuple[list[JSON], list[str]]:
    """Per present model: its spec's requirements and whether its weights are already complete.

    Weights count as present when the expected volume under ``volume_root`` holds usable weights
    or when a volume under ``volume_root`` or ``preseeded_roots`` can be aliased to it; such a
    model needs no disk for weights. Returns ``(summaries, warnings)``.
    """
    root = check_path_text(volume_root, "volume_root")
    volumes, warnings = scan_roots(expand_roots([root, *(preseeded_roots or [])]))
    summaries: list[JSON] = []
    for entry in models:
        derived = resolve_entry(catalog, entry, device, volume_root=root)
        expected = expected_volume(root, derived, volumes)
        weights_path = None
        if (expected.get("weights") or {}).get("usable"):
            weights_path = expected["path"]
        else:
            candidates = select_candidates(volumes, derived, expected)
            if candidates:
                weights_path = candidates[0]["path"]
        min_disk = derived.get("min_disk_gb") or 0
        summaries.append(
            {
                "name": entry["name"],
                "model_name": derived["model_name"],
                "device": derived["device"],
                "impl_id": derived["impl_id"],
                "volume_name": derived["volume_name"],
                "volume_path": expected["path"],
                "min_disk_gb": derived.get("min_disk_gb"),
                "weights_present": weights_path is not None,
                "weights_path": weights_path,
                "counted_disk_gb": 0 if weights_path else min_disk,
                "min_ram_gb": derived.get("min_ram_gb"),
                "system_requirements": derived.get("system_requirements"),
                "boards": entry.get("boards") or {},
                "spec_source": derived.get("spec_source"),
                "profile": derived.get("profile"),
            }
        )
    return summaries, warnings
