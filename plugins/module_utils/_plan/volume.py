# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The volume plan of a resolved spec: its expected volume under the volume root and the volumes that could fill it,
for model_cache_plan (through ``_plan.cache``) and ttfleet.inference.volume_facts alike."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import annotate_candidates, release_commits
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import iter_specs
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.checkout import load_checkout
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.candidates import (
    expected_volume,
    select_candidates,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    JSON = dict[str, Any]
    Lookup = Callable[[str], "tuple[str, str] | None"]


def other_releases(patterns: Sequence[str] | None, checkout: str | None) -> list[str]:
    """Release checkouts to consult for candidates' commits: the given globs, else the default checkout's siblings."""
    if patterns is None:
        if not checkout:
            return []
        real = os.path.realpath(checkout)
        if os.path.basename(os.path.dirname(real)) != "releases":
            return []
        patterns = [os.path.join(os.path.dirname(real), "*")]
    current = os.path.realpath(checkout) if checkout else None
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            real = os.path.realpath(path)
            if os.path.isdir(real) and real != current and real not in found:
                found.append(real)
    return found


def commit_lookup(dirs: Sequence[str], derived: Mapping[str, Any], warn: Callable[[str], object]) -> Lookup:
    """``lookup(version)`` over the specs of ``dirs``, loading them once and only when first asked."""
    cache: dict[str, dict[str, tuple[str, str]]] = {}

    def lookup(version: str) -> tuple[str, str] | None:
        if "commits" not in cache:
            catalogs = []
            for path in dirs:
                try:
                    catalogs.append(load_checkout(path))
                except SpecError as exc:
                    warn(f"cannot read the specs of {path} to date a candidate's kernel cache: {exc}")
            cache["commits"] = release_commits(catalogs, derived, iter_specs)
        return cache["commits"].get(str(version))

    return lookup


def plan_volume(
    root: str,
    volumes: Sequence[Mapping[str, Any]],
    derived: Mapping[str, Any],
    release_dirs: Sequence[str],
    warn: Callable[[str], object],
    isolate: bool = True,
    sizes: bool = False,
) -> tuple[JSON, list[JSON], list[str]]:
    """``(expected, candidates, warnings)``: the volume the spec expects under ``root`` and what could fill it.

    ``volumes`` is the scan of every root (``_volumes.scan_roots``); ``release_dirs`` are the other releases whose
    specs date a candidate's kernel cache (``other_releases``), read only when a candidate records nothing.
    """
    expected = expected_volume(root, derived, volumes, sizes=sizes)
    candidates = select_candidates(volumes, derived, expected)
    lookup = commit_lookup(release_dirs, derived, warn) if candidates and expected["type"] == "absent" else None
    candidates = annotate_candidates(candidates, derived, root, lookup=lookup, isolate=isolate)
    warnings = []
    if candidates and expected["type"] == "absent" and candidates[0]["reuse"] == "symlink":
        best = candidates[0]
        if best["kernels"] != "same" and not best["same_filesystem"] and isolate:
            warnings.append(f"{expected['path']}: {best['reuse_reason']}")
    return expected, candidates, warnings
