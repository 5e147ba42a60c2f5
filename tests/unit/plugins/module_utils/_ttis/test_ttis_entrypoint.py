# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What reaches vLLM, by the generation of the image (issue 30): the container command for images of 0.11.x, 0.14.x,
0.15.x and the current releases, on the v0.20.0 catalog, which pins all of them.

The parity of these rules with upstream's own start-up code is test_ttis_entrypoint_parity.py.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
SPEC_FILE = "/etc/ttfleet/serve/x.model_spec.json"
IMAGE = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64"
# Every vLLM argument that has carried the TT config (the broke30 cases run on the code before the fix too, which has
# no _entrypoint to ask).
TT_CONFIG_ARGS = {"override_tt_config", "plugin_config", "additional_config"}


def entrypoint():
    from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import entrypoint as _entrypoint

    return _entrypoint


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(V20)


def command(catalog, entry, device, port=8000):
    spec, spec_catalog = ttis_select.select_entry(catalog, entry, device)
    result = container_utils.container_command(
        spec,
        spec_catalog,
        volume_root="/srv/tt",
        port=port,
        runtime_spec_file=SPEC_FILE,
        tuning=ttis_select.entry_tuning(entry),
    )
    return spec, result


def mounted_args(result):
    assert result["runtime_model_spec"] is not None, "the resolved spec is not mounted"
    return result["runtime_model_spec"]["runtime_model_spec"]["device_model_spec"]["vllm_args"]


def after_image(result):
    argv = result["argv"]
    return argv[argv.index(result["image"]) + 1 :]


@pytest.mark.parametrize(
    "version, label, arg",
    [
        ((0, 11, 1), "0.11", "override_tt_config"),
        ((0, 12, 0), "0.12-0.14", "override_tt_config"),
        ((0, 14, 0), "0.12-0.14", "override_tt_config"),
        ((0, 15, 0), "0.15", "plugin_config"),
        ((0, 16, 0), "0.16-0.18", "additional_config"),
        ((0, 20, 0), "0.19 and later", "additional_config"),
        ((1, 0, 0), "0.19 and later", "additional_config"),
        (None, "0.19 and later", "additional_config"),
    ],
)
def test_generation_by_image_version(version, label, arg):
    gen = entrypoint().generation(version)
    assert (gen.label, gen.tt_config_arg) == (label, arg)


@pytest.mark.parametrize(
    "image, label",
    [
        (f"{IMAGE}:0.11.1-84b4c53-7c6685a", "0.11"),
        ("registry.site.example/tt/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.14.0-80180b9", "0.12-0.14"),
        (f"{IMAGE}:latest", "0.19 and later"),
        ("ghcr.io/changh95/qwen3.8-27b-p150x2:0.1.0", "0.19 and later"),
    ],
)
def test_image_generation_reads_tt_inference_server_tags_only(image, label):
    assert container_utils.image_generation(image).label == label


# Finding 1: the TT config was lost on images 0.11.1 to 0.14.0 when the resolved spec was mounted.


@pytest.mark.broke30("tt-config")
@pytest.mark.parametrize(
    "name, device, version",
    [
        # The catalog's TT config goes with the operator's (Qwen3-32B on galaxy: worker_l1_size, fabric_config, ...).
        ("Qwen3-32B", "galaxy", "0.11.1"),
        ("Qwen3-VL-32B-Instruct", "t3k", "0.14.0"),
    ],
)
def test_tt_config_reaches_an_older_image_in_its_own_words(v20, name, device, version):
    entry = {"name": name, "override_tt_config": {"trace_region_size": 123456}}
    _spec, result = command(v20, entry, device)
    assert result["image"].split(":")[1].startswith(version)
    args = mounted_args(result)
    assert "additional_config" not in args and "plugin_config" not in args
    catalog = ttis_catalog.catalog_from_data(v20, "spec_file")
    catalog_tt = ttis_select.select_spec(catalog, name, device)["device_model_spec"]["override_tt_config"]
    assert json.loads(args["override_tt_config"]) == {**catalog_tt, "trace_region_size": 123456}


@pytest.mark.broke30("tt-config")
def test_env_alone_keeps_the_catalogs_tt_config_on_a_0_11_image(v20):
    entry = {"name": "Qwen3-32B", "env": {"TT_LAB_NOTE": "1"}}
    spec, result = command(v20, entry, "galaxy")
    carried = json.loads(mounted_args(result)["override_tt_config"])
    assert carried == spec["device_model_spec"]["override_tt_config"]
    assert carried.get("fabric_config")


@pytest.mark.broke30("tt-config")
def test_tt_config_reaches_a_0_15_image_as_its_plugin_config(v20):
    entry = {
        "name": "Llama-3.1-8B-Instruct",
        "image": f"{IMAGE}:0.15.0-25891d3-abcdef0",
        "override_tt_config": {"trace_region_size": 7},
    }
    _spec, result = command(v20, entry, "p150")
    args = mounted_args(result)
    assert json.loads(args["plugin_config"]) == {"tt": {"trace_region_size": 7}}
    assert set(args) & TT_CONFIG_ARGS == {"plugin_config"}


def test_current_images_keep_the_catalogs_additional_config(v20):
    entry = {"name": "Llama-3.1-8B-Instruct", "override_tt_config": {"trace_region_size": 7}}
    spec, result = command(v20, entry, "p150")
    args = mounted_args(result)
    assert args["additional_config"] == spec["device_model_spec"]["vllm_args"]["additional_config"]
    assert json.loads(args["additional_config"])["tt"]["trace_region_size"] == 7
    assert set(args) & TT_CONFIG_ARGS == {"additional_config"}


# Finding 2: vllm_override_args lost to the catalog on 0.11.x images, which append the spec's arguments last.


@pytest.mark.broke30("override-args")
def test_override_args_reach_a_0_11_image_through_its_spec(v20):
    entry = {"name": "Llama-3.2-1B-Instruct", "vllm_override_args": {"max_num_seqs": 16}}
    _spec, result = command(v20, entry, "n150")
    assert result["image"].split(":")[1].startswith("0.11.1")
    # The 0.11.x wrapper appends the spec's vLLM arguments after the command line; the spec must carry the value.
    assert mounted_args(result)["max_num_seqs"] == 16
    assert "--max-num-seqs" not in after_image(result)


def test_override_args_stay_on_the_command_line_of_later_images(v20):
    entry = {"name": "Llama-3.1-8B-Instruct", "vllm_override_args": {"max_num_seqs": 16}}
    _spec, result = command(v20, entry, "p150")
    assert result["runtime_model_spec"] is None
    tail = after_image(result)
    assert tail[tail.index("--max-num-seqs") + 1] == "16"


@pytest.mark.broke30("override-args")
def test_a_0_11_image_gets_its_port_as_a_vllm_argument(v20):
    _spec, result = command(v20, {"name": "Llama-3.2-1B-Instruct"}, "n150", port=8123)
    tail = after_image(result)
    assert tail[tail.index("--service-port") + 1] == "8123"
    assert tail[tail.index("--port") + 1] == "8123"
    _spec, later = command(v20, {"name": "Llama-3.1-8B-Instruct"}, "p150", port=8123)
    assert "--port" not in after_image(later)


# Tuning no image of the kind can take is refused, naming the model, the image version, the key and why.


@pytest.mark.parametrize(
    "entry, device, match",
    [
        (
            {"name": "whisper-large-v3", "override_tt_config": {"trace_region_size": 1}},
            "p150",
            r"whisper-large-v3 on p150 \(media image .*:0\.15\.0-25891d3, version 0\.15\.0\): override_tt_config "
            r"key 'trace_region_size' cannot take effect: this image starts tt-media-server, which reads no TT config",
        ),
        (
            {"name": "Falcon3-7B-Instruct", "vllm_override_args": {"block_size": 32}},
            "p150",
            r"Falcon3-7B-Instruct on p150 \(forge image .*, version 0\.18\.0\): vllm_override_args key "
            r"'block_size' cannot take effect: .* reads only max_model_len and max_num_seqs",
        ),
    ],
)
def test_tuning_a_media_image_cannot_take_is_refused(v20, entry, device, match):
    with pytest.raises(SpecError, match=match):
        command(v20, entry, device)


def test_media_images_take_the_mirrored_arguments(v20):
    _spec, result = command(v20, {"name": "whisper-large-v3", "vllm_override_args": {"max_num_seqs": 2}}, "p150")
    assert "MAX_NUM_SEQS=2" in result["argv"]


# What a spec carries that an image cannot.


def test_mapping_arguments_reach_the_entrypoint_as_json(v20):
    speculative = {"method": "ngram", "num_speculative_tokens": 4}
    entry = {"name": "Llama-3.2-1B-Instruct", "vllm_override_args": {"speculative_config": speculative}}
    _spec, result = command(v20, entry, "n150")
    # The 0.11.1 entrypoint appends str(value): JSON text stays JSON, a dict would become Python's repr.
    assert json.loads(mounted_args(result)["speculative_config"]) == speculative


def test_other_vllm_settings_in_additional_config_are_refused_for_an_older_image(v20):
    spec = ttis_select.select_entry(v20, {"name": "Llama-3.2-1B-Instruct"}, "n150")[0]
    spec["device_model_spec"]["vllm_args"]["additional_config"] = json.dumps({"tt": {}, "kv_offload": True})
    spec["device_model_spec"]["override_tt_config"] = {}
    with pytest.raises(
        SpecError,
        match=r"Llama-3.2-1B-Instruct on n150: vllm_args.additional_config holds \['kv_offload'\] besides the TT "
        r"config, which an image of 0.11.1 cannot carry: its vLLM reads the TT config from --override_tt_config",
    ):
        container_utils.container_command(
            spec,
            {"release_version": "0.20.0"},
            volume_root="/srv/tt",
            runtime_spec_file=SPEC_FILE,
            tuning={"override_tt_config": {}, "vllm_override_args": {}, "env": {"X": "1"}},
        )
