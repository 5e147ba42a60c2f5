# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What the metrics role writes: each host's Prometheus targets, the fleet's file_sd files and the host settings the
health runs read (no Ansible imports: unit-testable).

- ``host_targets``: one host's scrape targets, from its fleet_status result: every served instance's ``/metrics``
  (vLLM's, open without the API key) and the host's node_exporter, labelled host, instance, model, device, release,
  profile and site.
- ``file_sd``: the fleet's file_sd lists (``[{targets, labels}]``), the hosts of this run replacing their entries of
  the files already written, so a run with ``--limit`` keeps the other inventory hosts' targets and drops those of
  hosts no longer in the inventory.
- ``host_settings``: /etc/ttfleet/metrics.json, read by ``ttfleet-serve health`` (roles/serve/files/ttfleet-serve).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]

GIB = 1 << 30
# What a target address may hold: a DNS name, an IPv4 address or an IPv6 address (bracketed in the target).
_ADDRESS = re.compile(r"\A(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|[0-9A-Fa-f:.]{2,45})\Z")
INSTANCE_LABELS = ("host", "instance", "model", "device", "release", "profile", "site")
NODE_LABELS = ("host", "device", "site")


class MetricsError(FleetError, ValueError):
    """A metrics setting or a host's report the targets cannot be made from."""


def _port(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise MetricsError(f"{what} must be a port number (1-65535), not {value!r}")
    port = int(value)
    if not 1 <= port <= 65535:
        raise MetricsError(f"{what} must be a port number (1-65535), not {port}")
    return port


def target_address(address: Any, host: str) -> str:
    """``address`` as the host part of a target: a name, an IPv4 address or a bracketed IPv6 address."""
    text = str(address or "").strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if not _ADDRESS.match(text) or (":" not in text and ".." in text):
        raise MetricsError(
            f"{host}: metrics_target_address {address!r} is not a host name or IP address Prometheus can scrape; "
            "set it to the address Prometheus reaches the host on"
        )
    return f"[{text}]" if ":" in text else text


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def host_targets(report: Mapping[str, Any], host: str, address: Any, site: Any, device: Any, node_port: Any) -> JSON:
    """One host's targets: ``{host, instances: [{targets, labels}], nodes: [{targets, labels}]}``.

    ``report`` is the host's fleet_status result (its ``instances`` carry instance, port, model_name, device, release
    and profile); ``node_port`` 0 leaves the node_exporter target out."""
    if not isinstance(report, dict) or not isinstance(report.get("instances"), list):
        raise MetricsError(f"{host}: expected the fleet_status result of the host (with its instances)")
    where = target_address(address, host)
    common = {"host": host, "site": _text(site), "device": _text(device)}
    instances: list[JSON] = []
    for item in report["instances"]:
        if not isinstance(item, dict) or not item.get("instance"):
            continue
        port = _port(item.get("port"), f"{host}: the port of instance {item.get('instance')!r}")
        labels = dict(
            common,
            instance=_text(item["instance"]),
            model=_text(item.get("model_name") or item.get("model")),
            device=_text(item.get("device") or device),
            release=_text(item.get("release")),
            profile=_text(item.get("profile")),
        )
        instances.append({"targets": [f"{where}:{port}"], "labels": {key: labels[key] for key in INSTANCE_LABELS}})
    nodes: list[JSON] = []
    if str(node_port).strip() not in ("0", "", "None"):
        port = _port(node_port, f"{host}: metrics_node_exporter_port")
        nodes.append({"targets": [f"{where}:{port}"], "labels": {key: common[key] for key in NODE_LABELS}})
    instances.sort(key=lambda entry: str(entry["labels"]["instance"]))
    return {"host": host, "instances": instances, "nodes": nodes}


def _entries(value: Any) -> list[JSON]:
    """The well-formed entries of a file_sd list read back (anything else is dropped and rewritten)."""
    if not isinstance(value, list):
        return []
    return [
        entry
        for entry in value
        if isinstance(entry, dict)
        and isinstance(entry.get("targets"), list)
        and isinstance(entry.get("labels"), dict)
        and isinstance(entry["labels"].get("host"), str)
    ]


def file_sd(
    targets: Iterable[Any],
    existing: Mapping[str, Any] | None,
    play_hosts: Iterable[str],
    inventory_hosts: Iterable[str],
) -> JSON:
    """The fleet's two file_sd lists, ``{instances: [...], nodes: [...]}``, sorted by host and instance.

    ``targets`` are the ``host_targets`` of the hosts of this run; ``existing`` the lists the files held
    (``{instances, nodes}``, missing or unreadable ones empty). Entries of a host of this run are replaced by its
    targets; entries of another host are kept while it is in ``inventory_hosts``."""
    given = [item for item in targets if isinstance(item, dict) and item.get("host")]
    replaced = set(play_hosts) | {item["host"] for item in given}
    known = set(inventory_hosts)
    result: JSON = {}
    for kind in ("instances", "nodes"):
        kept = [
            entry
            for entry in _entries((existing or {}).get(kind))
            if entry["labels"]["host"] not in replaced and entry["labels"]["host"] in known
        ]
        fresh = [entry for item in given for entry in item.get(kind) or []]
        result[kind] = sorted(
            kept + fresh, key=lambda entry: (entry["labels"]["host"], str(entry["labels"].get("instance", "")))
        )
    return result


def host_settings(
    textfile_dir: Any,
    volume_roots: Iterable[Any],
    device: Any,
    facts: Mapping[str, Any] | None,
    margin_gb: Any,
    prune_report: Any,
    cache_scan_seconds: Any,
) -> JSON:
    """/etc/ttfleet/metrics.json: where the health runs write their textfiles ('' writes none), what the site run saw
    (device nodes, firmware, KMD), the volume roots and the margin of the next upgrade's need."""
    directory = _text(textfile_dir)
    if directory and not directory.startswith("/"):
        raise MetricsError(
            f"metrics_textfile_dir must be an absolute directory (node_exporter's --collector.textfile.directory) "
            f"or '' to write no textfiles, not {directory!r}"
        )
    roots = sorted({_text(root).rstrip("/") or "/" for root in volume_roots if _text(root)})
    for root in roots:
        if not root.startswith("/"):
            raise MetricsError(f"the volume root {root!r} must be an absolute path: fix tt_volume_root")
    try:
        margin = float(margin_gb)
        scan = int(cache_scan_seconds)
    except (TypeError, ValueError) as exc:
        raise MetricsError(
            f"metrics_upgrade_margin_gb ({margin_gb!r}) and metrics_cache_scan_seconds ({cache_scan_seconds!r}) "
            "must be numbers"
        ) from exc
    if margin < 0 or scan < 0:
        raise MetricsError(
            f"metrics_upgrade_margin_gb ({margin_gb}) and metrics_cache_scan_seconds ({cache_scan_seconds}) must not "
            "be negative"
        )
    facts = facts if isinstance(facts, dict) else {}
    nodes = facts.get("device_nodes")
    return {
        "textfile_dir": directory,
        "volume_roots": roots,
        "device": _text(device),
        "boards_expected": len(nodes) if isinstance(nodes, list) else None,
        "firmware": _text(facts.get("firmware_version")),
        "kmd": _text(facts.get("kmd_version")),
        "upgrade_margin_bytes": int(margin * GIB),
        "prune_report": _text(prune_report),
        "cache_scan_seconds": scan,
    }
