# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The one base class of the errors the collection raises on purpose (STYLE rule 24)."""

from __future__ import annotations


class FleetError(Exception):
    """An error the collection raises on purpose: bad input, or a host, file or server that refuses.

    ``str()`` of it is the message the operator reads, as it is: it says what failed, which input caused it and how
    to fix it, and it never holds a secret. Each subject derives its own class from this one (and from ValueError or
    OSError too where callers catch those), so that one adapter, ``_base.module.fail_on``, turns every one of them
    into a failed task without re-wrapping the message.
    """
