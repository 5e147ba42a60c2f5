# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Serve profiles and model packages (tests/fixtures/packages: the package of seed 004) down to the container."""

from __future__ import annotations

import copy
import os

import pytest
import yaml

from ansible_collections.ttfleet.inference.plugins.module_utils._host import preflight
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.preflight import model_summaries
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import errors as ttis_errors
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.packages import ProfileError, expand_entries

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
with open(os.path.join(FIXTURES, "packages", "qwen3.8-27b-p150x2.yml"), encoding="utf-8") as _handle:
    PACKAGES = yaml.safe_load(_handle)
NAME = "qwen3.8-27b-p150x2"
REPO = "Qwen/Qwen3.8-27B"


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(V20)


def entry(**extra):
    return {"name": REPO, "package": NAME, **extra}


def expand(*entries, device="p150x2", packages=None, profiles=None):
    return expand_entries(list(entries), device, PACKAGES if packages is None else packages, profiles or {})


def command(v20, item, device="p150x2", port=8000):
    spec, catalog = ttis_select.select_entry(v20, item, device, image=False)
    return container_utils.container_command(
        spec,
        catalog,
        volume_root="/srv/tt",
        port=port,
        runtime_spec_file="/etc/ttfleet/serve/q.model_spec.json",
        tuning=ttis_select.entry_tuning(item),
    )


def test_a_package_entry_gets_its_spec_revision_boards_readiness_and_default_profile():
    (item,) = expand(entry())
    assert item["profile"] == "tp2"
    assert item["revision"] == "1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0"
    assert item["boards"] == {"p150": 2}
    assert item["ready_log_marker"] == "Application startup complete"
    assert (item["first_start_timeout"], item["start_timeout"]) == (900, 300)
    assert item["vllm_override_args"] == {"max_num_seqs": 32, "max_model_len": 65536}
    assert item["env"]["TT_MESH_GRAPH_DESC_PATH"].endswith("p150_x2_2link_mesh_graph_descriptor.textproto")
    spec = item["spec"]
    assert (spec["device_type"], spec["docker_image"], spec["version"]) == (
        "P150X2",
        "ghcr.io/changh95/qwen3.8-27b-p150x2:0.1.0",
        "0.1.0",
    )
    assert spec["tt_metal_commit"] == "fee9e0d35948111be29083c4eb144023d86890d8"
    assert spec["device_model_spec"]["env_vars"]["MESH_DEVICE"] == "P150x2"
    assert spec["device_model_spec"]["tensor_cache_timeout"] == 900.0


def test_each_profile_reaches_the_container_and_keeps_one_volume(v20):
    seen = {}
    for profile in ("tp2", "p1d1", "tp2-dflash2"):
        (item,) = expand(entry(profile=profile))
        result = command(v20, item)
        args = result["argv"][result["argv"].index("--tt-device") + 2 :]
        mounted = result["runtime_model_spec"]["runtime_model_spec"]
        seen[profile] = (args, result["tt_metal_cache_subdir"], result["volume"], mounted["env_vars"])
    assert seen["tp2"][0] == ["--max-num-seqs", "32", "--max-model-len", "65536"]
    assert seen["p1d1"][0] == ["--max-num-seqs", "8", "--max-model-len", "65536"]
    assert seen["tp2-dflash2"][0][:4] == ["--max-num-seqs", "4", "--max-model-len", "65536"]
    assert seen["tp2-dflash2"][0][4] == "--speculative-config"
    assert {value[2] for value in seen.values()} == {"/srv/tt/volume_id_qwen36-Qwen3.8-27B-v0.1.0"}
    assert [value[1].rsplit("/", 1)[1] for value in seen.values()] == [
        "P150x2-tp2",
        "P150x2-p1d1",
        "P150x2-tp2-dflash2",
    ]
    assert seen["p1d1"][3]["TT_PD_CONNS"] == "2" and "TT_PD_CONNS" not in seen["tp2"][3]
    assert seen["p1d1"][3]["MAX_NUM_SEQS"] == "8"


def test_the_entry_wins_over_its_profile_key_by_key():
    (item,) = expand(entry(profile="p1d1", vllm_override_args={"max_num_seqs": 2}, env={"X": 1}))
    assert item["vllm_override_args"] == {"max_num_seqs": 2, "max_model_len": 65536}
    assert item["env"] == {"TT_PD_CONNS": "2", "X": 1}


def test_the_draft_model_is_an_extra_repository():
    (item,) = expand(entry(profile="tp2-dflash2"))
    assert item["extra_repos"] == [
        {"repo": "incoai/Qwen3.8-27B-DFlash2", "revision": "0f3c1e9a7b5d4c2e8f6a1b3d5c7e9f0a2b4c6d8e"}
    ]


def test_catalog_models_take_profiles_from_tt_serve_profiles(v20):
    profiles = {"Qwen3-32B": {"p300x2": {"short": {"vllm_override_args": {"max_model_len": 8192}}}}}
    (item,) = expand({"name": "Qwen/Qwen3-32B", "profile": "short"}, device="p300x2", packages={}, profiles=profiles)
    result = command(v20, item, device="p300x2")
    assert result["argv"][-2:] == ["--max-model-len", "8192"]
    assert result["tt_metal_cache_subdir"] == "tt_metal_cache/cache_Qwen3-32B/P300x2-short"
    assert result["runtime_model_spec"] is None  # the argv carries it, as run.py's would


@pytest.mark.parametrize(
    "item, match",
    [
        (entry(package="nope"), r"package 'nope' is not in tt_model_packages \(defined: qwen3.8-27b-p150x2\)"),
        (
            entry(profile="fast"),
            r"profile 'fast' is not defined for Qwen/Qwen3.8-27B on p150x2; defined: p1d1, tp2, tp2-dflash2",
        ),
        (entry(vllm_override_args={"port": 9100}), r"vllm_override_args key 'port' = 9100 is reserved"),
        (entry(vllm_override_args="{max_num_seqs: 8}"), r"vllm_override_args .* is not JSON"),
        (entry(extra_repos=[{"repo": "a/b", "revision": "main"}]), r"must be the full 40-hex commit"),
        (entry(kernel_cache="maybe"), r"kernel_cache 'maybe' must be own or shared"),
        (entry(spec={"model_id": "x"}), r"give either package or spec, not both"),
    ],
)
def test_bad_entries_name_the_entry_and_the_fix(item, match):
    with pytest.raises(ProfileError, match=match):
        expand(item)


def test_a_package_without_the_hosts_hardware_is_refused():
    with pytest.raises(ProfileError, match=r"has no hardware entry for device p300x2; it runs on: p150x2"):
        expand(entry(), device="p300x2")


def test_unknown_package_keys_are_refused():
    packages = copy.deepcopy(PACKAGES)
    packages[NAME]["weights"] = "x"
    with pytest.raises(ProfileError, match=r"unknown keys weights"):
        expand(entry(), packages=packages)


def test_the_package_spec_names_the_model_the_entry_names(v20):
    (item,) = expand(entry(name="Qwen3.8-27B"))
    spec = ttis_select.select_entry(v20, item, "p150x2")[0]
    assert spec["model_name"] == "Qwen3.8-27B"
    item["name"] = "Qwen3-32B"
    with pytest.raises(ttis_errors.SpecError, match=r"name the entry after its spec"):
        ttis_select.select_entry(v20, item, "p150x2")


# ---------------------------------------------------------------------------------------------
# Preflight on a device tt-inference-server does not know


def facts_with(types):
    return {
        "boards": [{"index": i, "board_type": t + "a", "type": t, "remote": False} for i, t in enumerate(types)],
        "implied_device": None,
        "implied_device_reason": "2 x p150 is no tt-inference-server device",
        "declared_device": "p150x2",
    }


def summaries(v20, tmp_path):
    (item,) = expand(entry())
    found = model_summaries(v20, [item], "p150x2", str(tmp_path))[0]
    return found


def test_preflight_accepts_the_boards_the_package_asks_for(v20, tmp_path):
    found = summaries(v20, tmp_path)
    assert found[0]["boards"] == {"p150": 2} and found[0]["volume_name"] == "volume_id_qwen36-Qwen3.8-27B-v0.1.0"
    levels = {name: "skip" for name in preflight.CHECK_NAMES}
    levels["device_type"] = "fail"
    result = preflight.evaluate(facts_with(["p150", "p150"]), found, levels, host="h", declared_device="p150x2")
    assert result["failures"] == [] and result["passed"] == ["device_type"]


def test_preflight_refuses_other_boards_naming_both(v20, tmp_path):
    found = summaries(v20, tmp_path)
    levels = {name: "skip" for name in preflight.CHECK_NAMES}
    levels["device_type"] = "fail"
    result = preflight.evaluate(facts_with(["p150"]), found, levels, host="h", declared_device="p150x2")
    (failure,) = result["failures"]
    assert "needs the boards its models' specs ask for (2 x p150), but tt-smi lists 1 x p150" in failure["msg"]


def test_preflight_without_declared_boards_keeps_the_device_rule(v20, tmp_path):
    (item,) = expand(entry())
    item.pop("boards")
    found = model_summaries(v20, [item], "p150x2", str(tmp_path))[0]
    levels = {name: "skip" for name in preflight.CHECK_NAMES}
    levels["device_type"] = "fail"
    result = preflight.evaluate(facts_with(["p150", "p150"]), found, levels, host="h", declared_device="p150x2")
    assert "make no known device" in result["failures"][0]["msg"]


# ---------------------------------------------------------------------------------------------
# The env gate and readiness (issue 29): every env source, the collection's values last, typed readiness fields


def with_package(mutate):
    packages = copy.deepcopy(PACKAGES)
    mutate(packages[NAME])
    return packages


@pytest.mark.parametrize(
    "key, reason",
    [
        ("NO_AUTH", r"is reserved: it sets or switches off the server's authentication"),
        ("TT_CACHE_PATH", r"is reserved: it points the server at another cache"),
        ("CACHE_ROOT", r"is reserved: it points the server at another cache"),
        ("HF_HOME", r"is reserved: it points the server at another cache"),
        ("MODEL_WEIGHTS_DIR", r"is reserved: it points the server at other weights"),
        ("RUNTIME_MODEL_SPEC_JSON_PATH", r"is reserved: it points the server at another model spec"),
        ("no_auth", r"is reserved"),
        ("HF_TOKEN", r"looks like a secret"),
        ("VLLM_API_KEY", r"looks like a secret"),
        ("JWT_SECRET", r"looks like a secret"),
        ("AUTHORIZATION", r"looks like a secret"),
    ],
)
def test_the_package_hardware_env_passes_the_gate_naming_package_key_and_reason(key, reason):
    packages = with_package(lambda package: package["hardware"]["p150x2"].update(env={key: "x"}))
    with pytest.raises(ProfileError, match=rf"^tt_model_packages\.{NAME}: hardware\.p150x2\.env key {key} {reason}"):
        expand(entry(), packages=packages)


def test_a_package_profile_env_passes_the_gate_naming_the_profile():
    packages = with_package(lambda package: package["hardware"]["p150x2"]["profiles"]["p1d1"]["env"].update(NO_AUTH=1))
    with pytest.raises(ProfileError, match=r"entry Qwen/Qwen3.8-27B: profile p1d1: env key NO_AUTH is reserved"):
        expand(entry(profile="p1d1"), packages=packages)


@pytest.mark.parametrize("key", ["NO_AUTH", "TT_CACHE_PATH", "HF_TOKEN"])
def test_an_entry_and_a_serve_profile_env_pass_the_same_gate(v20, key):
    with pytest.raises(ProfileError, match=rf"tt_models entry Qwen/Qwen3.8-27B: env key {key} "):
        expand(entry(env={key: "1"}))
    profiles = {"Qwen3-32B": {"p300x2": {"open": {"env": {key: "1"}}}}}
    with pytest.raises(ProfileError, match=rf"profile open: env key {key} "):
        expand({"name": "Qwen/Qwen3-32B", "profile": "open"}, device="p300x2", packages={}, profiles=profiles)


def test_a_plain_package_env_reaches_the_spec():
    packages = with_package(lambda package: package["hardware"]["p150x2"].update(env={"TT_PD_CONNS": 2}))
    (item,) = expand(entry(), packages=packages)
    assert item["spec"]["device_model_spec"]["env_vars"]["TT_PD_CONNS"] == "2"


def media_package():
    return {
        "acme": {
            "model": "acme/Acme-8B",
            "image": "ghcr.io/acme/acme-8b:1.0.0",
            "version": "1.0.0",
            "engine": "media",
            "hardware": {"n150": {"max_context": 8192, "max_concurrency": 4}},
        }
    }


def test_the_collections_values_win_over_a_spec_env_that_slipped_through(v20):
    # A spec env that reached container_command without the gate (an upstream catalog spec, say): the reserved
    # names are dropped, and the collection's values are the ones the container gets.
    (item,) = expand({"name": "acme/Acme-8B", "package": "acme"}, device="n150", packages=media_package())
    spec, catalog = ttis_select.select_entry(v20, item, "n150", image=False)
    spec["env_vars"] = {**spec["env_vars"], "NO_AUTH": "1", "TT_CACHE_PATH": "/tmp/x", "HF_HOME": "/tmp/h", "K": "v"}
    argv = container_utils.container_command(spec, catalog, volume_root="/srv/tt", no_auth=False)["argv"]
    assert "K=v" in argv and "NO_AUTH=1" not in argv and "TT_CACHE_PATH=/tmp/x" not in argv, argv
    assert "HF_HOME=/home/container_app_user/cache_root/huggingface" in argv, argv
    assert "TT_CACHE_PATH=/home/container_app_user/cache_root/tt_metal_cache/cache_Acme-8B/N150" in argv, argv
    argv = container_utils.container_command(spec, catalog, volume_root="/srv/tt", no_auth=True)["argv"]
    assert "NO_AUTH=1" in argv


def test_the_runtime_spec_a_vllm_container_reads_carries_no_reserved_env(v20):
    (item,) = expand(entry())
    spec, catalog = ttis_select.select_entry(v20, item, "p150x2", image=False)
    spec["env_vars"] = {**spec["env_vars"], "VLLM_API_KEY": "k", "TT_CACHE_PATH": "/tmp/x"}
    spec["device_model_spec"]["env_vars"] = {**spec["device_model_spec"]["env_vars"], "MODEL_WEIGHTS_DIR": "/tmp/w"}
    result = container_utils.container_command(
        spec, catalog, volume_root="/srv/tt", runtime_spec_file="/etc/ttfleet/serve/q.model_spec.json"
    )
    runtime = result["runtime_model_spec"]["runtime_model_spec"]
    for env in (runtime["env_vars"], runtime["device_model_spec"]["env_vars"]):
        assert not {"VLLM_API_KEY", "TT_CACHE_PATH", "MODEL_WEIGHTS_DIR"} & set(env), env
    assert runtime["env_vars"]["MESH_DEVICE"] == "P150x2"


@pytest.mark.parametrize(
    "readiness, match",
    [
        ({"log_marker": ""}, r"log_marker '' must be a non-empty string"),
        ({"log_marker": 5}, r"log_marker 5 must be a non-empty string"),
        ({"log_marker": ["ready"]}, r"log_marker \['ready'\] must be a non-empty string"),
        ({"log_marker": "ready\nINFO: x"}, r"log_marker 'ready\\nINFO: x' must be one line"),
        ({"log_marker": "ready\x1b[2J"}, r"log_marker 'ready\\x1b\[2J' must be one line .* without control characters"),
        ({"log_marker": " ready"}, r"log_marker ' ready' must .* surrounding spaces"),
        ({"log_marker": "r" * 201}, r"log_marker 'r+' must be one line of at most 200 characters"),
        ({"start_timeout": 0}, r"start_timeout 0 must be a positive whole number of seconds"),
        ({"start_timeout": "300"}, r"start_timeout '300' must be a positive whole number"),
        ({"first_start_timeout": True}, r"first_start_timeout True must be a positive whole number"),
        ({"first_start_timeout": 1.5}, r"first_start_timeout 1.5 must be a positive whole number"),
    ],
)
def test_package_readiness_fields_are_type_checked_naming_package_and_field(readiness, match):
    packages = with_package(lambda package: package["readiness"].update(readiness))
    with pytest.raises(ProfileError, match=rf"tt_model_packages\.{NAME}\.readiness: {match}"):
        expand(entry(), packages=packages)


@pytest.mark.parametrize("marker", [" x", "a\tb", "two\nlines", ""])
def test_an_entrys_own_ready_log_marker_is_checked_too(marker):
    with pytest.raises(ProfileError, match=r"tt_models entry Qwen/Qwen3.8-27B: ready_log_marker"):
        expand(entry(ready_log_marker=marker))


def test_a_hardware_tensor_cache_timeout_must_be_positive():
    packages = with_package(lambda package: package["hardware"]["p150x2"].update(tensor_cache_timeout="soon"))
    with pytest.raises(ProfileError, match=r"hardware\.p150x2: tensor_cache_timeout 'soon' must be a positive"):
        expand(entry(), packages=packages)
