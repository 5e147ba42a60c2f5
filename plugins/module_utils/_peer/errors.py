# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Errors of the peer server: the one raised to the caller, and a request's refusal."""

from __future__ import annotations

import errno

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

# Out of descriptors or memory: the server's state, not the request's (accept pauses, a file open answers 503).
SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class PeerError(FleetError):
    """A server that cannot start or stop; the message names the input and the fix."""


def reason(exc: OSError | SafeFileError) -> str:
    if isinstance(exc, SafeFileError):
        return str(exc)
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if getattr(exc, "filename", None) else "")


class Refused(Exception):
    """A request answered with the HTTP status ``code`` and no body."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
