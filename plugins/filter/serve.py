# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters of the serve role. Documentation lives beside this file, one YAML file per filter."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.module_utils._serve import ServeError, plan_instances


def serve_instances(models: object, device: str | None, base_port: int | str = 8000) -> dict[str, object]:
    if not isinstance(models, list):
        raise AnsibleFilterError("serve_instances: the input must be tt_models, a list of dicts.")
    try:
        instances, problems = plan_instances(models, device, int(base_port))
    except (ServeError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"serve_instances: {exc}") from exc
    return {"instances": instances, "problems": problems}


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"serve_instances": serve_instances}
