# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filter of the inference_server role. Documentation lives beside this file, one YAML file per filter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_releases = module_utils("_plan.releases")


def release_links(found: Any, target: str, keep: Any, prune: Any = True, links: Any = None) -> dict[str, Any]:
    if not isinstance(found, list) or not all(isinstance(item, Mapping) for item in found):
        raise AnsibleFilterError("release_links: the input must be the files of ansible.builtin.find, a list of dicts.")
    if links is not None and not isinstance(links, list):
        raise AnsibleFilterError("release_links: links must be the results of the stat of current and previous.")
    try:
        prune = boolean(prune, strict=True)
    except TypeError:
        raise AnsibleFilterError(f"release_links: prune must be true or false, got {prune!r}.") from None
    try:
        return _releases.plan_links(found, target, keep, prune, links)
    except _releases.ReleasesError as exc:
        raise AnsibleFilterError(f"release_links: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"release_links: malformed find or stat results ({exc}).") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"release_links": release_links}
