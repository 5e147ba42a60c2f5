# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Filters for the fleet status report."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.module_utils._status import status_lines


def tt_status_lines(rows):
    if not isinstance(rows, list):
        raise AnsibleFilterError(f"tt_status_lines expects the list of report rows, not {type(rows).__name__}")
    return status_lines(rows)


class FilterModule:
    def filters(self):
        return {"tt_status_lines": tt_status_lines}
