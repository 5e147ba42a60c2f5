# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Tuning (--vllm-override-args, --override-tt-config) and runtime model specs against upstream run.py v0.20.0.

The cases of tests/fixtures/ttis/overrides-v0.20.0-docker.json were computed by upstream's own code (see the README
beside it): the docker argv of generate_docker_run_command and the spec after ModelSpec.apply_overrides.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
from unit_helpers import package_spec, with_hardening

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import entrypoint, overrides
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
with open(os.path.join(FIXTURES, "ttis", "overrides-v0.20.0-docker.json"), encoding="utf-8") as _handle:
    RECORDED = json.load(_handle)
CASES = [case for case in RECORDED["cases"] if "argv" in case]
ERRORS = [case for case in RECORDED["cases"] if "error" in case]
SPEC_FILE = "/etc/ttfleet/serve/x.model_spec.json"
SPEC_IN_CONTAINER = "/home/container_app_user/model_specs/x.model_spec.json"


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(V20)


def _reserved(key):
    return key.replace("_", "-") in overrides.RESERVED_WRAPPER_FLAGS


def entry_of(case, keep_reserved=False):
    entry = {"name": case["model"], "engine": case["engine"]}
    if case["vllm_override_args"]:
        args = json.loads(case["vllm_override_args"])
        entry["vllm_override_args"] = {k: v for k, v in args.items() if keep_reserved or not _reserved(k)}
    if case["override_tt_config"]:
        entry["override_tt_config"] = case["override_tt_config"]  # the JSON text, as run.py takes it
    return entry


def unhonoured(case):
    """Tuning a media or forge image cannot take, which run.py drops and the collection refuses (issue 30)."""
    try:
        extra = set(json.loads(case["vllm_override_args"] or "{}")) - set(overrides.VLLM_ARG_TO_ENV)
    except ValueError:
        return False
    return case["engine"] in ("media", "forge") and bool(case["override_tt_config"] or extra)


def ours(catalog, case, entry=None):
    entry = entry or entry_of(case)
    if entry is not None and unhonoured(case) and "override_tt_config" in entry:
        refused = r"override_tt_config key .* cannot take effect: this image starts tt-media"
        with pytest.raises(SpecError, match=refused):
            ours_unchecked(catalog, case, entry)
        # The rest of the case, as run.py serves it once the TT config it drops is left out.
        entry = {key: value for key, value in entry.items() if key != "override_tt_config"}
    return ours_unchecked(catalog, case, entry)


def ours_unchecked(catalog, case, entry):
    spec, spec_catalog = ttis_select.select_entry(catalog, entry, case["device"], image=False)
    result = container_utils.container_command(
        spec,
        spec_catalog,
        volume_root="/srv/tt",
        port=case["port"],
        runtime_spec_file=SPEC_FILE,
        tuning=ttis_select.entry_tuning(entry),
    )
    return spec, result


def normalised(argv):
    """run.py's random name and checkout env file, and our stable ones, as placeholders."""
    out = list(argv)
    for flag in ("--name", "--env-file"):
        out[out.index(flag) + 1] = "<ours>"
    return out


def test_recorded_cases_cover_each_engine_and_both_flags():
    engines = {case["engine"] for case in CASES}
    assert engines == {"vllm", "media", "forge"}
    assert any(case["override_tt_config"] for case in CASES)
    assert any(case["vllm_override_args"] and case["override_tt_config"] for case in CASES)
    assert RECORDED["reserved_wrapper_flags"] == sorted(overrides.RESERVED_WRAPPER_FLAGS)
    assert RECORDED["vllm_arg_to_env"] == overrides.VLLM_ARG_TO_ENV


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_argv_matches_runpy(v20, case):
    result = ours(v20, case)[1]
    expected = normalised(with_hardening(case["argv"]))
    if result["runtime_model_spec"] is not None:
        # Deliberately more than run.py: the resolved spec reaches the container (see _container.container_command),
        # mounted after the volume and named by the last environment variable.
        image = expected.index(result["image"])
        expected[image:image] = ["-e", f"RUNTIME_MODEL_SPEC_JSON_PATH={SPEC_IN_CONTAINER}"]
        first_env = expected.index("-e")
        expected[first_env:first_env] = ["--mount", f"type=bind,src={SPEC_FILE},dst={SPEC_IN_CONTAINER},readonly"]
    assert normalised(result["argv"]) == expected


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_spec_matches_runpy(v20, case):
    spec, result = ours(v20, case)
    theirs = case["runtime_model_spec"]
    # run.py merges even the reserved keys it drops from the argv into its spec, and sets the port; we refuse the
    # former and set the port only in the spec the container reads.
    given = json.loads(case["vllm_override_args"] or "{}")
    skip = {key for key in given if _reserved(key)} | {"port"}
    if unhonoured(case):
        # Refused with the TT config (see ours); the rest of the spec is still run.py's.
        skip |= entrypoint.TT_CONFIG_ARGS
    mine = {k: v for k, v in spec["device_model_spec"]["vllm_args"].items() if k not in skip}
    assert mine == {k: v for k, v in theirs["device_model_spec"]["vllm_args"].items() if k not in skip}
    if not unhonoured(case):
        assert spec["device_model_spec"]["override_tt_config"] == theirs["device_model_spec"]["override_tt_config"]
    assert spec["env_vars"] == theirs["env_vars"]
    if result["runtime_model_spec"] is not None:
        mounted = result["runtime_model_spec"]["runtime_model_spec"]
        assert mounted["device_model_spec"]["vllm_args"]["port"] == str(case["port"])
        # The TT config in the words of the image's release (issue 30): a 0.11.1 image reads override_tt_config.
        gen = container_utils.image_generation(result["image_origin"])
        skip |= entrypoint.TT_CONFIG_ARGS
        # Mappings and lists as their JSON text, which every entrypoint passes on unchanged (str() of a dict is not).
        assert {k: v for k, v in mounted["device_model_spec"]["vllm_args"].items() if k not in skip} == {
            k: v for k, v in entrypoint.json_arguments(mine).items() if k not in skip
        }
        carried = json.loads(mounted["device_model_spec"]["vllm_args"][gen.tt_config_arg])
        assert (carried["tt"] if gen.tt_config_wrapped else carried) == spec["device_model_spec"]["override_tt_config"]
        assert set(mounted["device_model_spec"]["vllm_args"]) & entrypoint.TT_CONFIG_ARGS == {gen.tt_config_arg}
        assert "ttfleet" not in mounted


def test_only_what_the_argv_cannot_carry_mounts_the_spec(v20):
    plain = next(case for case in CASES if case["id"] == "vllm-basic")
    result = ours(v20, plain)[1]
    assert result["runtime_model_spec"] is None
    assert normalised(result["argv"]) == normalised(with_hardening(plain["argv"]))
    tt = next(case for case in CASES if case["override_tt_config"] and case["engine"] == "vllm")
    result = ours(v20, tt)[1]
    assert result["runtime_model_spec"] is not None


@pytest.mark.parametrize("key", ["port", "model", "service_port", "tt-device", "no_auth", "host"])
def test_reserved_keys_are_refused_with_model_key_and_value(v20, key):
    case = CASES[0]
    entry = {"name": case["model"], "vllm_override_args": {"max_num_seqs": 8, key: 9000}}
    with pytest.raises(SpecError) as info:
        ours(v20, case, entry)
    message = str(info.value)
    assert "tt_models entry Qwen3-32B" in message and repr(key) in message and "9000" in message


@pytest.mark.parametrize("case", ERRORS, ids=[case["id"] for case in ERRORS])
def test_malformed_json_is_refused_as_runpy_refuses_it(v20, case):
    # run.py raises in apply_overrides (json.loads, .items()); here the error names the entry and the fix.
    with pytest.raises(SpecError, match=r"tt_models entry Qwen3-32B: vllm_override_args .*(not JSON|mapping)"):
        ours(v20, case, {"name": case["model"], "vllm_override_args": case["vllm_override_args"]})


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"override_tt_config": [1]}, r"override_tt_config must be a mapping"),
        ({"vllm_override_args": {"max num seqs": 1}}, r"has the key"),
        ({"vllm_override_args": {"x": "a\nb"}}, r"control character"),
        ({"env": {"BAD-X": "x"}}, r"not an environment variable name"),
        ({"env": {"X": {"a": 1}}}, r"must be a string or number"),
    ],
)
def test_bad_tuning_shapes(settings, match):
    with pytest.raises(overrides.TuningError, match=match):
        overrides.check_tuning("tt_models entry M", settings)


def test_null_removes_and_mirrors_as_runpy():
    spec = {
        "env_vars": {"A": "1"},
        "device_model_spec": {"vllm_args": {"max_num_seqs": "32", "seed": "9472"}, "override_tt_config": {"k": 1}},
    }
    tuning = overrides.check_tuning("e", {"vllm_override_args": {"seed": None, "max_num_seqs": 8}})
    out = overrides.apply_overrides(spec, tuning)
    assert out["device_model_spec"]["vllm_args"] == {"max_num_seqs": 8}
    assert out["env_vars"] == {"A": "1", "MAX_NUM_SEQS": "8"}
    assert spec["device_model_spec"]["vllm_args"]["seed"] == "9472"  # the input is left alone
    assert overrides.needs_runtime_spec(tuning)
    assert overrides.override_cli_args(tuning["vllm_override_args"]) == ["--max-num-seqs", "8"]


# ---------------------------------------------------------------------------------------------
# Runtime model specs


def test_runtime_spec_from_runpy_is_taken_as_is(v20):
    # A spec run.py itself serialised (what --runtime-model-spec-json reads back) keeps its values.
    theirs = copy.deepcopy(CASES[0]["runtime_model_spec"])
    entry = {"name": theirs["model_name"], "spec": {"runtime_model_spec": theirs, "runtime_config": {}}}
    spec, catalog = ttis_select.select_entry(v20, entry, "p300x2")
    assert spec["device_model_spec"]["vllm_args"] == theirs["device_model_spec"]["vllm_args"]
    assert spec["env_vars"] == theirs["env_vars"]
    derived = ttis_derive.derive(spec, catalog, volume_root="/srv/tt")
    assert derived["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    assert derived["mesh"] == "P300x2"


def test_inline_spec_gets_the_dataclass_defaults(v20):
    spec, catalog = ttis_select.select_entry(v20, {"name": "Qwen/Qwen3.8-27B", "spec": package_spec()}, "p150x2")
    args = spec["device_model_spec"]["vllm_args"]
    assert args["model"] == "Qwen/Qwen3.8-27B" and args["max_model_len"] == "65536" and args["max_num_seqs"] == "32"
    assert args["additional_config"] == '{"tt": {}}'
    assert spec["env_vars"]["VLLM_TARGET_DEVICE"] == "tt" and spec["env_vars"]["MESH_DEVICE"] == "P150x2"
    assert spec["min_disk_gb"] == 27 * 2 + 20 and spec["hf_weights_repo"] == "Qwen/Qwen3.8-27B"
    derived = ttis_derive.derive(spec, catalog, volume_root="/srv/tt")
    assert derived["volume_name"] == "volume_id_qwen36-Qwen3.8-27B-v0.1.0"
    assert (
        derived["paths"]["tt_metal_cache"]
        == "/srv/tt/volume_id_qwen36-Qwen3.8-27B-v0.1.0/tt_metal_cache/cache_Qwen3.8-27B/P150x2"
    )


def test_runtime_spec_reaches_a_vllm_container_as_json(v20):
    entry = {"name": "Qwen3.8-27B", "spec": json.dumps(package_spec()), "vllm_override_args": {"max_num_seqs": 8}}
    spec, catalog = ttis_select.select_entry(v20, entry, "p150x2", image=False)
    result = container_utils.container_command(
        spec, catalog, volume_root="/srv/tt", runtime_spec_file=SPEC_FILE, tuning=ttis_select.entry_tuning(entry)
    )
    assert f"RUNTIME_MODEL_SPEC_JSON_PATH={SPEC_IN_CONTAINER}" in result["argv"]
    assert result["argv"][-6:] == ["--model", "Qwen/Qwen3.8-27B", "--tt-device", "p150x2", "--max-num-seqs", "8"]
    mounted = result["runtime_model_spec"]["runtime_model_spec"]
    assert mounted["device_model_spec"]["vllm_args"]["max_num_seqs"] == 8
    assert result["volume"] == "/srv/tt/volume_id_qwen36-Qwen3.8-27B-v0.1.0"


@pytest.mark.parametrize(
    "change, match",
    [
        ({"max_batch": 3}, r"unknown fields max_batch"),
        ({"model_id": None}, r"has no model_id"),
        ({"docker_image": ""}, r"has no docker_image"),
        ({"inference_engine": "tensorrt"}, r"inference_engine"),
        ({"device_type": "P150X4"}, r"device_type P150X4 and device_model_spec.device P150X2 differ"),
    ],
)
def test_bad_runtime_specs(v20, change, match):
    with pytest.raises(SpecError, match=match):
        ttis_select.select_entry(v20, {"name": "Qwen3.8-27B", "spec": package_spec(**change)}, "p150x2")


def test_unknown_device_needs_a_spec_that_declares_its_mesh(v20):
    with pytest.raises(SpecError, match=r"Unknown device 'p150x2'"):
        ttis_select.select_entry(v20, {"name": "Qwen3-32B"}, "p150x2")
    bare = package_spec()
    bare["device_model_spec"] = {"device": "P150X2", "max_concurrency": 32, "max_context": 65536}
    with pytest.raises(SpecError, match=r"must name its mesh: set device_model_spec.env_vars.MESH_DEVICE"):
        ttis_select.select_entry(v20, {"name": "Qwen3.8-27B", "spec": bare}, "p150x2")


def test_spec_for_another_device_or_model_is_refused(v20):
    with pytest.raises(SpecError, match=r"its spec is for device p150x2, but the entry serves on p300x2"):
        ttis_select.select_entry(v20, {"name": "Qwen3.8-27B", "spec": package_spec()}, "p300x2")
    with pytest.raises(SpecError, match=r"name the entry after its spec"):
        ttis_select.select_entry(v20, {"name": "Qwen3-32B", "spec": package_spec()}, "p150x2")


def test_profiles_keep_their_kernel_caches_apart_unless_shared(v20):
    base = {"name": "Qwen3.8-27B", "spec": package_spec()}
    leaves = {}
    for profile, cache in (("tp2", "own"), ("p1d1", "own"), ("tp2-dflash2", "shared")):
        entry = {**base, "profile": profile, "kernel_cache": cache}
        derived = ttis_derive.resolve_entry(v20, entry, "p150x2", volume_root="/srv/tt")
        leaves[profile] = derived["mesh"]
        assert derived["profile"] == profile
        assert derived["volume_name"] == "volume_id_qwen36-Qwen3.8-27B-v0.1.0"  # one volume, weights reused
    assert leaves == {"tp2": "P150x2-tp2", "p1d1": "P150x2-p1d1", "tp2-dflash2": "P150x2"}


@pytest.mark.parametrize("key", ["HF_TOKEN", "VLLM_API_KEY", "JWT_SECRET", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"])
def test_secrets_are_refused_in_env(key):
    with pytest.raises(overrides.TuningError, match=rf"env key {key} looks like a secret.*serve_api_keys"):
        overrides.check_tuning("tt_models entry M", {"env": {key: "s3cr3t-value"}})


@pytest.mark.parametrize("profile", ["../x", "a/b", "-x", "x" * 64, "a b"])
def test_bad_profile_names_are_refused(v20, profile):
    with pytest.raises(SpecError, match=r"is not a profile name"):
        ttis_select.select_entry(v20, {"name": "Qwen3-32B", "profile": profile}, "p300x2")


# The env gate (issue 29): one function for every env from outside the catalog.


@pytest.mark.parametrize("key", sorted(overrides.RESERVED_ENV))
def test_the_gate_refuses_every_reserved_name_with_its_reason(key):
    with pytest.raises(overrides.TuningError, match=rf"^pkg x: hardware\.n150\.env key {key} (is reserved|looks like)"):
        overrides.gate_env("pkg x", "hardware.n150.env", {key: "1"})


@pytest.mark.parametrize(
    "env, match",
    [
        ({"1X": "a"}, r'env has the key "1X"'),
        ({"X-Y": "a"}, r'env key "X-Y" is not an environment variable name'),
        ({"X": {"a": 1}}, r"env X = \{\"a\": 1\} must be a string or number"),
        ({"X": None}, r"env X = null must be a string or number"),
        ({"X": "a\nNO_AUTH=1"}, r"holds a control character"),
        ('{"NO_AUTH": "1"}', r"env key NO_AUTH is reserved"),
        ({"Hf_Home": "/x"}, r"env key Hf_Home is reserved"),
    ],
)
def test_the_gate_refuses_what_docker_cannot_carry_or_the_collection_owns(env, match):
    with pytest.raises(overrides.TuningError, match=match):
        overrides.gate_env("tt_models entry M", "env", env)


def test_the_gate_passes_plain_values_as_strings():
    assert overrides.gate_env("w", "env", '{"A": 1, "B": true, "C": "x"}') == {"A": "1", "B": "true", "C": "x"}
    assert overrides.gate_env("w", "env", None) == {}


def test_drop_reserved_keeps_only_what_the_collection_does_not_set():
    assert overrides.drop_reserved({"NO_AUTH": "1", "hf_home": "/x", "MESH_DEVICE": "N150", "HF_MODEL": "a/b"}) == {
        "MESH_DEVICE": "N150",
        "HF_MODEL": "a/b",
    }


def test_a_runtime_spec_env_passes_the_gate_naming_its_field(v20):
    theirs = copy.deepcopy(CASES[0]["runtime_model_spec"])
    theirs["device_model_spec"]["env_vars"] = {"NO_AUTH": "1"}
    entry = {"name": theirs["model_name"], "spec": theirs}
    with pytest.raises(SpecError, match=r"spec: device_model_spec\.env_vars key NO_AUTH is reserved"):
        ttis_select.select_entry(v20, entry, "p300x2")
    theirs["device_model_spec"]["env_vars"] = {}
    theirs["env_vars"] = {"HF_TOKEN": "x"}
    with pytest.raises(SpecError, match=r"spec: env_vars key HF_TOKEN looks like a secret"):
        ttis_select.select_entry(v20, entry, "p300x2")


@pytest.mark.parametrize("key", ["api_key", "api-key", "hf_token", "hf-token"])
def test_vllm_arguments_that_carry_a_key_are_refused_without_their_value(key):
    with pytest.raises(overrides.TuningError, match=rf"vllm_override_args key {key} looks like a secret") as err:
        overrides.check_tuning("tt_models entry M", {"vllm_override_args": {key: "sk-SECRET"}})
    assert "sk-SECRET" not in str(err.value)
    assert overrides.check_tuning("w", {"vllm_override_args": {"max_num_seqs": 16}})["vllm_override_args"] == {
        "max_num_seqs": 16
    }


def test_a_runtime_spec_cannot_give_the_server_an_api_key(v20):
    theirs = copy.deepcopy(CASES[0]["runtime_model_spec"])
    theirs["device_model_spec"]["vllm_args"] = {**theirs["device_model_spec"].get("vllm_args", {}), "api_key": "k"}
    entry = {"name": theirs["model_name"], "spec": theirs}
    with pytest.raises(SpecError, match=r"spec: device_model_spec\.vllm_args key api_key looks like a secret"):
        ttis_select.select_entry(v20, entry, "p300x2")
