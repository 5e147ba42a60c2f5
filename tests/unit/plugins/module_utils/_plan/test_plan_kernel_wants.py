"""The kernel caches a host wants and the holders each pull asks (plugins/module_utils/_plan/kernel_wants.py), the
decisions of roles/model_cache/tasks/kernels.yml, kernels_round.yml and weights_round.yml."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import kernel_wants as kw
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fanout import kernels_fanout


def key(model, volume="/opt/cache/v"):
    return {
        "model_name": model,
        "mesh": "P150x4",
        "impl_id": "tt_transformers",
        "tt_metal_commit": "a" * 40,
        "vllm_commit": "b" * 40,
        "volume": volume,
        "volume_name": volume.rsplit("/", 1)[-1],
    }


PLANNED = [{"name": "Qwen3-32B", "kernel": key("Qwen3-32B")}, {"name": "Llama-3.1-8B", "kernel": key("Llama-3.1-8B")}]
MODELS = [{"name": "Qwen3-32B"}, {"name": "Llama-3.1-8B"}]


@pytest.mark.parametrize(
    ("store", "peer", "host", "models", "pulls"),
    [
        ("path", "", "h1", MODELS, True),
        ("s3", "", "h1", MODELS, True),
        ("peer", "cache-1", "h1", MODELS, True),
        # The kernel peer itself has nothing to pull; another store on the same host does.
        ("peer", "h1", "h1", MODELS, False),
        ("path", "h1", "h1", MODELS, True),
        ("none", "", "h1", MODELS, False),
        ("path", "", "h1", [], False),
    ],
)
def test_kernel_deploys(store, peer, host, models, pulls):
    plan = kw.kernel_deploys(PLANNED, models, store, peer, host)
    assert plan["pulls"] is pulls
    assert plan["keys"] == ([key("Qwen3-32B"), key("Llama-3.1-8B")] if pulls else [])


def test_kernel_deploys_with_an_empty_plan():
    # Check mode on a bare host can plan no model yet while tt_models names some.
    assert kw.kernel_deploys(None, MODELS, "path", "", "h1") == {"pulls": True, "keys": []}


def inspected(*deployable):
    results = []
    for index, flag in enumerate(deployable):
        result = {"changed": False, "__model_cache_kspec": key(f"m{index}")}
        if flag is not None:
            result["deployable"] = flag
        results.append(result)
    return results


def test_kernel_wants_only_what_a_deploy_would_change():
    assert kw.kernel_wants(inspected(True, False, None, True), "cache-1", "lab") == {
        "peer": "cache-1",
        "site": "lab",
        "keys": [key("m0"), key("m3")],
    }


def test_converged_host_wants_nothing():
    assert kw.kernel_wants(inspected(False, None), "cache-1", "lab") == {}
    assert kw.kernel_wants([], "cache-1", "lab") == {}
    assert kw.kernel_wants(None, "cache-1", "lab") == {}


def test_kernel_wants_by_host_leaves_out_hosts_that_want_nothing():
    want = {"peer": "cache-1", "site": "lab", "keys": [key("m0")]}
    assert kw.kernel_wants_by_host([want, {}, None, want], ["h1", "h2", "h3", "h4"]) == {"h1": want, "h4": want}
    with pytest.raises(ValueError, match="2 wants for 1 hosts"):
        kw.kernel_wants_by_host([want, want], ["h1"])


def test_kernel_wants_feed_the_fanout():
    want = {"peer": "cache-1", "site": "lab", "keys": [key("m0")]}
    hosts = ["h1", "h2", "h3"]
    plan = kernels_fanout(kw.kernel_wants_by_host([want, want, want], hosts), hosts)
    assert plan["peers"] == ["cache-1"]
    assert plan["rounds"] >= 1


SLOTS = [
    {"id": "k1", "role": "pull", "round": 1, "peer": "cache-1", "alternates": [], "serve_rounds": [2], "key": key("a")},
    {"id": "k2", "role": "pull", "round": 2, "peer": "h2", "alternates": ["h3"], "serve_rounds": [], "key": key("b")},
    {"id": "k3", "role": "done", "round": 0, "peer": "", "alternates": [], "serve_rounds": [3], "key": key("c")},
]


def test_kernel_round():
    assert kw.kernel_round(SLOTS, 1) == {"pull": [SLOTS[0]], "serve": False}
    assert kw.kernel_round(SLOTS, 2) == {"pull": [SLOTS[1]], "serve": True}
    # Only a pulled cache is served from this host's spool: a slot that is done here serves nothing.
    assert kw.kernel_round(SLOTS, 3) == {"pull": [], "serve": False}
    assert kw.kernel_round(None, 1) == {"pull": [], "serve": False}


def test_weights_round():
    mine = {
        "Qwen3-32B": {"role": "pull", "round": 1, "peer": "h1", "alternates": [], "serve_rounds": [2, 3]},
        "Llama-3.1-8B": {"role": "seed", "round": 0, "serve_rounds": [1, 2]},
        "Whisper": {"role": "pull", "round": 2, "peer": "h1", "alternates": ["h3"], "serve_rounds": []},
    }
    assert kw.weights_round(mine, 1) == {"pull": ["Qwen3-32B"], "serve": ["Llama-3.1-8B"]}
    assert kw.weights_round(mine, 2) == {"pull": ["Whisper"], "serve": ["Qwen3-32B", "Llama-3.1-8B"]}
    assert kw.weights_round(mine, 3) == {"pull": [], "serve": ["Qwen3-32B"]}
    assert kw.weights_round({}, 1) == {"pull": [], "serve": []}


@pytest.mark.parametrize(
    ("slot", "peer", "holders"),
    [
        ({"peer": "h2", "alternates": ["h3", "h4"]}, "cache-1", ["h2", "h3", "h4", "cache-1"]),
        # The kernel peer is asked once, in its place.
        ({"peer": "cache-1", "alternates": ["h3"]}, "cache-1", ["cache-1", "h3"]),
        ({"peer": "h2", "alternates": ["cache-1", "h3"]}, "cache-1", ["h2", "cache-1", "h3"]),
        ({"peer": "h2", "alternates": []}, "cache-1", ["h2", "cache-1"]),
    ],
)
def test_kernel_holders_in_order_peer_last(slot, peer, holders):
    assert kw.kernel_holders(slot, peer) == holders


PEER_SERVERS = [
    {"item": "cache-1", "url": "http://cache-1:9000/T1/", "changed": False},
    # A kernel peer whose server failed to start: no URL.
    {"item": "cache-2", "failed": True, "msg": "address in use"},
]


def test_holder_urls_peer_from_its_server_others_from_their_fact():
    slots = [
        {"id": "k1", "peer": "h2", "alternates": ["h3"]},
        {"id": "k2", "peer": "cache-1", "alternates": []},
    ]
    urls = {"h2": "http://h2:9001/T2/", "h3": "http://h3:9001/T3/"}
    assert kw.kernel_holder_urls(slots, "cache-1", ["cache-1"], PEER_SERVERS, urls) == {
        "k1": ["http://h2:9001/T2/", "http://h3:9001/T3/", "http://cache-1:9000/T1/"],
        "k2": ["http://cache-1:9000/T1/"],
    }


def test_holder_urls_skip_a_holder_that_lacks_a_server():
    # h2 failed in an earlier round (no server this round), the kernel peer cache-2 failed to start its server:
    # the pull goes to the next holder; with none left it gets no URL and the role's assert names the holders.
    slots = [
        {"id": "k1", "peer": "h2", "alternates": ["h3"]},
        {"id": "k2", "peer": "h2", "alternates": []},
    ]
    urls = {"h2": "", "h3": "http://h3:9001/T3/"}
    assert kw.kernel_holder_urls(slots, "cache-2", ["cache-1", "cache-2"], PEER_SERVERS, urls) == {
        "k1": ["http://h3:9001/T3/"],
        "k2": [],
    }


def test_holder_urls_a_kernel_peer_never_answers_from_its_fact():
    # A kernel peer serves its spool from the start; a fact it may carry from another play is not used.
    slots = [{"id": "k1", "peer": "cache-1", "alternates": []}]
    assert kw.kernel_holder_urls(slots, "cache-1", ["cache-1"], [], {"cache-1": "http://stale/"}) == {"k1": []}


def test_holder_urls_of_a_holder_outside_the_play():
    slots = [{"id": "k1", "peer": "gone", "alternates": []}]
    assert kw.kernel_holder_urls(slots, "cache-1", ["cache-1"], None, {}) == {"k1": []}
    assert kw.kernel_holder_urls(slots, "cache-1", ["cache-1"], PEER_SERVERS, {}) == {"k1": ["http://cache-1:9000/T1/"]}


def test_expected_sha256_from_the_pack_result_of_the_key():
    packed = [
        {"__model_cache_kspec": key("a"), "manifest": {"sha256": "1" * 64}},
        {"__model_cache_kspec": key("b"), "manifest": {"sha256": "2" * 64}},
        {"__model_cache_kspec": key("c"), "failed": True},
    ]
    assert kw.kernel_expected_sha256(packed, key("b")) == "2" * 64
    # No pack result, or one without a manifest: empty, which kernel_cache refuses.
    assert kw.kernel_expected_sha256(packed, key("c")) == ""
    assert kw.kernel_expected_sha256(packed, key("d")) == ""
    assert kw.kernel_expected_sha256(None, key("a")) == ""


def test_weights_holder_urls_holder_first_then_alternates():
    slot = {"peer": "h1", "alternates": ["h2", "h3"]}
    urls = {
        "h1": {"Qwen3-32B": "http://h1/T1/", "Other": "http://h1/T9/"},
        # h2 serves another model this round only; h3 failed earlier and published nothing.
        "h2": {"Other": "http://h2/T2/"},
        "h3": None,
    }
    assert kw.weights_holder_urls(slot, "Qwen3-32B", urls) == ["http://h1/T1/"]
    urls["h3"] = {"Qwen3-32B": "http://h3/T3/"}
    assert kw.weights_holder_urls(slot, "Qwen3-32B", urls) == ["http://h1/T1/", "http://h3/T3/"]
    assert kw.weights_holder_urls({"peer": "gone", "alternates": []}, "Qwen3-32B", urls) == []
