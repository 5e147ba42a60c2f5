# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The facts of ttfleet.inference.tt_facts, gathered by it or by tt_preflight's ``gather`` (one module call, issue 34).

The hardware, driver, hugepages, Docker, memory and disk (``_host.facts.gather``) and, when asked, what is installed
(``_host.installed``) in ``tt.installed``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._host.facts import gather
from ansible_collections.ttfleet.inference.plugins.module_utils._host.installed import (
    dpkg_packages,
    path_link,
    unit_states,
    venv_distributions,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# tt_facts' options, with their defaults; tt_preflight's ``gather`` takes the same.
OPTIONS: dict[str, dict[str, Any]] = dict(
    volume_root=dict(type="path", default="/var/lib/tt-cache"),
    tt_smi=dict(type="str", default="tt-smi"),
    tt_smi_timeout=dict(type="int", default=30),
    declared_device=dict(type="str"),
    docker_socket=dict(type="path", default="/var/run/docker.sock"),
    packages=dict(type="list", elements="str", default=[]),
    services=dict(type="list", elements="str", default=[]),
    venv=dict(type="path"),
    distributions=dict(type="list", elements="str", default=[]),
    release_dir=dict(type="path"),
)


class CollectError(FleetError, ValueError):
    """An option that cannot be used; the message names it and the fix."""


def collect(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tt`` facts for ``params`` (tt_facts' options); raises CollectError for a bad option."""
    if params["tt_smi_timeout"] < 1:
        raise CollectError(f"tt_smi_timeout must be at least 1 second, got {params['tt_smi_timeout']}")
    if not os.path.isabs(params["volume_root"]):
        raise CollectError(f"volume_root must be an absolute path, got {params['volume_root']!r}")
    if params["distributions"] and not params["venv"]:
        raise CollectError("distributions needs venv, the virtual environment to look for them in")
    for name in ("venv", "release_dir"):
        if params[name] is not None and not os.path.isabs(params[name]):
            raise CollectError(f"{name} must be an absolute path, got {params[name]!r}")
    facts = gather(
        tt_smi=params["tt_smi"],
        volume_root=params["volume_root"],
        declared_device=params["declared_device"],
        docker_socket=params["docker_socket"],
        timeout=params["tt_smi_timeout"],
        path_env=os.environ.get("PATH", ""),
    )
    if params["packages"] or params["services"] or params["distributions"] or params["release_dir"]:
        facts["installed"] = {
            "packages": dpkg_packages(params["packages"]),
            "services": unit_states(params["services"]),
            "distributions": venv_distributions(params["venv"], params["distributions"]) if params["venv"] else {},
            "release_dir": path_link(params["release_dir"]) if params["release_dir"] else None,
        }
    return facts
