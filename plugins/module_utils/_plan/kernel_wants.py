# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Kernel caches a host wants, and the holders that serve each pull of the fan-out, in the order they are asked.

Pure functions, standard library only. The role model_cache deploys the kernel (tensor) caches of a host's models
from model_cache_kernel_store (roles/model_cache/tasks/kernels.yml). With the ``peer`` store each host publishes what
it wants from its kernel peer; the fan-out (_plan/fanout.py, kernels_fanout) spreads the pulls over doubling
rounds; in each round a puller asks its holder first, then the round's other holders, its kernel peer last
(kernels_round.yml). The weights fan-out (weights_round.yml) asks its holders the same way, the origin last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    JSON = dict[str, Any]


def kernel_deploys(
    planned: Sequence[Mapping[str, Any]] | None, models: Sequence[Any] | None, store: str, peer: str, host: str
) -> JSON:
    """Whether ``host`` deploys kernel caches, and the kernel keys of its plan.

    ``planned``: the models of its plan (ttfleet.inference.model_cache_plan), each with its ``kernel`` key (model,
    mesh, impl_id, commits, volume); ``models``: the served models of the host; ``store``: model_cache_kernel_store;
    ``peer``: model_cache_kernel_peer. Nothing is deployed without a store or a model, and the kernel peer itself has
    nothing to pull. Returns ``{"pulls": bool, "keys": [...]}``.
    """
    pulls = store != "none" and len(models or []) > 0 and not (store == "peer" and peer == host)
    return {"pulls": pulls, "keys": [model["kernel"] for model in planned or []] if pulls else []}


def kernel_wants(inspected: Iterable[Mapping[str, Any]] | None, peer: str, site: str) -> JSON:
    """What a host wants from its kernel peer: ``{"peer", "site", "keys"}``, or ``{}`` when a deploy would change
    nothing (a converged host asks the peer nothing).

    ``inspected``: the loop results of kernel_cache ``state: inspected`` over the kernel keys, each with its key
    under ``__model_cache_kspec`` and ``deployable`` when a deploy would change the cache.
    """
    keys = [result["__model_cache_kspec"] for result in inspected or [] if result.get("deployable")]
    return {"peer": peer, "site": site, "keys": keys} if keys else {}


def kernel_wants_by_host(wants: Sequence[Mapping[str, Any] | None], hosts: Sequence[str]) -> dict[str, JSON]:
    """host -> its wants (see :func:`kernel_wants`), the hosts that want nothing left out: the input of the fan-out.

    ``wants``: the fact model_cache_kernel_wants of each of ``hosts``, in the same order (empty when not set).
    """
    if len(wants) != len(hosts):
        raise ValueError(f"{len(wants)} wants for {len(hosts)} hosts; give one (possibly empty) per host.")
    return {host: dict(want) for host, want in zip(hosts, wants, strict=True) if want}


def kernel_round(slots: Iterable[Mapping[str, Any]] | None, round_: int) -> JSON:
    """A host's part in one round of the kernel fan-out: ``pull`` (its pulling slots of the round) and ``serve``
    (whether it serves the caches it deployed in an earlier round: a pulled slot with the round in its
    ``serve_rounds``)."""
    pulled = [slot for slot in slots or [] if slot.get("role") == "pull"]
    return {
        "pull": [slot for slot in pulled if slot.get("round") == round_],
        "serve": any(round_ in (slot.get("serve_rounds") or []) for slot in pulled),
    }


def weights_round(mine: Mapping[str, Mapping[str, Any]] | None, round_: int) -> JSON:
    """A host's part in one round of the weights fan-out: ``pull`` (the models it pulls in the round) and ``serve``
    (the models it serves in the round, whatever its role: a seed, a holder of an earlier round)."""
    slots = dict(mine or {})
    return {
        "pull": [model for model, slot in slots.items() if slot.get("role") == "pull" and slot.get("round") == round_],
        "serve": [model for model, slot in slots.items() if round_ in (slot.get("serve_rounds") or [])],
    }


def kernel_holders(slot: Mapping[str, Any], peer: str) -> list[str]:
    """The holders a puller asks for a kernel cache, in order: the slot's holder, the round's other holders, its
    kernel peer ``peer`` last, each once."""
    return list(dict.fromkeys([slot["peer"], *(slot.get("alternates") or []), peer]))


def kernel_holder_urls(
    slots: Iterable[Mapping[str, Any]],
    peer: str,
    peers: Iterable[str],
    peer_servers: Iterable[Mapping[str, Any]] | None,
    server_urls: Mapping[str, str | None],
) -> dict[str, list[str]]:
    """slot id -> the URLs of the holders that serve it in this round, in the order they are asked.

    A kernel peer (in ``peers``) serves from the start: its URL is in ``peer_servers`` (the loop results of its
    weights_server, item: the peer). Another holder's is its server of this round, ``server_urls[holder]`` (its fact
    model_cache_kernel_server_url); none when it failed earlier: the next holder is asked.
    """
    kernel_peers = list(peers)
    servers = list(peer_servers or [])
    by_slot: dict[str, list[str]] = {}
    for slot in slots:
        urls: list[str] = []
        for holder in kernel_holders(slot, peer):
            if holder in kernel_peers:
                urls.extend(server["url"] for server in servers if server.get("item") == holder and "url" in server)
            elif server_urls.get(holder):
                urls.append(str(server_urls[holder]))
        by_slot[slot["id"]] = urls
    return by_slot


def kernel_expected_sha256(packed: Iterable[Mapping[str, Any]] | None, key: Mapping[str, Any]) -> str:
    """The sha256 a pull of ``key`` is pinned to: the one of the kernel peer's pack result for it (its manifest,
    carried back by Ansible, never by a holder); '' when there is none, which the module refuses."""
    for result in packed or []:
        if result.get("__model_cache_kspec") == key:
            return str((result.get("manifest") or {}).get("sha256") or "")
    return ""


def weights_holder_urls(
    slot: Mapping[str, Any], model: str, server_urls: Mapping[str, Mapping[str, str] | None]
) -> list[str]:
    """The URLs of the holders that serve ``model`` to a puller in this round, its holder first, then the round's
    other holders. ``server_urls``: host -> its fact model_cache_weights_server_urls (model -> URL); a holder that
    failed earlier has none (or an old one that no longer answers), and the next holder is asked."""
    urls = []
    for holder in [slot["peer"], *(slot.get("alternates") or [])]:
        url = (server_urls.get(holder) or {}).get(model) or ""
        if url:
            urls.append(url)
    return urls
