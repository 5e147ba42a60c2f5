# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Rules of the fleet contract (docs/inventory.md) that argument specs cannot express."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


def _short_name(name: object) -> str:
    return str(name).rsplit("/", 1)[-1]


def _present(models: Iterable[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    return [m for m in models or [] if (m.get("state") or "present") == "present"]


def model_conflicts(models: Iterable[Mapping[str, Any]] | None) -> list[str]:
    """Messages for served models that clash: the same model twice on shared devices, or a port twice.

    Entries without ``port`` serve on 8000 + their position (role serve), which checks those ports.

    One model may run as several instances (data parallel on a p150x4, say) when each instance has
    its own ``device_ids`` and ``port``; an instance without ``device_ids`` takes every device.
    """
    present = _present(models)
    problems: list[str] = []
    for index, first in enumerate(present):
        for second in present[index + 1 :]:
            if _short_name(first["name"]) != _short_name(second["name"]):
                continue
            ids_first, ids_second = first.get("device_ids"), second.get("device_ids")
            shared = None if not ids_first or not ids_second else sorted(set(ids_first) & set(ids_second))
            if shared is None or shared:
                where = "every device" if shared is None else f"device ids {shared}"
                problems.append(
                    f"model {_short_name(first['name'])} is listed twice on {where}: give each instance its own "
                    "device_ids (and port), or drop one entry"
                )
    ports: dict[int, list[str]] = {}
    for model in present:
        port = model.get("port")
        if port is None:
            continue
        if not 1 <= int(port) <= 65535:
            problems.append(f"model {model['name']} has port {port}, outside 1-65535")
        ports.setdefault(int(port), []).append(str(model["name"]))
    for port, names in sorted(ports.items()):
        if len(names) > 1:
            problems.append(f"port {port} is given to {', '.join(names)}: each instance needs its own port")
    return problems
