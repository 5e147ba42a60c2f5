# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The import path of _ttis/checkout.py against a stand-in checkout, the model_spec module and the filters."""

from __future__ import annotations

import gzip
import json
import os
import sys
import textwrap

import pytest
from ansible.errors import AnsibleFilterError
from conftest import FIXTURES, patch_module_args

from ansible_collections.ttfleet.inference.plugins.filter import tt_names
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import checkout as ttis_checkout
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import source as ttis_source
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.modules import model_spec as model_spec_module

SPEC_DIR = os.path.join(FIXTURES, "specs")
V20 = os.path.join(SPEC_DIR, "release_model_spec-v0.20.0.json.gz")

# A test stand-in for a TTIS checkout: the smallest workflows package exposing what the loader
# imports (MODEL_SPECS of dataclass specs with enum device types, VERSION, DeviceTypes with
# to_mesh_device_str). It is not upstream code.
STAND_IN_TYPES = textwrap.dedent(
    """
    import enum


    class DeviceTypes(enum.IntEnum):
        N150 = 1
        P300X2 = 2
        NEW_BOX = 3

        def to_mesh_device_str(self):
            return {"N150": "N150", "P300X2": "P300x2", "NEW_BOX": "NB"}[self.name]


    class InferenceEngine(enum.Enum):
        VLLM = "vLLM"
    """
)

STAND_IN_SPECS = textwrap.dedent(
    """
    import dataclasses
    import os
    from typing import Optional

    from workflows.workflow_types import DeviceTypes, InferenceEngine

    VERSION = "9.9.9"
    MODEL_SPECS_SCHEMA_VERSION = "0.1.0"
    if os.environ.get("MODEL_SPECS_ENV") != "prod":
        raise RuntimeError("the loader must ask for the prod catalog")


    @dataclasses.dataclass(frozen=True)
    class Impl:
        impl_id: str
        impl_name: str


    @dataclasses.dataclass(frozen=True)
    class DeviceSpec:
        device: DeviceTypes
        max_concurrency: int
        max_context: int
        default_impl: bool = False
        env_vars: dict = dataclasses.field(default_factory=dict)
        vllm_args: dict = dataclasses.field(default_factory=dict)


    @dataclasses.dataclass(frozen=True)
    class Spec:
        model_id: str
        impl: Impl
        hf_model_repo: str
        model_name: str
        inference_engine: str
        device_type: DeviceTypes
        device_model_spec: DeviceSpec
        version: str
        docker_image: str
        env_vars: dict = dataclasses.field(default_factory=dict)
        subdevice_type: Optional[DeviceTypes] = None


    def _spec(device, version, default=True):
        impl = Impl("tt_transformers", "tt-transformers")
        return Spec(
            model_id=f"id_tt-transformers_Tiny-1B_{device.name.lower()}",
            impl=impl,
            hf_model_repo="example/Tiny-1B",
            model_name="Tiny-1B",
            inference_engine=InferenceEngine.VLLM.value,
            device_type=device,
            device_model_spec=DeviceSpec(device, 1, 1024, default, {"MESH_DEVICE": "x"}, {"model": "example/Tiny-1B"}),
            version=version,
            docker_image=f"example/image:{version}-abc",
        )


    MODEL_SPECS = {
        spec.model_id: spec
        for spec in (
            _spec(DeviceTypes.N150, "0.9.0"),
            _spec(DeviceTypes.P300X2, "0.17.0"),
            _spec(DeviceTypes.NEW_BOX, "1.0.0"),
        )
    }
    print("noise on stdout must not break the export")
    """
)


def make_stand_in_checkout(root, with_release_file=False):
    workflows = root / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "__init__.py").write_text("")
    (workflows / "workflow_types.py").write_text(STAND_IN_TYPES)
    (workflows / "model_spec.py").write_text(STAND_IN_SPECS)
    if with_release_file:
        with gzip.open(V20, "rb") as handle:
            (root / "release_model_spec.json").write_bytes(handle.read())
    return str(root)


# --- import path -------------------------------------------------------------------------------


def test_checkout_code_is_imported(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_SPECS_ENV", "dev")
    checkout = make_stand_in_checkout(tmp_path, with_release_file=True)
    catalog = ttis_checkout.load_checkout(checkout)
    assert catalog["source"] == "checkout_code"
    assert catalog["release_version"] == "9.9.9"
    assert catalog["device_mesh"]["NEW_BOX"] == "NB"
    assert catalog["warnings"] == []
    result = ttis_derive.resolve(catalog, "Tiny-1B", "p300x2")
    assert result["volume_name"] == "volume_id_tt_transformers-Tiny-1B-v0.17.0"
    assert result["mesh"] == "P300x2"
    assert result["spec_source"] == "checkout_code"
    # A device the loader only knows from the checkout's own DeviceTypes.
    assert ttis_derive.resolve(catalog, "example/Tiny-1B", "new_box")["mesh"] == "NB"
    assert ttis_derive.resolve(catalog, "Tiny-1B", "n150")["legacy_interface"] is True
    assert not any(name == "__pycache__" for _root, dirs, _files in os.walk(checkout) for name in dirs)


def test_import_failure_falls_back_to_release_file(tmp_path):
    checkout = make_stand_in_checkout(tmp_path, with_release_file=True)
    (tmp_path / "workflows" / "model_spec.py").write_text("import yaml_that_is_not_installed\n")
    catalog = ttis_checkout.load_checkout(checkout)
    assert catalog["source"] == "release_model_spec.json"
    assert "yaml_that_is_not_installed" in catalog["warnings"][0]
    assert ttis_derive.resolve(catalog, "Qwen3-32B", "p300x2")["volume_name"].endswith("-v0.17.0")


def test_missing_interpreter_falls_back(tmp_path):
    checkout = make_stand_in_checkout(tmp_path, with_release_file=True)
    catalog = ttis_checkout.load_checkout(checkout, python=str(tmp_path / "no-such-python"))
    assert catalog["source"] == "release_model_spec.json"
    assert "cannot run" in catalog["warnings"][0]


def test_export_error_names_the_interpreter(tmp_path):
    checkout = make_stand_in_checkout(tmp_path)
    (tmp_path / "workflows" / "model_spec.py").write_text("raise SystemExit('too old')\n")
    with pytest.raises(SpecError, match=r"model_spec of .* failed to import with .*: SystemExit: too old") as info:
        ttis_checkout.export_from_checkout(checkout, python=sys.executable)
    assert info.value.cause == ttis_checkout.CAUSE_CODE


# --- module ------------------------------------------------------------------------------------


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_spec_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_resolves_quietbox2(capsys):
    code, result = run_module(
        capsys,
        {
            "model": "Qwen3-32B",
            "device": "p300x2",
            "spec_file": V20,
            "volume_root": "/srv/tt",
            "_ansible_check_mode": True,
        },
    )
    assert code == 0
    assert result["changed"] is False
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    assert (
        result["paths"]["tt_metal_cache"]
        == "/srv/tt/volume_id_tt_transformers-Qwen3-32B-v0.17.0/tt_metal_cache/cache_Qwen3-32B/P300x2"
    )
    assert result["container"]["tt_cache_path"].endswith("/cache_Qwen3-32B/P300x2")
    assert (result["spec_source"], result["release_version"]) == ("spec_file", "0.20.0")
    for key in (
        "model_name",
        "hf_model_repo",
        "impl_id",
        "impl_name",
        "inference_engine",
        "device_type",
        "version",
        "docker_image",
        "mesh",
        "volume_name",
        "named_volume",
        "legacy_interface",
        "min_disk_gb",
        "min_ram_gb",
        "system_requirements",
        "env_vars",
        "paths",
        "container",
        "spec_source",
        "release_version",
        "tt_metal_commit",
        "vllm_commit",
        "vllm_args",
    ):
        assert key in result


def test_module_list_mode(capsys):
    code, result = run_module(capsys, {"device": "p300x2", "list": True, "spec_file": V20})
    assert code == 0
    assert len(result["models"]) == 22
    assert "volume_name" not in result


def test_module_reports_spec_errors(capsys):
    code, result = run_module(capsys, {"model": "Qwen3-32", "device": "p300x2", "spec_file": V20})
    assert code == 1
    assert result["failed"] is True
    assert "Qwen3-32B" in result["msg"]


def test_module_checks_names_before_reading(capsys, tmp_path):
    code, result = run_module(
        capsys, {"model": "../x", "device": "p300x2", "spec_file": str(tmp_path / "missing.json")}
    )
    assert code == 1
    assert "'..'" in result["msg"]


def test_module_needs_model_and_device_unless_listing(capsys):
    code, result = run_module(capsys, {"device": "p300x2", "spec_file": V20})
    assert code == 1
    assert "model" in result["msg"]


# --- filters -----------------------------------------------------------------------------------


def test_filters_are_registered():
    assert set(tt_names.FilterModule().filters()) == {
        "tt_volume_name",
        "tt_named_volume",
        "tt_mesh",
        "tt_cache_subdir",
        "tt_cache_path",
        "tt_legacy_interface",
    }


def test_filters_with_arguments():
    assert (
        tt_names.tt_volume_name("tt_transformers", "Qwen3-32B", "0.17.0")
        == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    )
    assert (
        tt_names.tt_volume_name("tt_transformers", "Qwen3-32B", "qb2_launch")
        == "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
    )
    assert tt_names.tt_named_volume("qwen3_32b_galaxy", "Qwen3-32B") == "volume_id_qwen3_32b_galaxy-Qwen3-32B"
    assert tt_names.tt_mesh("galaxy") == "TG"
    assert tt_names.tt_mesh("P300X2") == "P300x2"
    assert tt_names.tt_cache_subdir("Qwen3-32B", "P300x2") == "tt_metal_cache/cache_Qwen3-32B/P300x2"
    assert (
        tt_names.tt_cache_path("Qwen3-32B", "T3K")
        == "/home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/T3K"
    )
    assert tt_names.tt_legacy_interface("0.9.0") is True
    assert tt_names.tt_legacy_interface("0.9.0", "media") is False


def test_filters_on_a_model_spec_result():
    result = ttis_derive.resolve(ttis_catalog.load_spec_file(V20), "Qwen3-32B", "galaxy")
    assert tt_names.tt_volume_name(result) == result["volume_name"]
    assert tt_names.tt_named_volume(result) == result["named_volume"]
    assert tt_names.tt_cache_subdir(result) == "tt_metal_cache/cache_Qwen3-32B/T3K"
    assert tt_names.tt_cache_path(result) == result["container"]["tt_cache_path"]
    assert tt_names.tt_legacy_interface(result) is False


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tt_names.tt_volume_name("../x", "m", "1"), "'..'"),
        (lambda: tt_names.tt_volume_name("tt_transformers", "a/b", "1"), "'/'"),
        (lambda: tt_names.tt_volume_name("tt_transformers"), "model_name, version"),
        (lambda: tt_names.tt_volume_name({"impl_id": "x"}), "lacks model_name, version"),
        (lambda: tt_names.tt_mesh("p150x2"), "Unknown device"),
    ],
)
def test_filter_errors(call, message):
    with pytest.raises(AnsibleFilterError, match=message):
        call()


# --- default source: the inference_server role's current release -------------------------------


def make_role_layout(tmp_path, with_venv=True):
    """<root>/releases/v0.20.0 (a stand-in checkout), venvs/v0.20.0 and current, laid out as the role does."""
    root = tmp_path / "opt-tt-inference-server"
    make_stand_in_checkout(root / "releases" / "v0.20.0", with_release_file=True)
    if with_venv:
        bin_dir = root / "venvs" / "v0.20.0" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").symlink_to(sys.executable)
    (root / "current").symlink_to("releases/v0.20.0")
    return root


def test_release_python_is_the_release_venv(tmp_path):
    root = make_role_layout(tmp_path)
    venv_python = str(root / "venvs" / "v0.20.0" / "bin" / "python")
    assert ttis_checkout.release_python(str(root / "current")) == venv_python
    assert ttis_checkout.release_python(str(root / "releases" / "v0.20.0")) == venv_python
    catalog = ttis_checkout.load_checkout(str(root / "current"))
    assert (catalog["source"], catalog["python"]) == ("checkout_code", venv_python)


def test_release_python_absent_outside_the_role_layout(tmp_path):
    assert ttis_checkout.release_python(make_stand_in_checkout(tmp_path / "checkout")) is None
    root = make_role_layout(tmp_path / "novenv", with_venv=False)
    assert ttis_checkout.release_python(str(root / "current")) is None
    # Without the venv the module's own interpreter imports the code.
    assert ttis_checkout.load_checkout(str(root / "current"))["python"] == sys.executable


def test_default_checkout():
    assert ttis_source.default_checkout("/srv/ttis", None) == "/srv/ttis"
    assert ttis_source.default_checkout(None, "/srv/spec.json") is None


def test_module_reads_the_current_release_by_default(capsys, tmp_path, monkeypatch):
    root = make_role_layout(tmp_path)
    monkeypatch.setattr(ttis_source, "DEFAULT_CHECKOUT", str(root / "current"))
    code, result = run_module(capsys, {"model": "Tiny-1B", "device": "p300x2"})
    assert code == 0
    assert result["spec_source"] == "checkout_code"
    assert result["spec_path"] == str(root / "current" / "workflows" / "model_spec.py")
    assert result["volume_name"] == "volume_id_tt_transformers-Tiny-1B-v0.17.0"


def test_module_default_falls_back_to_the_release_file(capsys, tmp_path, monkeypatch):
    root = make_role_layout(tmp_path)
    (root / "releases" / "v0.20.0" / "workflows" / "model_spec.py").unlink()
    monkeypatch.setattr(ttis_source, "DEFAULT_CHECKOUT", str(root / "current"))
    code, result = run_module(capsys, {"model": "Qwen3-32B", "device": "p300x2"})
    assert code == 0
    assert (result["spec_source"], result["release_version"]) == ("release_model_spec.json", "0.20.0")
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"


def test_module_without_source_or_current_release(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(ttis_source, "DEFAULT_CHECKOUT", str(tmp_path / "missing" / "current"))
    code, result = run_module(capsys, {"model": "Qwen3-32B", "device": "p300x2"})
    assert code == 1
    assert "Neither tt_inference_server_dir nor spec_file is set" in result["msg"]
    assert "ttfleet.inference.inference_server" in result["msg"]


def test_module_sources_stay_mutually_exclusive(capsys, tmp_path):
    code, result = run_module(
        capsys, {"model": "Qwen3-32B", "device": "p300x2", "spec_file": V20, "tt_inference_server_dir": str(tmp_path)}
    )
    assert code == 1
    assert "mutually exclusive" in result["msg"]
