# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Who fetches a model from its origin and who pulls it from a peer, across the hosts of a play.

The rule: per site and per (repository, revision), the origin (Hub, bucket, directory) is read at most
once, and each host pulls a model from at most one peer.

* A host whose weights are complete holds the model (``done``).
* When no host of the site holds it, the first host in play order that needs it is the ``seed``: it
  fetches from the origin in phase 1.
* Every other host that needs it is a ``pull`` host in phase 2, from one holder (the seed or a host that
  already had it), spread round-robin over the holders in play order.
* A model without a pinned revision (a path source, a floating branch) or a host with peers turned off
  fetches from the origin on its own (``origin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    Entry = Mapping[str, Any]
    ModelKey = tuple[str, str, str]


def model_key(entry: Entry) -> ModelKey | None:
    """The (site, repository, revision) a work entry shares with its peers, or None when it cannot be shared."""
    if not entry.get("shareable") or not entry.get("repo_id") or not entry.get("revision"):
        return None
    return (str(entry.get("site") or "default"), entry["repo_id"], entry["revision"])


def fanout(
    work_by_host: Mapping[str, Iterable[Entry] | None], play_hosts: Iterable[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Assign a role per host and model.

    ``work_by_host``: ``{host: [entry, ...]}``, each entry a dict with ``model``, ``repo_id``, ``revision``,
    ``site``, ``complete`` (bool) and ``shareable`` (pinned revision and peers allowed). ``play_hosts``
    gives the order. Returns ``{host: {model: {"role", "peer", "serve"}}}`` where ``role`` is one of
    done, seed, pull, origin; ``peer`` names the holder of a pull; ``serve`` lists the hosts a holder serves.
    """
    order = [host for host in play_hosts if host in work_by_host]
    result: dict[str, dict[str, dict[str, Any]]] = {host: {} for host in order}
    groups: dict[ModelKey, list[tuple[str, Entry]]] = {}
    for host in order:
        for entry in work_by_host[host] or []:
            key = model_key(entry)
            role = "done" if entry.get("complete") else ("origin" if key is None else None)
            result[host][entry["model"]] = {"role": role, "peer": None, "serve": []}
            if key is not None:
                groups.setdefault(key, []).append((host, entry))
    for members in groups.values():
        holders = [host for host, entry in members if entry.get("complete")]
        needers = [host for host, entry in members if not entry.get("complete")]
        if not needers:
            continue
        if not holders:
            seed = needers.pop(0)
            result[seed][_model_of(members, seed)]["role"] = "seed"
            holders = [seed]
        for index, host in enumerate(needers):
            holder = holders[index % len(holders)]
            slot = result[host][_model_of(members, host)]
            slot.update(role="pull", peer=holder)
            result[holder][_model_of(members, holder)]["serve"].append(host)
    return result


def _model_of(members: list[tuple[str, Entry]], host: str) -> str:
    for member, entry in members:
        if member == host:
            return entry["model"]
    raise KeyError(host)
