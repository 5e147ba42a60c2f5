# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The fan-out rule: origin read at most once per site and model, each host pulls from at most one peer."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter.weights import (
    kernel_fanout,
    weights_fanout,
    weights_fanout_rounds,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fanout import (
    MAX_ALTERNATES,
    MAX_ROUNDS,
    fanout,
    kernels_fanout,
    rounds,
)

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
    # One pull of each round shows the round's progress, the first; the others and the seed run plainly.
    assert [h for h in hosts if result[h]["M"]["progress"]] == ["h1", "h2", "h4"]


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


def test_filter_refuses_more_rounds_than_the_role_runs():
    """model_cache runs MAX_ROUNDS rounds, each its own task: a plan of more is refused, naming the fix."""
    assert weights_fanout_rounds({"a": {"M": {"round": MAX_ROUNDS}}}) == MAX_ROUNDS
    with pytest.raises(
        AnsibleFilterError, match=f"needs {MAX_ROUNDS + 1} rounds .* at most {MAX_ROUNDS}.*model_cache_site"
    ):
        weights_fanout_rounds({"a": {"M": {"round": MAX_ROUNDS + 1}}})


KERNEL = {"model_name": "M", "mesh": "P300x2", "impl_id": "tt_transformers", "tt_metal_commit": "b204341"}


def _kernel(host, **extra):
    return dict(KERNEL, vllm_commit="9bd099c", volume=f"/vol/{host}", **extra)


def test_kernel_pullers_of_one_peer_double_per_round_and_keep_their_own_keys():
    hosts = ["kc-c", "kc-e", "kc-f", "kc-g", "kc-h", "kc-i", "kc-j", "kc-k"]
    wants = {host: {"peer": "kc-a", "keys": [_kernel(host)]} for host in hosts}
    plan = kernels_fanout(wants, ["kc-b", *hosts])
    # Eight pullers and one holder: 1 + 2 + 4 pulls, then the last one: ceil(log2(9)) rounds.
    assert plan["rounds"] == math.ceil(math.log2(len(hosts) + 1)) == 4
    assert plan["peers"] == ["kc-a"] and "kc-b" not in plan["hosts"]
    (peer_slot,) = plan["hosts"]["kc-a"]
    assert peer_slot["role"] == "done" and peer_slot["id"] == "M/P300x2/tt_transformers/b204341/9bd099c"
    slots = {host: plan["hosts"][host][0] for host in hosts}
    assert [slots[h]["round"] for h in hosts] == [1, 2, 2, 3, 3, 3, 3, 4]
    assert slots["kc-c"]["peer"] == "kc-a" and slots["kc-f"]["peer"] == "kc-c"
    for host in hosts:
        slot = slots[host]
        assert slot["role"] == "pull" and slot["key"]["volume"] == f"/vol/{host}"
        holder = plan["hosts"][slot["peer"]][0]
        assert holder["role"] == "done" or holder["round"] < slot["round"]
        assert [slot["round"], host] in holder["serve"]
    # A round's pulls never exceed its holders.
    per_round = Counter(slot["round"] for slot in slots.values())
    assert all(per_round[r] <= 2 ** (r - 1) for r in per_round)


def test_kernel_peers_are_sites_and_keys_are_separate():
    other = dict(KERNEL, model_name="N", vllm_commit=None, volume="/vol/x")
    wants = {
        "h1": {"peer": "p1", "keys": [_kernel("h1"), other]},
        "h2": {"peer": "p1", "keys": [_kernel("h2")]},
        "h3": {"peer": "p2", "keys": [_kernel("h3")]},
    }
    plan = kernels_fanout(wants, ["h1", "h2", "h3", "p1"])
    assert plan["peers"] == ["p1", "p2"] and plan["rounds"] == 2
    by_id = {slot["id"]: slot for slot in plan["hosts"]["h1"]}
    assert set(by_id) == {"M/P300x2/tt_transformers/b204341/9bd099c", "N/P300x2/tt_transformers/b204341/-"}
    assert all(slot["peer"] == "p1" and slot["round"] == 1 for slot in by_id.values())
    # h2 pulls M in round 2 from p1 or h1, never from p2's site.
    (h2,) = plan["hosts"]["h2"]
    assert h2["round"] == 2 and {h2["peer"], *h2["alternates"]} <= {"p1", "h1"}
    (h3,) = plan["hosts"]["h3"]
    assert h3["peer"] == "p2" and h3["round"] == 1 and h3["alternates"] == []
    assert kernels_fanout({}, ["h1"]) == {"rounds": 0, "peers": [], "hosts": {}}


def test_a_kernel_peer_named_by_two_sites_sends_each_its_first_copy_and_the_rest_stays_in_the_site():
    site_a, site_b = ["a1", "a2", "a3"], ["b1", "b2", "b3"]
    wants = {host: {"peer": "p", "site": "A", "keys": [_kernel(host)]} for host in site_a}
    wants.update({host: {"peer": "p", "site": "B", "keys": [_kernel(host)]} for host in site_b})
    plan = kernels_fanout(wants, ["a1", "b1", "a2", "b2", "a3", "b3", "p"])
    assert plan["peers"] == ["p"] and plan["rounds"] == 2
    for site in (site_a, site_b):
        slots = {host: plan["hosts"][host][0] for host in site}
        # The peer sends the site's first copy in round 1; then the site's own holder serves it too.
        assert [slots[host]["round"] for host in site] == [1, 2, 2]
        assert slots[site[0]]["peer"] == "p" and slots[site[0]]["alternates"] == []
        for host in site[1:]:
            assert {slots[host]["peer"], *slots[host]["alternates"]} == {"p", site[0]}
    # The peer holds one slot per site, both done.
    assert [slot["role"] for slot in plan["hosts"]["p"]] == ["done", "done"]
    # Without a site the hosts of one peer share the default one, as before.
    (slot,) = kernels_fanout({"h1": {"peer": "p", "keys": [_kernel("h1")]}}, ["h1", "p"])["hosts"]["h1"]
    assert slot["peer"] == "p" and slot["round"] == 1


def test_kernel_filter_errors():
    with pytest.raises(AnsibleFilterError, match="kernel_fanout: the input must map host names"):
        kernel_fanout(["h1"], ["h1"])
    with pytest.raises(AnsibleFilterError, match="kernel_fanout: malformed input"):
        kernel_fanout({"h1": {"keys": [KERNEL]}}, ["h1"])
