# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Paths and entry names given to the volume code, checked before any filesystem call; the error it raises."""

from __future__ import annotations

import os
import re

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class VolumeError(FleetError):
    """A request that cannot be carried out safely; the message says why and how to fix it."""


def check_path_text(value: object, what: str) -> str:
    """Return ``value`` if it is a usable absolute path string, else raise VolumeError.

    Runs before any filesystem call: NUL and control characters, text that is
    not valid UTF-8 and relative paths are refused.
    """
    if not isinstance(value, str) or not value:
        raise VolumeError(f"{what} must be a non-empty path, got {value!r}")
    if _CONTROL_RE.search(value):
        raise VolumeError(f"{what} {value!r} contains NUL or control characters; pass a plain path")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise VolumeError(f"{what} {value!r} is not valid UTF-8") from None
    if not os.path.isabs(value):
        raise VolumeError(f"{what} {value!r} must be an absolute path")
    return value


def name_is_clean(name: str) -> bool:
    if _CONTROL_RE.search(name):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
