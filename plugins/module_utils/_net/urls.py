# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The origin of a URL: (scheme, host, port), what credentials are tied to and what messages name."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    # (scheme, host, port) of a URL, as ``origin_of`` gives it.
    Origin: TypeAlias = tuple[str, str, int | None]


def origin_of(url: str) -> Origin:
    """(scheme, host, port) of ``url``, default ports filled in, host lower-cased."""
    parts = urllib.parse.urlsplit(url)
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def show_origin(url: str) -> str:
    scheme, host, port = origin_of(url)
    return f"{scheme}://{host}:{port}"
