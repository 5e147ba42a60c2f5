# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Unit tests for plugins/module_utils/_ttis (catalog, source, select, derive, tags) over real TTIS exports."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import checkout as ttis_checkout
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import source as ttis_source
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import iter_specs, load_spec_file
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import derive, resolve
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import mesh_name
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import CONTAINER_CACHE_ROOT
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.select import list_models, select_spec
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import (
    is_legacy_interface,
    parse_image_version,
    parse_version_tuple,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.validate import check_name

SPEC_DIR = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4)), "fixtures", "specs")
RELEASES = ("v0.16.0", "v0.18.0", "v0.20.0")
QB2_QWEN_IMAGE = (
    "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.17.0-8c48a10-f52987a"
)


def fixture_path(release):
    return os.path.join(SPEC_DIR, f"release_model_spec-{release}.json.gz")


def fixture_bytes(release):
    """The uncompressed JSON of a fixture."""
    with gzip.open(fixture_path(release), "rb") as handle:
        return handle.read()


_CATALOGS = {}


def catalog(release):
    if release not in _CATALOGS:
        _CATALOGS[release] = load_spec_file(fixture_path(release))
    return _CATALOGS[release]


def _default_cases():
    cases = []
    for release in RELEASES:
        for spec in iter_specs(catalog(release)):
            if spec["device_model_spec"].get("default_impl"):
                cases.append(
                    pytest.param(release, spec["model_name"], spec["device_type"], id=f"{release}-{spec['model_id']}")
                )
    return cases


def _all_cases():
    return [
        pytest.param(release, spec["model_id"], id=f"{release}-{spec['model_id']}")
        for release in RELEASES
        for spec in iter_specs(catalog(release))
    ]


# --- every spec of the real exports -----------------------------------------------------------


@pytest.mark.parametrize(("release", "model", "device"), _default_cases())
def test_every_default_spec_resolves(release, model, device):
    result = resolve(catalog(release), model, device.lower(), volume_root="/srv/tt")
    assert result["model_name"] == model
    assert result["device_type"] == device
    assert result["default_impl"] is True
    assert result["volume_name"] == f"volume_id_{result['impl_id']}-{model}-v{result['version']}"
    assert result["named_volume"] == f"volume_id_{result['impl_id']}-{model}"
    assert result["paths"]["volume"] == f"/srv/tt/{result['volume_name']}"
    assert result["paths"]["weights"] == f"/srv/tt/{result['volume_name']}/weights/{model}"
    assert (
        result["paths"]["tt_metal_cache"]
        == f"/srv/tt/{result['volume_name']}/tt_metal_cache/cache_{model}/{result['mesh']}"
    )
    assert (
        result["container"]["tt_cache_path"] == f"{CONTAINER_CACHE_ROOT}/tt_metal_cache/cache_{model}/{result['mesh']}"
    )
    assert result["release_version"] == release[1:]
    assert isinstance(result["legacy_interface"], bool)
    assert all(isinstance(value, str) for value in result["env_vars"].values())


@pytest.mark.parametrize(("release", "model_id"), _all_cases())
def test_every_spec_derives(release, model_id):
    spec = next(s for s in iter_specs(catalog(release)) if s["model_id"] == model_id)
    result = derive(spec, catalog(release))
    assert result["paths"]["volume"] == result["volume_name"]
    assert result["paths"]["weights"] == f"weights/{result['model_name']}"
    # The cache leaf follows the device (or data-parallel subdevice), never the MESH_DEVICE env var,
    # which some specs override ("(4, 8)", or P150x4 for gemma-4-31B-it on p300x2).
    assert result["mesh"] == mesh_name(spec.get("subdevice_type") or spec["device_type"])


# --- known cases -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "model", "device", "volume", "mesh", "legacy"),
    [
        ("v0.20.0", "Qwen3-32B", "p300x2", "volume_id_tt_transformers-Qwen3-32B-v0.17.0", "P300x2", False),
        ("v0.20.0", "Qwen3-32B", "galaxy", "volume_id_qwen3_32b_galaxy-Qwen3-32B-v0.11.1", "T3K", False),
        ("v0.20.0", "DeepSeek-R1-0528", "galaxy", "volume_id_deepseek_r1_galaxy-DeepSeek-R1-0528-v0.12.0", "TG", False),
        ("v0.20.0", "whisper-large-v3", "n150", "volume_id_whisper-whisper-large-v3-v0.17.0", "N150", False),
        (
            "v0.20.0",
            "Llama-3.1-8B-Instruct",
            "n150",
            "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.9.0",
            "N150",
            True,
        ),
        (
            "v0.20.0",
            "Llama-3.1-8B-Instruct",
            "p300x2",
            "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.19.0",
            "P300x2",
            False,
        ),
        (
            "v0.18.0",
            "Llama-3.1-8B-Instruct",
            "p300x2",
            "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.17.0",
            "P300x2",
            False,
        ),
        ("v0.16.0", "Qwen3-32B", "p300x2", "volume_id_tt_transformers-Qwen3-32B-v0.14.0", "P300x2", False),
        ("v0.18.0", "Qwen3-32B", "p300x2", "volume_id_tt_transformers-Qwen3-32B-v0.17.0", "P300x2", False),
    ],
)
def test_known_cases(release, model, device, volume, mesh, legacy):
    result = resolve(catalog(release), model, device)
    assert (result["volume_name"], result["mesh"], result["legacy_interface"]) == (volume, mesh, legacy)


def test_qwen3_32b_on_quietbox2_in_detail():
    result = resolve(catalog("v0.20.0"), "Qwen/Qwen3-32B", "P300X2", volume_root="/home/tt/data/tt-cache/")
    assert result["impl_id"] == "tt_transformers"
    assert result["impl_name"] == "tt-transformers"
    assert result["inference_engine"] == "vLLM"
    assert result["device"] == "p300x2"
    assert result["docker_image"] == QB2_QWEN_IMAGE
    assert result["image_version"] == "0.17.0"
    assert (result["tt_metal_commit"], result["vllm_commit"]) == ("8c48a10", "f52987a")
    assert result["paths"]["volume"] == "/home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    assert result["container"]["tt_cache_path"] == (
        "/home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/P300x2"
    )
    assert result["system_requirements"] == {
        "firmware": {"specifier": ">=19.2.0", "mode": "STRICT"},
        "kmd": {"specifier": ">=2.5.0", "mode": "STRICT"},
    }
    assert (result["min_disk_gb"], result["min_ram_gb"]) == (84, 80.0)
    assert result["env_vars"]["MESH_DEVICE"] == "P300x2"
    assert result["env_vars"]["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    assert result["vllm_args"]["model"] == "Qwen/Qwen3-32B"
    assert (result["max_concurrency"], result["max_context"]) == (32, 131072)
    assert result["spec_source"] == "spec_file"


def test_version_pin_moves_between_releases():
    before = resolve(catalog("v0.18.0"), "Llama-3.1-8B-Instruct", "p300x2")
    after = resolve(catalog("v0.20.0"), "Llama-3.1-8B-Instruct", "p300x2")
    assert before["named_volume"] == after["named_volume"]
    assert before["volume_name"].endswith("-v0.17.0")
    assert after["volume_name"].endswith("-v0.19.0")


def test_env_vars_merge_device_values_last():
    spec = json.loads(json.dumps(select_spec(catalog("v0.20.0"), "Qwen3-32B", "p300x2")))
    spec["env_vars"] = {"MESH_DEVICE": "stale", "ONLY_SPEC": 1}
    spec["device_model_spec"]["env_vars"] = {"MESH_DEVICE": "P300x2"}
    assert derive(spec)["env_vars"] == {"MESH_DEVICE": "P300x2", "ONLY_SPEC": "1"}


# --- selection rules (run.py's get_runtime_model_spec) ------------------------------------------


def test_default_impl_wins_over_other_impls():
    assert resolve(catalog("v0.20.0"), "Qwen3-32B", "galaxy", engine="vllm")["impl_id"] == "qwen3_32b_galaxy"


@pytest.mark.parametrize("impl", ["tt-transformers", "tt_transformers"])
def test_impl_by_name_or_id(impl):
    result = resolve(catalog("v0.20.0"), "Qwen3-32B", "galaxy", impl=impl)
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.9.0"
    assert (result["subdevice_type"], result["mesh"]) == ("T3K", "T3K")
    assert result["default_impl"] is False


def test_engine_selects_non_default_spec():
    result = resolve(catalog("v0.20.0"), "Llama-3.2-3B", "n150", engine="forge")
    assert (result["impl_id"], result["inference_engine"]) == ("forge_vllm_plugin", "forge")


def test_no_default_requires_impl_or_engine():
    with pytest.raises(SpecError) as exc:
        resolve(catalog("v0.16.0"), "Llama-3.1-8B", "gpu")
    message = str(exc.value)
    assert "no default implementation" in message
    assert "impl=tt-transformers" in message and "engine=vllm" in message
    assert resolve(catalog("v0.16.0"), "Llama-3.1-8B", "gpu", engine="vLLM")["impl_id"] == "tt_transformers"
    assert resolve(catalog("v0.16.0"), "Llama-3.1-8B", "gpu", impl="tt-transformers")["device"] == "gpu"


# --- error messages ----------------------------------------------------------------------------


def test_unknown_model_suggests_close_names_on_device():
    with pytest.raises(SpecError) as exc:
        resolve(catalog("v0.20.0"), "Qwen3-32", "p300x2")
    assert "Unknown model 'Qwen3-32'" in str(exc.value)
    assert "Qwen3-32B" in str(exc.value)


def test_unknown_model_suggestion_ignores_case():
    with pytest.raises(SpecError, match="Qwen3-32B"):
        resolve(catalog("v0.20.0"), "qwen3-32b", "p300x2")


def test_model_on_wrong_device_lists_its_devices():
    with pytest.raises(SpecError) as exc:
        resolve(catalog("v0.20.0"), "Qwen3-32B", "n150")
    assert "not built for device n150" in str(exc.value)
    assert "galaxy, galaxy_t3k, p150x8, p300x2, t3k" in str(exc.value)


def test_unknown_device_lists_devices():
    with pytest.raises(SpecError) as exc:
        resolve(catalog("v0.20.0"), "Qwen3-32B", "p150x2")
    message = str(exc.value)
    assert "Unknown device 'p150x2'" in message
    assert "p300x2" in message and "n150" in message


def test_device_without_models():
    with pytest.raises(SpecError, match="No model is built for device e150"):
        resolve(catalog("v0.20.0"), "Qwen3-32B", "e150")


def test_unknown_impl_lists_choices():
    with pytest.raises(SpecError) as exc:
        resolve(catalog("v0.20.0"), "Llama-3.2-3B", "n150", impl="nope")
    assert "impl=tt-transformers (impl_id tt_transformers), engine=vllm, default" in str(exc.value)
    assert "impl=forge-vllm-plugin" in str(exc.value)


def test_unknown_engine():
    with pytest.raises(SpecError, match="Unknown engine 'tensorrt'"):
        resolve(catalog("v0.20.0"), "Qwen3-32B", "p300x2", engine="tensorrt")


@pytest.mark.parametrize(
    "model",
    [
        "../Qwen3-32B",
        "Qwen/../../etc",
        "a/b/c",
        "/Qwen3-32B",
        "Qwen/",
        "Qwen3-32B\x00",
        "Qwen3-32B\n",
        "Qwen\\Qwen3-32B",
        " Qwen3-32B",
        "-rf",
        "",
    ],
)
def test_hostile_model_names_rejected_before_lookup(model):
    with pytest.raises(SpecError, match="model"):
        check_name(model, "model", allow_org=True)
    # Names are checked before the catalog is even looked at.
    with pytest.raises(SpecError, match="model"):
        resolve({"not": "a catalog"}, model, "n150")
    with pytest.raises(SpecError, match="model"):
        resolve(catalog("v0.20.0"), model, "n150")


@pytest.mark.parametrize("device", ["../n150", "n150/x", "n1\x0050", "n150\t"])
def test_hostile_device_names(device):
    with pytest.raises(SpecError, match="device"):
        resolve(catalog("v0.20.0"), "Qwen3-32B", device)


def test_hostile_names_inside_a_spec_file(tmp_path):
    data = json.loads(fixture_bytes("v0.20.0"))
    spec = data["model_specs"]["Qwen/Qwen3-32B"]["P300X2"]["vLLM"]["tt_transformers"]
    spec["version"] = "../../etc"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="single path component"):
        resolve(load_spec_file(str(path)), "Qwen3-32B", "p300x2")


@pytest.mark.parametrize("root", ["relative/dir", "/srv/\x00tt"])
def test_volume_root_must_be_absolute(root):
    with pytest.raises(SpecError, match="volume_root"):
        resolve(catalog("v0.20.0"), "Qwen3-32B", "p300x2", volume_root=root)


# --- loading -----------------------------------------------------------------------------------


def test_missing_spec_file(tmp_path):
    path = str(tmp_path / "missing.json")
    with pytest.raises(SpecError) as exc:
        load_spec_file(path)
    assert path in str(exc.value)
    assert "release_model_spec.json" in str(exc.value)


def test_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_spec_file(str(path))


@pytest.mark.parametrize(
    "content", [[], {"model_specs": []}, {"a": 1}, {"model_specs": {"x": {"N150": {"vLLM": {"i": {}}}}}}]
)
def test_unknown_shape(tmp_path, content):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(content))
    with pytest.raises(SpecError) as exc:
        load_spec_file(str(path))
    assert str(path) in str(exc.value)
    assert "unknown shape" in str(exc.value)


def test_plain_and_gzip_files_load_the_same(tmp_path):
    raw = fixture_bytes("v0.18.0")
    path = tmp_path / "release_model_spec.json"
    path.write_bytes(raw)
    plain = resolve(load_spec_file(str(path)), "Qwen3-32B", "p300x2")
    packed = resolve(catalog("v0.18.0"), "Qwen3-32B", "p300x2")
    assert plain["volume_name"] == packed["volume_name"]


def _flat_from(release):
    """The nested export flattened to the {model_id: spec} shape of TTIS < v0.11."""
    flat = {}
    for spec in iter_specs(catalog(release)):
        spec = json.loads(json.dumps(spec))
        flat[spec["model_id"]] = spec
    return flat


def test_legacy_flat_file(tmp_path):
    flat = _flat_from("v0.20.0")
    for spec in flat.values():
        spec.pop("inference_engine") if spec["inference_engine"] == "vLLM" else None
    path = tmp_path / "model_specs_output.json"
    path.write_text(json.dumps(flat))
    loaded = load_spec_file(str(path))
    assert loaded["legacy_layout"] is True
    result = resolve(loaded, "Qwen3-32B", "p300x2")
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    assert result["inference_engine"] == "vLLM"


def test_legacy_flat_file_takes_version_from_checkout(tmp_path):
    # Before v0.11 every spec's version (and default image tag) was the checkout's VERSION at run
    # time, so a stale export is corrected with it.
    flat = _flat_from("v0.20.0")
    path = tmp_path / "model_specs_output.json"
    path.write_text(json.dumps(flat))
    (tmp_path / "VERSION").write_text("0.10.1\n")
    loaded = ttis_checkout.load_checkout(str(tmp_path))
    assert loaded["source"] == "model_specs_output.json"
    assert loaded["warnings"]
    result = resolve(loaded, "Qwen3-32B", "p300x2")
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.10.1"
    assert result["docker_image"].endswith(":0.10.1-8c48a10-f52987a")
    assert result["legacy_interface"] is True


def test_checkout_prefers_release_file_over_legacy_file(tmp_path):
    (tmp_path / "release_model_spec.json").write_bytes(fixture_bytes("v0.20.0"))
    (tmp_path / "model_specs_output.json").write_text("{}")
    loaded = ttis_checkout.load_checkout(str(tmp_path))
    assert loaded["source"] == "release_model_spec.json"
    assert "no workflows/model_spec.py" in loaded["warnings"][0]


def test_checkout_without_specs(tmp_path):
    with pytest.raises(SpecError, match="does not look like a tt-inference-server checkout"):
        ttis_checkout.load_checkout(str(tmp_path))


def test_checkout_not_a_directory(tmp_path):
    with pytest.raises(SpecError, match="is not a directory"):
        ttis_checkout.load_checkout(str(tmp_path / "nowhere"))


def test_load_catalog_needs_exactly_one_source(tmp_path):
    with pytest.raises(SpecError, match="exactly one"):
        ttis_source.load_catalog()
    with pytest.raises(SpecError, match="exactly one"):
        ttis_source.load_catalog(tt_inference_server_dir=str(tmp_path), spec_file=fixture_path("v0.20.0"))


# --- list mode ---------------------------------------------------------------------------------


def test_list_models_on_quietbox2():
    rows = list_models(catalog("v0.20.0"), device="p300x2")
    assert len(rows) == 22
    assert all(row["device"] == "p300x2" for row in rows)
    qwen = [row for row in rows if row["model_name"] == "Qwen3-32B"]
    assert qwen == [
        {
            "model_name": "Qwen3-32B",
            "hf_model_repo": "Qwen/Qwen3-32B",
            "device": "p300x2",
            "impl_id": "tt_transformers",
            "impl_name": "tt-transformers",
            "inference_engine": "vLLM",
            "default_impl": True,
            "version": "0.17.0",
            "docker_image": QB2_QWEN_IMAGE,
            "status": "FUNCTIONAL",
            "model_type": "LLM",
            "legacy_interface": False,
            "volume_name": "volume_id_tt_transformers-Qwen3-32B-v0.17.0",
        }
    ]


def test_list_models_filters_by_model_and_orders_default_first():
    rows = list_models(catalog("v0.20.0"), model="Qwen3-32B", device="galaxy")
    assert [(row["impl_id"], row["default_impl"]) for row in rows] == [
        ("qwen3_32b_galaxy", True),
        ("tt_transformers", False),
    ]
    assert len(list_models(catalog("v0.20.0"))) == 225


# --- small pure functions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.9.0", (0, 9, 0)),
        ("0.11", (0, 11, 0)),
        ("0.17.0-8c48a10", (0, 17, 0)),
        ("1.2.3.4", (1, 2, 3)),
        ("dev", None),
        ("", None),
        (None, None),
        ("7", None),
    ],
)
def test_parse_version_tuple(value, expected):
    assert parse_version_tuple(value) == expected


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("ghcr.io/x/y:0.9.0-abc-def", (0, 9, 0)),
        ("localhost:5000/x/y:0.12.0-abc", (0, 12, 0)),
        ("ghcr.io/x/y:latest", None),
        ("ghcr.io/x/y", None),
        (None, None),
    ],
)
def test_parse_image_version(image, expected):
    assert parse_image_version(image) == expected


@pytest.mark.parametrize(
    ("engine", "version", "expected"),
    [
        ("vLLM", "0.10.99", True),
        ("vllm", "0.9.0", True),
        ("vLLM", "0.11.0", False),
        ("vLLM", "dev", False),
        ("vLLM", None, False),
        ("media", "0.2.0", False),
        ("forge", "0.1.0", False),
    ],
)
def test_is_legacy_interface(engine, version, expected):
    assert is_legacy_interface(engine, version) is expected


def test_data_parallel_specs_use_the_subdevice_mesh():
    meshes = {
        (s["device_type"], s["subdevice_type"]): derive(s)["mesh"]
        for s in iter_specs(catalog("v0.20.0"))
        if s["subdevice_type"]
    }
    assert meshes == {
        ("GALAXY", "T3K"): "T3K",
        ("P150X8", "P150"): "P150",
        ("DUAL_GALAXY", "T3K"): "T3K",
        ("QUAD_GALAXY", "T3K"): "T3K",
    }
