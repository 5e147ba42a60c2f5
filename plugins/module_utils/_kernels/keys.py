# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel caches: the key of a store entry, the paths it gives on a volume and in a store, and refusals.

A cache lives at ``<volume>/tt_metal_cache/cache_<model_name>/<mesh>`` (TT_CACHE_PATH). A store entry is
keyed by model_name, mesh, impl_id, tt_metal_commit and vllm_commit. A marker
``cache_<model_name>/.ttfleet-kernels-<mesh>.json`` beside the cache records the key of a cache this code
deployed or harvested, so that a cache built by one tt_metal_commit is never mixed with another.
"""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    tensor_cache_parent,
    tt_metal_cache_subdir,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, ParamSpec, TypedDict, TypeVar

    _P = ParamSpec("_P")
    _R = TypeVar("_R")
    JSON = dict[str, Any]
    Owner = tuple[int, int]

    class Key(TypedDict):
        """A store entry's key, as check_key returns it."""

        model_name: str
        mesh: str
        impl_id: str
        tt_metal_commit: str
        vllm_commit: str | None


KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")
ARCHIVE_NAME = "kernels.tar.zst"
SHA_NAME = ARCHIVE_NAME + ".sha256"
MANIFEST_NAME = "manifest.json"
MARKER_PREFIX = ".ttfleet-kernels-"
NO_VLLM = "none"
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
MANIFEST_MAX = 1 << 20
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9(][A-Za-z0-9._+,()-]*$")


class KernelError(FleetError):
    """A request that cannot be carried out; the message says what, which input and how to fix it."""


LEFT_ALONE = (
    "move it away; root-run code never follows a link, opens a special file or reads outside the volume because of "
    "what a user placed in it"
)


def refusal(exc: SafeFileError, fix: str = LEFT_ALONE) -> KernelError:
    """The KernelError of a path that module_utils._fs refused, naming the path and the fix."""
    return KernelError(f"{exc.path} {exc.reason}. Fix: {fix}")


def refusing(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Any SafeFileError not turned into a more specific KernelError on the way becomes one naming the path."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except SafeFileError as exc:
            raise refusal(exc) from None

    return wrapper


def check_key(key: Mapping[str, Any]) -> Key:
    """The key with every field checked; vllm_commit may be empty (media and forge engines have none)."""
    checked: dict[str, str | None] = {}
    for field in KEY_FIELDS:
        value = key.get(field)
        value = "" if value is None else str(value)
        if field == "vllm_commit" and value in ("", NO_VLLM):
            checked[field] = None
            continue
        if not value:
            raise KernelError(f"{field} is required: take it from the model spec (ttfleet.inference.model_spec)")
        if not _COMPONENT_RE.match(value) or value in (".", ".."):
            raise KernelError(
                f"{field} {value!r} is not usable as a store path component: letters, digits and . _ + , ( ) - only"
            )
        checked[field] = value
    # Every field of KEY_FIELDS is set above, a str (vllm_commit: or None).
    return cast("Key", checked)


def key_text(key: Mapping[str, Any]) -> str:
    vllm = key.get("vllm_commit") or NO_VLLM
    return (
        f"{key['model_name']} on {key['mesh']} ({key['impl_id']}, tt_metal_commit {key['tt_metal_commit']}, "
        f"vllm_commit {vllm})"
    )


def entry_parts(key: Key) -> list[str]:
    """Store path of an entry, relative to the store root."""
    return [key["model_name"], key["mesh"], key["impl_id"], key["tt_metal_commit"], key.get("vllm_commit") or NO_VLLM]


def cache_path(volume: str, key: Key) -> str:
    return os.path.join(volume, tt_metal_cache_subdir(key["model_name"], key["mesh"]))


def cache_parent(volume: str, key: Key) -> str:
    """``<volume>/tt_metal_cache/cache_<model_name>``: the directory holding the caches of all meshes and markers."""
    return os.path.join(volume, tensor_cache_parent(key["model_name"]))


def marker_name(key: Key) -> str:
    return f"{MARKER_PREFIX}{key['mesh']}.json"


def marker_path(volume: str, key: Key) -> str:
    return os.path.join(cache_parent(volume, key), marker_name(key))


def key_mismatch(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields on which two keys differ, as ``[(field, found, wanted)]``."""
    return [
        (field, found.get(field), wanted.get(field))
        for field in KEY_FIELDS
        if (found.get(field) or None) != (wanted.get(field) or None)
    ]


def mismatch_text(where: str, found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    diffs = key_mismatch(found, wanted)
    fields = {field for field, _a, _b in diffs}
    parts = [f"{field} {a or NO_VLLM} (wanted {b or NO_VLLM})" for field, a, b in diffs]
    text = f"{where} was built for {', '.join(parts)}"
    if "tt_metal_commit" in fields:
        text += (
            f"; its tt_metal_commit {found.get('tt_metal_commit')} differs from this spec's tt_metal_commit "
            f"{wanted.get('tt_metal_commit')}, and kernel caches are never mixed across tt_metal_commits"
        )
    return text
