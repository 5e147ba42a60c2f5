# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters of the metrics role: its targets and host settings, decided in plugins/module_utils/_plan/metrics.py.

Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_metrics = module_utils("_plan.metrics")


def metrics_host_targets(
    report: Any, host: Any, address: Any, site: Any = "", device: Any = "", node_port: Any = 9100
) -> dict[str, Any]:
    try:
        return _metrics.host_targets(report, str(host), address, site, device, node_port)
    except _metrics.MetricsError as exc:
        raise AnsibleFilterError(f"metrics_host_targets: {exc}") from exc


def metrics_file_sd(
    targets: Any, existing: Any = None, play_hosts: Any = (), inventory_hosts: Any = ()
) -> dict[str, Any]:
    if not isinstance(targets, list):
        raise AnsibleFilterError("metrics_file_sd: the input must be the list of the hosts' metrics_host_targets.")
    return _metrics.file_sd(
        targets, existing if isinstance(existing, dict) else None, list(play_hosts), list(inventory_hosts)
    )


def metrics_host_settings(
    textfile_dir: Any,
    volume_roots: Any = (),
    device: Any = "",
    facts: Any = None,
    margin_gb: Any = 10,
    prune_report: Any = "",
    cache_scan_seconds: Any = 3600,
) -> dict[str, Any]:
    if isinstance(volume_roots, str) or not isinstance(volume_roots, (list, tuple)):
        raise AnsibleFilterError("metrics_host_settings: volume_roots must be a list of paths.")
    try:
        return _metrics.host_settings(
            textfile_dir, volume_roots, device, facts, margin_gb, prune_report, cache_scan_seconds
        )
    except _metrics.MetricsError as exc:
        raise AnsibleFilterError(f"metrics_host_settings: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "metrics_host_targets": metrics_host_targets,
            "metrics_file_sd": metrics_file_sd,
            "metrics_host_settings": metrics_host_settings,
        }
