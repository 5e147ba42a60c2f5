# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filter tt_model_entries: tt_models with serve profiles and model packages applied (documented beside)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_packages = module_utils("_ttis.packages")


def tt_model_entries(
    models: object,
    device: str | None,
    packages: dict[str, object] | None = None,
    profiles: dict[str, object] | None = None,
) -> list[dict[str, object]]:
    if not isinstance(models, list):
        raise AnsibleFilterError("tt_model_entries: the input must be tt_models, a list of dicts.")
    try:
        return _packages.expand_entries(models, device, packages or {}, profiles or {})
    except (_packages.ProfileError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"tt_model_entries: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"tt_model_entries": tt_model_entries}
