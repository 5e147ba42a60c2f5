"""Validation at the boundary (issue 13, Broke 8 and 10): spec values that reach docker argv, --mount values and
paths are refused with an error naming the spec file, the model, the device, the field and the value; malformed
specs name the key; spec files are read as small regular files only."""

from __future__ import annotations

import glob
import gzip
import json
import os
import threading
import time

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as _container
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.modules import container_command as container_module

SPECS = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4)), "fixtures", "specs")
FIXTURES = sorted(glob.glob(os.path.join(SPECS, "release_model_spec-*.json.gz")))
REPO = "meta-llama/Llama-3.2-1B-Instruct"


def v20_data():
    with gzip.open(os.path.join(SPECS, "release_model_spec-v0.20.0.json.gz"), "rb") as handle:
        return json.loads(handle.read())


def write_spec_file(tmp_path, data, name="hostile.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def llama_n150(data):
    return data["model_specs"][REPO]["N150"]["vLLM"]["tt_transformers"]


def run_container_command(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        container_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


# --- every real spec still passes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_every_real_spec_is_accepted(path):
    catalog = ttis_catalog.load_spec_file(path)
    count = 0
    for spec in ttis_catalog.iter_specs(catalog):
        count += 1
        ttis_derive.derive(spec, catalog, volume_root="/srv/tt-cache")
        try:
            _container.container_command(spec, catalog, volume_root="/srv/tt-cache", host_weights_dir="/srv/w/m")
        except SpecError as exc:
            # What run.py itself refuses; never the boundary checks.
            assert "older than v0.11.0" in str(exc) or "multi-host" in str(exc), str(exc)
    assert count > 100


# --- Broke 8: a comma in model_name became docker --mount options --------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_name", "gpt-oss-120b,readonly,bind-propagation=rshared"),
        ("model_name", "Llama=1"),
        ("model_name", "Llama\nExecStartPre=/bin/sh"),
        ("model_name", 'Llama"x'),
        ("model_name", "Llama:ro"),
        ("model_name", "Llama\x00"),
        ("version", "0.11.1,readonly"),
        ("version", "0.11.1\r"),
        ("impl", "tt_transformers,bind-propagation=rshared"),
        ("hf_model_repo", "meta-llama/Llama --privileged"),
        ("hf_model_repo", "--privileged"),
        ("docker_image", "ghcr.io/x:1\n-v /:/host"),
        ("device_type", "N150\n"),
    ],
)
def test_spec_values_that_would_change_docker_arguments_are_refused(tmp_path, capsys, field, value):
    data = v20_data()
    spec = llama_n150(data)
    if field == "impl":
        spec["impl"]["impl_id"] = value
        field = "impl.impl_id"
    else:
        spec[field] = value
    path = write_spec_file(tmp_path, data)
    # Selected by the name the change leaves alone.
    model = "Llama-3.2-1B-Instruct" if field == "hf_model_repo" else REPO
    code, result = run_container_command(
        capsys, {"model": model, "device": "n150", "spec_file": path, "volume_root": "/srv/tt-cache"}
    )
    assert code == 1, result
    message = result["msg"]
    assert path in message and field in message and repr(value) in message
    assert "\n" not in message
    assert "argv" not in result


def test_the_comma_error_names_file_model_device_and_value(tmp_path):
    data = v20_data()
    llama_n150(data)["model_name"] = "gpt-oss-120b,readonly,bind-propagation=rshared"
    path = write_spec_file(tmp_path, data)
    catalog = ttis_catalog.load_spec_file(path)
    spec = ttis_select.select_spec(catalog, REPO, "n150")
    with pytest.raises(SpecError) as exc:
        _container.container_command(spec, catalog, volume_root="/srv/tt-cache")
    message = str(exc.value)
    assert message.startswith(f"{path} (tt-inference-server 0.20.0): the spec of ")
    assert "on N150: model_name 'gpt-oss-120b,readonly,bind-propagation=rshared' contains ','" in message


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"A": "1\nB=2"}, "env_vars.A"),
        ({"BAD NAME": "1"}, "env_vars name"),
        ({"A=B": "1"}, "env_vars name"),
        ({"A\n": "1"}, "env_vars name"),
        ({"A": ["x"]}, "env_vars.A"),
    ],
)
def test_env_vars_that_would_break_docker_e_are_refused(env, field):
    catalog = ttis_catalog.catalog_from_data(v20_data(), ttis_catalog.SOURCE_SPEC_FILE, path="/opt/specs/x.json")
    spec = {**ttis_select.select_spec(catalog, "whisper-large-v3", "n150"), "env_vars": env}
    with pytest.raises(SpecError) as exc:
        _container.container_command(spec, catalog, volume_root="/srv/tt-cache")
    assert "/opt/specs/x.json" in str(exc.value) and field in str(exc.value)


def test_env_values_with_commas_and_spaces_stay_valid():
    # MESH_DEVICE='(1, 4)' and warm-up lists are real values; they travel as one -e argument.
    catalog = ttis_catalog.catalog_from_data(v20_data(), ttis_catalog.SOURCE_SPEC_FILE)
    spec = {
        **ttis_select.select_spec(catalog, "whisper-large-v3", "n150"),
        "env_vars": {"MESH_DEVICE": "(1, 4)", "L": "32,64"},
    }
    argv = _container.container_command(spec, catalog)["argv"]
    assert "MESH_DEVICE=(1, 4)" in argv and "L=32,64" in argv


@pytest.mark.parametrize(("option", "value"), [("volume_root", "/srv/a=b"), ("host_weights_dir", '/srv/w"x')])
def test_host_paths_that_would_change_mount_options_are_refused(option, value):
    catalog = ttis_catalog.catalog_from_data(v20_data(), ttis_catalog.SOURCE_SPEC_FILE)
    spec = ttis_select.select_spec(catalog, REPO, "n150")
    with pytest.raises(SpecError, match=option):
        _container.container_command(spec, catalog, **{option: value})


# --- Broke 10: malformed specs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda spec: spec["impl"].pop("impl_id"), "has no 'impl.impl_id'"),
        (lambda spec: spec.pop("hf_model_repo"), "has no 'hf_model_repo'"),
        (lambda spec: spec.pop("impl"), "has no 'impl'"),
        (lambda spec: spec.update(env_vars=["A=1"]), "env_vars ['A=1'] is a list, not a mapping"),
        (
            lambda spec: spec["device_model_spec"].update(env_vars="A=1"),
            "device_model_spec.env_vars 'A=1' is a str, not a mapping",
        ),
        (lambda spec: spec.update(model_name=7), "model_name 7 is a int, not a non-empty string"),
    ],
)
def test_malformed_spec_names_file_model_device_and_key(tmp_path, change, expected):
    data = v20_data()
    change(llama_n150(data))
    path = write_spec_file(tmp_path, data)
    with pytest.raises(SpecError) as exc:
        ttis_catalog.load_spec_file(path)
    message = str(exc.value)
    assert path in message and "0.20.0" in message
    assert "N150" in message and ("Llama-3.2-1B-Instruct" in message)
    assert expected in message
    assert "release_model_spec.json of a tt-inference-server release" in message


def test_malformed_spec_given_as_data_is_named_by_its_release():
    data = v20_data()
    llama_n150(data)["impl"].pop("impl_id")
    with pytest.raises(SpecError, match=r"^the specs of tt-inference-server 0\.20\.0: the spec of .* has no"):
        ttis_catalog.catalog_from_data(data, ttis_catalog.SOURCE_SPEC_FILE)


def test_malformed_spec_through_the_module(tmp_path, capsys):
    data = v20_data()
    llama_n150(data)["env_vars"] = ["VLLM_TARGET_DEVICE=tt"]
    path = write_spec_file(tmp_path, data)
    code, result = run_container_command(capsys, {"model": REPO, "device": "n150", "spec_file": path})
    assert code == 1 and path in result["msg"] and "env_vars" in result["msg"] and "not a mapping" in result["msg"]


# --- spec files are small regular files -----------------------------------------------------------------------------


def test_fifo_spec_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "release_model_spec.json"
    os.mkfifo(fifo)
    outcome = {}

    def load():
        try:
            ttis_catalog.load_spec_file(str(fifo))
        except SpecError as exc:
            outcome["error"] = str(exc)

    started = time.monotonic()
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "reading a FIFO spec file blocked"
    assert time.monotonic() - started < 5
    assert str(fifo) in outcome["error"] and "fifo" in outcome["error"]


def test_spec_file_linked_from_a_user_writable_directory_is_not_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    target = tmp_path / "real.json"
    target.write_text(json.dumps(v20_data()))
    os.symlink(target, shared / "spec.json")
    with pytest.raises(SpecError, match="symbolic link"):
        ttis_catalog.load_spec_file(str(shared / "spec.json"))


def test_gzip_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ttis_catalog, "SPEC_FILE_LIMIT", 1 << 16)
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(b" " * (1 << 20)))
    with pytest.raises(SpecError, match="uncompressed"):
        ttis_catalog.load_spec_file(str(path))
