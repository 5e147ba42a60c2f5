# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""plugins/module_utils/_ttis/names.py: the volume, layout and container names, the one definition of each.

(Named test_ttis_names.py: pytest imports test files by basename, and _weights/test_names.py exists.)
"""

from __future__ import annotations

import calendar

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    CONTAINER_CACHE_ROOT,
    container_name,
    container_path,
    container_tt_cache_path,
    match_volume_name,
    moved_aside_name,
    named_volume,
    parse_volume_name,
    sanitise_name,
    serve_unit,
    tensor_cache_parent,
    tt_metal_cache_subdir,
    version_key,
    volume_name,
    weights_subdir,
)

QB2 = "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
EXPECTED = "volume_id_tt_transformers-Qwen3-32B-v0.17.0"


# --------------------------------------------------------------------------- volumes


def test_the_names_upstream_gives_qwen3_on_a_quietbox_2():
    # UPSTREAM.md: Qwen3-32B on p300x2 under TTIS v0.20.0, with and without --host-volume.
    assert volume_name("tt_transformers", "Qwen3-32B", "0.17.0") == EXPECTED
    assert named_volume("tt_transformers", "Qwen3-32B") == "volume_id_tt_transformers-Qwen3-32B"
    # A build label takes the version's place: the factory volume of a QuietBox 2.
    assert volume_name("tt_transformers", "Qwen3-32B", "qb2_launch") == QB2


def test_every_host_volume_starts_with_its_named_volume():
    cases = (("tt_transformers", "Qwen3-32B", "0.17.0"), ("whisper", "distil-large-v3", "0.2.0"))
    for impl_id, model, version in cases:
        assert volume_name(impl_id, model, version) == f"{named_volume(impl_id, model)}-v{version}"
        assert match_volume_name(volume_name(impl_id, model, version), impl_id, model) == (version, None)
    assert parse_volume_name(named_volume("tt_transformers", "Qwen3-32B"))["model_name"] == "Qwen3-32B"


@pytest.mark.parametrize(
    "name, impl_id, model_name, version, label",
    [
        (EXPECTED, "tt_transformers", "Qwen3-32B", "0.17.0", None),
        (QB2, "tt_transformers", "Qwen3-32B", None, "qb2_launch"),
        (
            "volume_id_tt_transformers-Mistral-7B-Instruct-v0.3-v0.10.0",
            "tt_transformers",
            "Mistral-7B-Instruct-v0.3",
            "0.10.0",
            None,
        ),
        ("volume_id_whisper-distil-large-v3-v0.2.0", "whisper", "distil-large-v3", "0.2.0", None),
        ("volume_id_tt_transformers-bge-large-en-v1.5-v0.3.0", "tt_transformers", "bge-large-en-v1.5", "0.3.0", None),
        (
            "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.18.0-rc1",
            "tt_transformers",
            "Llama-3.1-8B-Instruct",
            "0.18.0-rc1",
            None,
        ),
        (
            "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.18",
            "tt_transformers",
            "Llama-3.1-8B-Instruct",
            None,
            "0.18",
        ),
        # Docker named volume: no version at all.
        ("volume_id_tt_transformers-Llama-3.1-8B-Instruct", "tt_transformers", "Llama-3.1-8B-Instruct", None, None),
        ("volume_id_qwen36_blackhole-Qwen3.6-27B-v0.20.0", "qwen36_blackhole", "Qwen3.6-27B", "0.20.0", None),
        ("volume_id_x-model with space-vlabel é", "x", "model with space", None, "label é"),
    ],
)
def test_parse_volume_name(name, impl_id, model_name, version, label):
    parsed = parse_volume_name(name)
    assert parsed == {
        "impl_id": impl_id,
        "model_name": model_name,
        "version": version,
        "label": label,
        "parsed": True,
        "moved_aside_from": None,
    }


def test_parse_moved_aside_name():
    parsed = parse_volume_name(EXPECTED + ".ttfleet-aside-20261130T041500Z-2")
    assert parsed["moved_aside_from"] == EXPECTED
    assert (parsed["model_name"], parsed["version"], parsed["label"]) == ("Qwen3-32B", "0.17.0", None)
    assert match_volume_name(EXPECTED + ".ttfleet-aside-20261130T041500Z", "tt_transformers", "Qwen3-32B") is None


@pytest.mark.parametrize(
    "name",
    [
        "volume_id_",
        "volume_id_abc",
        "volume_id_-Qwen3-32B-v0.17.0",
        "volume_id_tt_transformers-",
        "volume_id_tt_transformers-Qwen3-32B-v",
        "volume_id_tt_transformers--v0.17.0",
        "volume_id_tt_transformers-..-v0.17.0",
        "volume_id_tt_transformers-.",
        "not_a_volume-Qwen3-32B-v0.17.0",
        "VOLUME_ID_tt_transformers-Qwen3-32B-v0.17.0",
    ],
)
def test_parse_volume_name_rejects_malformed(name):
    assert parse_volume_name(name)["parsed"] is False


def test_volume_name_round_trips():
    name = volume_name("tt_transformers", "Mistral-7B-Instruct-v0.3", "0.10.0")
    assert name == "volume_id_tt_transformers-Mistral-7B-Instruct-v0.3-v0.10.0"
    assert match_volume_name(name, "tt_transformers", "Mistral-7B-Instruct-v0.3") == ("0.10.0", None)


def test_match_volume_name_is_exact_where_parse_guesses():
    name = "volume_id_tt_transformers-Qwen3-32B-vqb2-vfinal"
    assert parse_volume_name(name)["model_name"] == "Qwen3-32B-vqb2"
    assert match_volume_name(name, "tt_transformers", "Qwen3-32B") == (None, "qb2-vfinal")
    assert match_volume_name(name, "tt_transformers", "Qwen3") is None
    assert match_volume_name(name, "tt", "Qwen3-32B") is None
    assert match_volume_name("volume_id_tt_transformers-Qwen3-32B-v", "tt_transformers", "Qwen3-32B") is None


def test_version_key_orders_pins():
    versions = ["0.9.0", "0.17.0", "0.10.1", "0.17.0-rc1", "1.0.0+build5"]
    assert sorted(versions, key=version_key) == ["0.9.0", "0.10.1", "0.17.0-rc1", "0.17.0", "1.0.0+build5"]
    for text in ("qb2_launch", "0.17", "v0.17.0", "", None, "0.17.0.1"):
        assert version_key(text) is None


def test_moved_aside_name_is_stamped_in_utc():
    now = calendar.timegm((2026, 11, 30, 4, 15, 0))
    assert moved_aside_name(EXPECTED, now) == EXPECTED + ".ttfleet-aside-20261130T041500Z"
    assert parse_volume_name(moved_aside_name(EXPECTED, now))["moved_aside_from"] == EXPECTED
    assert moved_aside_name("P300x2").startswith("P300x2.ttfleet-aside-20")


# --------------------------------------------------------------------------- under a volume


def test_the_layout_under_a_volume():
    assert weights_subdir("Qwen3-32B") == "weights/Qwen3-32B"
    assert tensor_cache_parent("Qwen3-32B") == "tt_metal_cache/cache_Qwen3-32B"
    assert tt_metal_cache_subdir("Qwen3-32B", "P300x2") == "tt_metal_cache/cache_Qwen3-32B/P300x2"
    assert CONTAINER_CACHE_ROOT == "/home/container_app_user/cache_root"
    # UPSTREAM.md: TT_CACHE_PATH of run.py --host-volume.
    assert (
        container_tt_cache_path("Qwen3-32B", "P300x2")
        == "/home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/P300x2"
    )
    assert container_path(weights_subdir("Qwen3-32B")) == "/home/container_app_user/cache_root/weights/Qwen3-32B"


# --------------------------------------------------------------------------- containers


@pytest.mark.parametrize(
    ("model", "device", "port", "name"),
    [
        ("Qwen3-32B", "p300x2", 8000, "tt-qwen3-32b-p300x2"),
        ("Qwen3-32B", "p300x2", "8000", "tt-qwen3-32b-p300x2"),
        ("Llama-3.2-1B-Instruct", "n150", 8001, "tt-llama-3.2-1b-instruct-n150-8001"),
        ("stable-diffusion-xl-base-1.0", "galaxy_t3k", 9000, "tt-stable-diffusion-xl-base-1.0-galaxy_t3k-9000"),
    ],
)
def test_container_name(model, device, port, name):
    assert container_name(model, device, port) == name


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("my model/x", "my-model-x"),
        ("..hidden", "hidden"),
        ("-lead", "lead"),
        ("a...b", "a.b"),
        ("x" * 200, "x" * 128),
    ],
)
def test_sanitise_name(given, name):
    assert sanitise_name(given) == name


@pytest.mark.parametrize("given", ["", "///", "-._", "é"])
def test_sanitise_name_refuses_nothing_usable(given):
    with pytest.raises(SpecError, match="no usable characters for a container name"):
        sanitise_name(given)


def test_serve_unit():
    assert serve_unit("qwen3-32b") == "tt-serve@qwen3-32b.service"
