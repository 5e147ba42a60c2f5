# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The errors of the network layer: a failed call (NetError), a proxy's failure (ProxyError) and S3's (S3Error).

A protocol error (``http.client.HTTPException``, a reset, a timeout, a TLS error) is a ``NetError`` naming the
origin and the request; callers count it as a failure.
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError


class NetError(FleetError):
    """A network call that failed: refused, too slow, too large, or not speaking the protocol."""


class ProxyError(NetError, OSError):
    """A proxy that is misconfigured, unreachable, stalls or breaks the protocol; or a request it must not carry.

    An OSError too, so that every caller that counts a failed connection counts this one; ``describe`` keeps its
    message, which names the proxy (never its password) rather than the origin."""


class S3Error(FleetError):
    """A failed S3 request. ``status`` is the HTTP status (None for network errors), ``code`` the S3 error code."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
