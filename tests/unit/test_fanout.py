# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The fan-out rule: origin read at most once per site and model, each host pulls from at most one peer."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter.weights import weights_fanout, weights_fanout_rounds
from ansible_collections.ttfleet.inference.plugins.module_utils._fanout import MAX_ALTERNATES, fanout, rounds

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


def _check_invariants(work, result):
    """What must hold for every plan: a pull's holders hold the model by its round, no holder serves two pulls of
    one round as their peer, the origin is read at most once per site and model, and holders serve in every round
    in which a pull names them."""
    held_at = {}
    for host, models in result.items():
        for model, slot in models.items():
            if slot["role"] in ("done", "seed"):
                held_at[(host, model)] = 0
            elif slot["role"] == "pull":
                held_at[(host, model)] = slot["round"]
    seeds = {}
    for host, models in result.items():
        entries = {entry["model"]: entry for entry in work[host]}
        for model, slot in models.items():
            if slot["role"] == "seed":
                key = (entries[model]["site"], model)
                assert key not in seeds, f"two seeds for {key}"
                seeds[key] = host
            if slot["role"] != "pull":
                assert slot["peer"] is None and slot["alternates"] == [] and slot["round"] == 0
                continue
            for holder in [slot["peer"], *slot["alternates"]]:
                assert holder != host
                assert held_at[(holder, model)] < slot["round"], f"{holder} lacks {model} in round {slot['round']}"
                assert slot["round"] in result[holder][model]["serve_rounds"]
                assert {e["site"] for e in work[holder] if e["model"] == model} == {entries[model]["site"]}
            assert [slot["round"], host] in result[slot["peer"]][model]["serve"]
    for host, models in result.items():
        for slot in models.values():
            per_round = [pair[0] for pair in slot["serve"]]
            assert len(per_round) == len(set(per_round)), f"{host} serves two pulls of one round as their peer"


@pytest.mark.parametrize("count", [2, 3, 4, 8, 16, 17, 64, 1024])
def test_fresh_site_doubles_its_holders_each_round(count):
    hosts = [f"h{i}" for i in range(count)]
    work = {host: [_entry()] for host in hosts}
    result = fanout(work, hosts)
    _check_invariants(work, result)
    roles = [result[host]["M"]["role"] for host in hosts]
    assert roles.count("seed") == 1 and roles[0] == "seed"
    assert roles.count("pull") == count - 1
    # Holders double: 1 seed, then 2, 4, ... so count hosts need ceil(log2(count)) rounds.
    assert rounds(result) == math.ceil(math.log2(count))
    per_round = Counter(result[host]["M"]["round"] for host in hosts[1:])
    for round_no, pulls in per_round.items():
        assert pulls <= 2 ** (round_no - 1)


def test_eight_hosts_exact_schedule():
    hosts = [f"h{i}" for i in range(8)]
    result = fanout({host: [_entry()] for host in hosts}, hosts)
    plan = {
        host: (slot["round"], slot["peer"], slot["alternates"]) for host, slot in ((h, result[h]["M"]) for h in hosts)
    }
    assert plan == {
        "h0": (0, None, []),
        "h1": (1, "h0", []),
        "h2": (2, "h0", ["h1"]),
        "h3": (2, "h1", ["h0"]),
        "h4": (3, "h0", ["h1", "h2", "h3"]),
        "h5": (3, "h1", ["h2", "h3", "h0"]),
        "h6": (3, "h2", ["h3", "h0", "h1"]),
        "h7": (3, "h3", ["h0", "h1", "h2"]),
    }
    assert result["h0"]["M"]["serve"] == [[1, "h1"], [2, "h2"], [3, "h4"]]
    assert result["h0"]["M"]["serve_rounds"] == [1, 2, 3]
    assert result["h3"]["M"]["serve_rounds"] == [3]
    assert weights_fanout_rounds(result) == 3


def test_holders_share_the_pulls_and_origin_untouched():
    work = {
        "a": [_entry()],
        "b": [_entry(complete=True)],
        "c": [_entry()],
        "d": [_entry(complete=True)],
        "e": [_entry()],
    }
    result = fanout(work, ["a", "b", "c", "d", "e"])
    _check_invariants(work, result)
    assert _roles(result) == {
        "a": {"M": ("pull", "b")},
        "b": {"M": ("done", None)},
        "c": {"M": ("pull", "d")},
        "d": {"M": ("done", None)},
        "e": {"M": ("pull", "b")},
    }
    assert [result[h]["M"]["round"] for h in "ace"] == [1, 1, 2]
    assert result["b"]["M"]["serve"] == [[1, "a"], [2, "e"]] and result["d"]["M"]["serve"] == [[1, "c"]]
    assert result["a"]["M"]["alternates"] == ["d"] and result["e"]["M"]["alternates"] == ["d", "a", "c"]


def test_many_holders_one_round():
    hosts = [f"h{i}" for i in range(10)]
    work = {host: [_entry(complete=i < 6)] for i, host in enumerate(hosts)}
    result = fanout(work, hosts)
    _check_invariants(work, result)
    assert rounds(result) == 1
    assert [result[h]["M"]["peer"] for h in hosts[6:]] == ["h0", "h1", "h2", "h3"]
    assert all(len(result[h]["M"]["alternates"]) == MAX_ALTERNATES for h in hosts[6:])


def test_sites_and_models_are_separate():
    work = {
        "x1": [_entry(site="x"), _entry("N", site="x")],
        "x2": [_entry(site="x"), _entry("N", site="x", complete=True)],
        "y1": [_entry(site="y")],
        "y2": [_entry(site="y")],
    }
    result = fanout(work, ["y1", "x1", "x2", "y2"])
    _check_invariants(work, result)
    assert _roles(result) == {
        "y1": {"M": ("seed", None)},
        "x1": {"M": ("seed", None), "N": ("pull", "x2")},
        "x2": {"M": ("pull", "x1"), "N": ("done", None)},
        "y2": {"M": ("pull", "y1")},
    }


def test_unshareable_entries_fetch_alone_and_play_order_wins():
    work = {"a": [_entry(shareable=False)], "b": [_entry(revision=None)], "c": [_entry()], "d": [_entry()]}
    result = fanout(work, ["d", "c", "b", "a"])
    _check_invariants(work, result)
    assert _roles(result) == {
        "d": {"M": ("seed", None)},
        "c": {"M": ("pull", "d")},
        "b": {"M": ("origin", None)},
        "a": {"M": ("origin", None)},
    }


def test_nothing_to_pull_is_zero_rounds():
    work = {"a": [_entry(complete=True)], "b": [_entry(shareable=False)], "c": []}
    assert rounds(fanout(work, ["a", "b", "c"])) == 0
    assert rounds({}) == 0


def test_filter_errors():
    with pytest.raises(AnsibleFilterError, match="must map host names"):
        weights_fanout(["a"], ["a"])
    with pytest.raises(AnsibleFilterError, match="malformed"):
        weights_fanout({"a": [{"repo_id": "x"}]}, ["a"])
    with pytest.raises(AnsibleFilterError, match="must be the result"):
        weights_fanout_rounds(["a"])
    with pytest.raises(AnsibleFilterError, match="malformed plan"):
        weights_fanout_rounds({"a": {"M": {"round": "x"}}})
