# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters of the prune playbook: what a host still needs, decided in plugins/module_utils/_plan/prune_needs.py.

Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_errors = module_utils("_base.errors")
_prune_needs = module_utils("_plan.prune_needs")


def _mapping(name: str, value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: {what} must be a dict (a registered result), got {type(value).__name__}.")
    return value


def _dicts(name: str, value: Any, what: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise AnsibleFilterError(f"{name}: {what} must be a list of dicts.")
    return value


def _call(name: str, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except _errors.FleetError as exc:
        raise AnsibleFilterError(f"{name}: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"{name}: malformed input ({exc}).") from None


def prune_releases(status: Any, release_root: Any) -> list[dict[str, Any]]:
    return _call(
        "prune_releases", _prune_needs.kept_releases, _mapping("prune_releases", status, "the input"), release_root
    )


def prune_needs(plans: Any, models: Any, volume_names: Any = None, mirrors: Any = None) -> dict[str, Any]:
    plans = _dicts("prune_needs", plans, "the input (one plan per kept release)")
    models = _dicts("prune_needs", models, "models (the host's tt_models entries)")
    if volume_names is not None and (
        not isinstance(volume_names, list) or not all(isinstance(name, str) for name in volume_names)
    ):
        raise AnsibleFilterError("prune_needs: volume_names must be a list of names.")
    if mirrors is not None and not isinstance(mirrors, Mapping):
        raise AnsibleFilterError("prune_needs: mirrors must be tt_registry_mirrors, a dict.")
    return _call("prune_needs", _prune_needs.host_needs, plans, models, volume_names or [], mirrors or {})


def prune_report(result: Any, host: Any, check_mode: Any = False) -> str:
    try:
        check = boolean(check_mode, strict=True)
    except TypeError:
        raise AnsibleFilterError(f"prune_report: check_mode must be true or false, got {check_mode!r}.") from None
    return _call(
        "prune_report", _prune_needs.report_line, str(host), _mapping("prune_report", result, "the input"), check
    )


def prune_pressure(result: Any, host: Any, inventory: Any = None) -> str:
    if result is not None and not isinstance(result, Mapping):
        raise AnsibleFilterError("prune_pressure: the input must be the result of disk_prune (a dict).")
    if inventory is not None and not isinstance(inventory, (str, Sequence)):
        raise AnsibleFilterError("prune_pressure: inventory must be ansible_inventory_sources, a list of paths.")
    sources = [inventory] if isinstance(inventory, str) else [str(source) for source in inventory or []]
    return _call("prune_pressure", _prune_needs.pressure_text, str(host), result, sources)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "prune_releases": prune_releases,
            "prune_needs": prune_needs,
            "prune_report": prune_report,
            "prune_pressure": prune_pressure,
        }
