# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The error of tt-inference-server's rules (specs, names, devices): below every module that applies them."""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError


class SpecError(FleetError):
    """A spec source, a selection or a name that cannot be used; the message says why and how to fix it."""
