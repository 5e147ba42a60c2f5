# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters of the model_cache fan-outs: the kernel caches a host wants and the holders each pull asks,
decided in plugins/module_utils/_plan/kernel_wants.py. Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_kernel_wants = module_utils("_plan.kernel_wants")


def _dicts(name: str, value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise AnsibleFilterError(f"{name}: {what} must be a list of dicts.")
    return value


def _mapping(name: str, value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: {what} must be a dict.")
    return value


def _round(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"{name}: the round must be a number, got {value!r}.") from None


def _call(name: str, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise AnsibleFilterError(f"{name}: malformed input ({exc}).") from None


def kernel_deploys_filter(planned: Any, models: Any, store: str, peer: str, host: str) -> dict[str, Any]:
    planned = _dicts("kernel_deploys", planned, "the input (model_cache_plan.models)")
    if not isinstance(models, list):
        raise AnsibleFilterError("kernel_deploys: models must be the list of the host's served models.")
    return _call("kernel_deploys", _kernel_wants.kernel_deploys, planned, models, str(store), str(peer), str(host))


def kernel_wants_filter(inspected: Any, peer: str, site: str) -> dict[str, Any]:
    inspected = _dicts("kernel_wants", inspected, "the input (the results of kernel_cache state=inspected)")
    return _call("kernel_wants", _kernel_wants.kernel_wants, inspected, peer, site)


def kernel_wants_by_host_filter(wants: Any, hosts: Any) -> dict[str, Any]:
    if not isinstance(wants, list) or not all(want is None or isinstance(want, Mapping) for want in wants):
        raise AnsibleFilterError("kernel_wants_by_host: the input must list the hosts' model_cache_kernel_wants.")
    if not isinstance(hosts, list):
        raise AnsibleFilterError("kernel_wants_by_host: hosts must be the list of the play's hosts.")
    return _call("kernel_wants_by_host", _kernel_wants.kernel_wants_by_host, wants, [str(host) for host in hosts])


def kernel_round_filter(slots: Any, round_: Any) -> dict[str, Any]:
    slots = _dicts("kernel_round", slots, "the input (this host's slots of the kernel fan-out)")
    return _call("kernel_round", _kernel_wants.kernel_round, slots, _round("kernel_round", round_))


def weights_round_filter(mine: Any, round_: Any) -> dict[str, Any]:
    mine = _mapping("weights_round", mine, "the input (this host's slots of the weights fan-out)")
    return _call("weights_round", _kernel_wants.weights_round, mine, _round("weights_round", round_))


def kernel_holders_filter(slot: Any, peer: str) -> list[str]:
    return _call(
        "kernel_holders", _kernel_wants.kernel_holders, _mapping("kernel_holders", slot, "the input (a slot)"), peer
    )


def kernel_holder_urls_filter(
    slots: Any, peer: str, peers: Any, peer_servers: Any, server_urls: Any
) -> dict[str, list[str]]:
    slots = _dicts("kernel_holder_urls", slots, "the input (the slots pulled in the round)")
    if not isinstance(peers, list):
        raise AnsibleFilterError("kernel_holder_urls: peers must be the kernel peers of the plan, a list.")
    servers = _dicts("kernel_holder_urls", peer_servers, "peer_servers (the results of the kernel peers' servers)")
    urls = _mapping("kernel_holder_urls", server_urls, "server_urls (host -> its model_cache_kernel_server_url)")
    return _call("kernel_holder_urls", _kernel_wants.kernel_holder_urls, slots, peer, peers, servers, urls)


def kernel_expected_sha256_filter(packed: Any, key: Any) -> str:
    packed = _dicts("kernel_expected_sha256", packed, "the input (the results of the pack on the kernel peer)")
    return _call(
        "kernel_expected_sha256",
        _kernel_wants.kernel_expected_sha256,
        packed,
        _mapping("kernel_expected_sha256", key, "key"),
    )


def weights_holder_urls_filter(slot: Any, model: str, server_urls: Any) -> list[str]:
    slot = _mapping("weights_holder_urls", slot, "the input (a slot of the weights fan-out)")
    urls = _mapping("weights_holder_urls", server_urls, "server_urls (host -> its model_cache_weights_server_urls)")
    return _call("weights_holder_urls", _kernel_wants.weights_holder_urls, slot, model, urls)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "kernel_deploys": kernel_deploys_filter,
            "kernel_wants": kernel_wants_filter,
            "kernel_wants_by_host": kernel_wants_by_host_filter,
            "kernel_round": kernel_round_filter,
            "weights_round": weights_round_filter,
            "kernel_holders": kernel_holders_filter,
            "kernel_holder_urls": kernel_holder_urls_filter,
            "kernel_expected_sha256": kernel_expected_sha256_filter,
            "weights_holder_urls": weights_holder_urls_filter,
        }
