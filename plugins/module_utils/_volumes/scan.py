# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The scan: every ``volume_id_*`` entry under the volume roots, described (type, link, owner, contents, sizes)."""

from __future__ import annotations

import glob
import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    VOLUME_PREFIX,
    parse_volume_name,
    weights_subdir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import name_is_clean
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import (
    MANIFEST_NAME,
    absent_weights,
    tree_size,
    volume_contents,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    JSON = dict[str, Any]


def file_type(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def describe_volume(path: str, model_name: str | None = None, sizes: bool = False) -> JSON:
    """Everything volume_facts reports about one ``volume_id_*`` entry.

    ``model_name`` overrides the name parsed from the entry (weights and
    tensor cache directories are named after the model).
    """
    name = os.path.basename(path)
    info: JSON = {"name": name, "path": path, "root": os.path.dirname(path)}
    info.update(parse_volume_name(name))
    if model_name is not None:
        info["model_name"] = model_name
    lst = os.lstat(path)
    info["type"] = file_type(lst.st_mode)
    info["is_link"] = info["type"] == "link"
    info["link_target"] = os.readlink(path) if info["is_link"] else None
    info["realpath"] = os.path.realpath(path)
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError:
        st = None
    info["exists"] = st is not None and stat.S_ISDIR(st.st_mode)
    info["uid"] = st.st_uid if st is not None else lst.st_uid
    info["gid"] = st.st_gid if st is not None else lst.st_gid
    info["mtime"] = st.st_mtime if st is not None else lst.st_mtime
    model = info["model_name"]
    if info["exists"] and model:
        info.update(volume_contents(path, model))
    else:
        weights_dir = os.path.join(path, weights_subdir(model or ""))
        info["weights"] = absent_weights(weights_dir)
        info["tensor_cache_meshes"] = []
        info["manifest"] = {
            "path": os.path.join(weights_dir, MANIFEST_NAME),
            "present": False,
            "data": None,
            "error": None,
        }
        info["problems"] = []
    if sizes:
        if info["exists"]:
            apparent, disk, complete = tree_size(info["realpath"])
        else:
            apparent, disk, complete = 0, 0, False
        info["size_bytes"] = apparent
        info["disk_usage_bytes"] = disk
        info["size_complete"] = complete
    return info


def expand_roots(patterns: Iterable[str | None]) -> list[str]:
    """Expand ``~`` and globs; keep existing directories once each (by realpath), in order."""
    roots: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if not pattern:
            continue
        expanded = os.path.expanduser(pattern)
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        for match in matches:
            match = os.path.normpath(os.path.abspath(match))
            if not os.path.isdir(match):
                continue
            real = os.path.realpath(match)
            if real in seen:
                continue
            seen.add(real)
            roots.append(match)
    return roots


def scan_root(root: str, sizes: bool = False) -> tuple[list[JSON], list[str]]:
    """Describe every ``volume_id_*`` entry directly under ``root``.

    Returns ``(volumes, warnings)``. Entries whose names hold control
    characters or bytes that are not UTF-8 are skipped with a warning.
    """
    volumes: list[JSON] = []
    warnings: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return volumes, warnings
    except OSError as exc:
        warnings.append(f"cannot list volume root {root}: {exc.strerror or exc}")
        return volumes, warnings
    for name in names:
        if not name.startswith(VOLUME_PREFIX):
            continue
        if not name_is_clean(name):
            warnings.append(f"skipped an entry under {root} with an unusable name: {name!a}")
            continue
        try:
            volumes.append(describe_volume(os.path.join(root, name), sizes=sizes))
        except OSError as exc:
            warnings.append(f"cannot inspect {os.path.join(root, name)}: {exc.strerror or exc}")
    return volumes, warnings


def scan_roots(roots: Iterable[str], sizes: bool = False) -> tuple[list[JSON], list[str]]:
    """``scan_root`` over several roots; returns ``(volumes, warnings)``."""
    volumes = []
    warnings = []
    for root in roots:
        found, warned = scan_root(root, sizes=sizes)
        volumes.extend(found)
        warnings.extend(warned)
    return volumes, warnings
