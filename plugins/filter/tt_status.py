# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Filters for the fleet status report."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_status = module_utils("_plan.status")


def _rows(rows: object, name: str) -> list[object]:
    if not isinstance(rows, list):
        raise AnsibleFilterError(f"{name} expects the list of report rows, not {type(rows).__name__}")
    return rows


def tt_status_lines(rows: object) -> list[str]:
    return _status.status_lines(_rows(rows, "tt_status_lines"))


def tt_status_summary(rows: object) -> dict[str, object]:
    return _status.status_summary(_rows(rows, "tt_status_summary"))


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"tt_status_lines": tt_status_lines, "tt_status_summary": tt_status_summary}
