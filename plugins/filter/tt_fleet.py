# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters over the fleet contract. Documentation lives beside this file, one YAML file per filter."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_fleet = module_utils("_plan.fleet")


def tt_model_conflicts(models: object) -> list[str]:
    if not isinstance(models, list) or not all(isinstance(m, dict) and "name" in m for m in models):
        raise AnsibleFilterError("tt_model_conflicts: the input must be tt_models, a list of dicts with a name each.")
    return _fleet.model_conflicts(models)


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"tt_model_conflicts": tt_model_conflicts}
