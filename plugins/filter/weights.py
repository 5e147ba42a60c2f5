# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filter that spreads weight transfers over a fleet (see module_utils/_plan/fanout.py).

Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_fanout = module_utils("_plan.fanout")


def weights_fanout(work_by_host: object, play_hosts: list[str]) -> Mapping[str, Mapping[str, object]]:
    if not isinstance(work_by_host, Mapping):
        raise AnsibleFilterError("weights_fanout: the input must map host names to their lists of work entries.")
    try:
        return _fanout.fanout({host: list(entries or []) for host, entries in work_by_host.items()}, list(play_hosts))
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"weights_fanout: malformed work entries ({exc}).") from None


def weights_fanout_rounds(plan: object) -> int:
    if not isinstance(plan, Mapping):
        raise AnsibleFilterError("weights_fanout_rounds: the input must be the result of weights_fanout.")
    try:
        count = _fanout.rounds(plan)
    except (TypeError, ValueError, AttributeError) as exc:
        raise AnsibleFilterError(f"weights_fanout_rounds: malformed plan ({exc}).") from None
    if count > _fanout.MAX_ROUNDS:
        raise AnsibleFilterError(
            f"weights_fanout_rounds: the fan-out needs {count} rounds and model_cache runs at most "
            f"{_fanout.MAX_ROUNDS} ({2**_fanout.MAX_ROUNDS:,} pulls per holder of a site and model): split the hosts "
            "into sites (model_cache_site) or preseed the model on more of them."
        )
    return count


def weights_anchors(fetched_by_host: object) -> dict[str, str]:
    if not isinstance(fetched_by_host, Mapping):
        raise AnsibleFilterError(
            "weights_anchors: the input must map host names to the results of the origin task (model_weights)."
        )
    try:
        return _fanout.anchors({host: list(results or []) for host, results in fetched_by_host.items()})
    except ValueError as exc:
        raise AnsibleFilterError(f"weights_anchors: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"weights_anchors: malformed results ({exc}).") from None


def weights_server_name(model: object) -> str:
    if not isinstance(model, str) or not model:
        raise AnsibleFilterError(f"weights_server_name: the input must be a model name, got {model!r}.")
    return _fanout.server_name(model)


def kernel_fanout(wants: object, play_hosts: list[str]) -> dict[str, object]:
    if not isinstance(wants, Mapping):
        raise AnsibleFilterError(
            "kernel_fanout: the input must map host names to {peer: <kernel peer>, site: <model_cache_site>, "
            "keys: [<kernel key>, ...]}."
        )
    try:
        return _fanout.kernels_fanout(wants, list(play_hosts))
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"kernel_fanout: malformed input ({exc}).") from None


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "weights_fanout": weights_fanout,
            "weights_fanout_rounds": weights_fanout_rounds,
            "kernel_fanout": kernel_fanout,
            "weights_anchors": weights_anchors,
            "weights_server_name": weights_server_name,
        }
