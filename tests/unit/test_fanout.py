# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The fan-out rule: origin read at most once per site and model, each host pulls from at most one peer."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter.weights import weights_fanout
from ansible_collections.ttfleet.inference.plugins.module_utils._fanout import fanout

REV = "a" * 40


def _entry(model="M", complete=False, site="s1", shareable=True, revision=REV):
    return {
        "model": model,
        "repo_id": f"org/{model}",
        "revision": revision,
        "site": site,
        "complete": complete,
        "shareable": shareable,
    }


def _roles(result):
    return {
        host: {model: (slot["role"], slot["peer"]) for model, slot in models.items()} for host, models in result.items()
    }


@pytest.mark.parametrize("count", [2, 4, 8])
def test_fresh_site_one_seed_rest_pull_from_it(count):
    hosts = [f"h{i}" for i in range(count)]
    result = fanout({host: [_entry()] for host in hosts}, hosts)
    roles = [result[host]["M"]["role"] for host in hosts]
    assert roles.count("seed") == 1 and roles[0] == "seed"
    assert all(result[host]["M"] == {"role": "pull", "peer": "h0", "serve": []} for host in hosts[1:])
    assert result["h0"]["M"]["serve"] == hosts[1:]


def test_holders_share_the_pulls_and_origin_untouched():
    work = {
        "a": [_entry()],
        "b": [_entry(complete=True)],
        "c": [_entry()],
        "d": [_entry(complete=True)],
        "e": [_entry()],
    }
    result = fanout(work, ["a", "b", "c", "d", "e"])
    assert _roles(result) == {
        "a": {"M": ("pull", "b")},
        "b": {"M": ("done", None)},
        "c": {"M": ("pull", "d")},
        "d": {"M": ("done", None)},
        "e": {"M": ("pull", "b")},
    }
    assert result["b"]["M"]["serve"] == ["a", "e"] and result["d"]["M"]["serve"] == ["c"]


def test_sites_and_models_are_separate():
    work = {
        "x1": [_entry(site="x"), _entry("N", site="x")],
        "x2": [_entry(site="x"), _entry("N", site="x", complete=True)],
        "y1": [_entry(site="y")],
    }
    assert _roles(fanout(work, ["y1", "x1", "x2"])) == {
        "y1": {"M": ("seed", None)},
        "x1": {"M": ("seed", None), "N": ("pull", "x2")},
        "x2": {"M": ("pull", "x1"), "N": ("done", None)},
    }


def test_unshareable_entries_fetch_alone_and_play_order_wins():
    work = {"a": [_entry(shareable=False)], "b": [_entry(revision=None)], "c": [_entry()], "d": [_entry()]}
    assert _roles(fanout(work, ["d", "c", "b", "a"])) == {
        "d": {"M": ("seed", None)},
        "c": {"M": ("pull", "d")},
        "b": {"M": ("origin", None)},
        "a": {"M": ("origin", None)},
    }


def test_filter_errors():
    with pytest.raises(AnsibleFilterError, match="must map host names"):
        weights_fanout(["a"], ["a"])
    with pytest.raises(AnsibleFilterError, match="malformed"):
        weights_fanout({"a": [{"repo_id": "x"}]}, ["a"])
