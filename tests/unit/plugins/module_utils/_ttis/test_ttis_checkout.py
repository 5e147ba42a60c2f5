# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Where specs come from, against real tt-inference-server code (tests/fixtures/ttis, see its README):

- a release installed from an archive (no .git), which upstream's workflows.model_spec refuses to import by itself;
- the warning of each cause that makes the loader fall back to the release's JSON export;
- upstream's dev catalog (MODEL_SPECS_ENV=dev, run.py --dev-mode), and the container command of run.py --dev-mode
  --docker-server, against upstream v0.20.0's own (tests/fixtures/ttis/devmode-v0.20.0-docker.json).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import venv

import pytest
from conftest import patch_module_args
from unit_helpers import unpack as unpack_archive
from unit_helpers import with_hardening

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import checkout as ttis_checkout
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import source as ttis_source
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import tags as ttis_tags
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.container import container_command
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.modules import container_command as container_command_module
from ansible_collections.ttfleet.inference.plugins.modules import model_spec as model_spec_module

FIXTURES = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4)), "fixtures")
V20_EXPORT = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
DEV_IMAGE = (
    "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.20.0-de59f8a-03fa3af"
)
PYTHON_HINT = "Python >= 3.10 and PyYAML"


def unpack(tag, dest):
    """The release archive of ``tag`` unpacked under ``dest``: the checkout, with no .git."""
    unpack_archive(os.path.join(FIXTURES, "ttis", f"tt-inference-server-{tag}-subset.tgz"), dest)
    checkout = os.path.join(str(dest), f"tt-inference-server-{tag[1:]}")
    assert not os.path.exists(os.path.join(checkout, ".git"))
    return checkout


def tree(path):
    """Every path under ``path`` with its size and mtime, to show that loading writes nothing."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            info = os.lstat(full)
            found[os.path.relpath(full, path)] = (info.st_size, info.st_mtime_ns)
    return found


def key(spec):
    return (spec["model_name"], spec["device_type"], spec["impl"]["impl_id"], spec["inference_engine"])


@pytest.fixture(scope="module")
def v15(tmp_path_factory):
    return unpack("v0.15.0", tmp_path_factory.mktemp("v15"))


@pytest.fixture(scope="module")
def v20(tmp_path_factory):
    return unpack("v0.20.0", tmp_path_factory.mktemp("v20"))


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python without PyYAML: a venv without the system's site-packages."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(str(path))
    python = str(path / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    assert subprocess.run([python, "-c", "import yaml"], env=env, capture_output=True, check=False).returncode != 0
    return python


@pytest.fixture
def no_pythonpath(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("PYTHONHOME", raising=False)


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        model_spec_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


# --- a release installed from an archive ---------------------------------------------------------


def test_upstream_refuses_the_archive_by_itself(v15):
    # The problem the loader works around: run in the release, upstream's own import fails.
    proc = subprocess.run(
        [sys.executable, "-B", "-c", "import workflows.model_spec"],
        cwd=v15,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "Repository root not found. No '.git' found in parent directories." in proc.stderr


def test_archive_release_gives_the_answers_of_its_code(v15):
    before = tree(v15)
    code = ttis_checkout.load_checkout(v15)
    assert tree(v15) == before
    assert (code["source"], code["release_version"], code["model_specs_env"]) == ("checkout_code", "0.15.0", "prod")
    assert code["git_marker_emulated"] is True
    assert code["warnings"] == []
    # v0.15.0's own export disagrees with its code: the loader must not have read it.
    export = ttis_catalog.load_spec_file(os.path.join(v15, "release_model_spec.json"))
    in_code = {key(spec) for spec in ttis_catalog.iter_specs(code)}
    in_export = {key(spec) for spec in ttis_catalog.iter_specs(export)}
    assert (len(in_code), len(in_export), len(in_code - in_export)) == (248, 214, 35)
    assert ("whisper-large-v3", "P300", "whisper", "media") in in_code - in_export
    flux = ttis_derive.resolve(code, "FLUX.1-dev", "t3k")
    assert flux["volume_name"] == "volume_id_tt_transformers-FLUX.1-dev-v0.14.0"
    assert flux["docker_image"] == "ghcr.io/tenstorrent/tt-media-inference-server:0.14.0-80180b9"
    assert "VLLM_RPC_TIMEOUT" not in flux["env_vars"]
    stale = ttis_derive.resolve(export, "FLUX.1-dev", "t3k")
    assert stale["volume_name"] == "volume_id_tt_transformers-FLUX.1-dev-v0.10.0"
    assert stale["env_vars"]["VLLM_RPC_TIMEOUT"] == "900000"
    # Data parallel on a galaxy: the code caches kernels per T3K replica, the export says TG.
    assert ttis_derive.resolve(code, "DeepSeek-R1-Distill-Llama-70B", "galaxy")["container"]["tt_cache_path"].endswith(
        "/cache_DeepSeek-R1-Distill-Llama-70B/T3K"
    )
    assert ttis_derive.resolve(export, "DeepSeek-R1-Distill-Llama-70B", "galaxy")["mesh"] == "TG"


def test_archive_answers_equal_a_clone(v15, tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(v15, clone)
    (clone / ".git").mkdir()
    from_clone = ttis_checkout.load_checkout(str(clone))
    assert from_clone["git_marker_emulated"] is False
    assert from_clone["model_specs"] == ttis_checkout.load_checkout(v15)["model_specs"]


def test_archive_below_another_repository(tmp_path):
    # Upstream's walk would stop at the outer .git and look for its files there; the loader stops at the checkout.
    (tmp_path / ".git").mkdir()
    checkout = unpack("v0.20.0", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-B", "-c", "import workflows.model_spec"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    catalog = ttis_checkout.load_checkout(checkout)
    assert (catalog["source"], catalog["git_marker_emulated"]) == ("checkout_code", True)
    assert (
        ttis_derive.resolve(catalog, "Qwen3-32B", "p300x2")["volume_name"]
        == "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    )


def test_archive_release_through_the_module(capsys, v15):
    code, result = run_module(capsys, {"model": "FLUX.1-dev", "device": "t3k", "tt_inference_server_dir": v15})
    assert code == 0, result
    assert (result["spec_source"], result["model_specs_env"]) == ("checkout_code", "prod")
    assert result["volume_name"] == "volume_id_tt_transformers-FLUX.1-dev-v0.14.0"
    assert "warnings" not in result


def test_prod_code_of_v020_equals_its_export(v20):
    code = ttis_checkout.load_checkout(v20)
    export = ttis_catalog.load_spec_file(V20_EXPORT)
    iter_specs = ttis_catalog.iter_specs
    assert {key(spec) for spec in iter_specs(code)} == {key(spec) for spec in iter_specs(export)}


# --- the fallback names its cause ----------------------------------------------------------------


def with_export(checkout, dest):
    """A copy of ``checkout`` with v0.20.0's release_model_spec.json (tests/fixtures/specs) beside its code."""
    copy = os.path.join(str(dest), "release")
    shutil.copytree(checkout, copy)
    with gzip.open(V20_EXPORT, "rb") as handle, open(os.path.join(copy, "release_model_spec.json"), "wb") as out:
        out.write(handle.read())
    return copy


def test_fallback_names_the_repository_root(v15, monkeypatch):
    # Without the stand-in .git marker, upstream's own refusal is the cause the warning names, with no Python hint.
    shim = "    if emulated:\n        pathlib.Path.exists = exists\n"
    assert shim in ttis_checkout._EXPORT_PROGRAM
    monkeypatch.setattr(ttis_checkout, "_EXPORT_PROGRAM", ttis_checkout._EXPORT_PROGRAM.replace(shim, ""))
    catalog = ttis_checkout.load_checkout(v15)
    assert (catalog["source"], catalog["import_error"]["cause"]) == ("release_model_spec.json", "repo_root")
    (warning,) = catalog["warnings"]
    assert (
        "workflows.model_spec refused to import: Repository root not found. No '.git' found in parent directories. "
        f"(no .git in {v15} or above it) at {v15}/workflows/utils.py:" in warning
    )
    assert "PyYAML" not in warning
    assert "v0.11.1 to v0.15.0" in warning


def test_fallback_without_pyyaml_says_so(v20, tmp_path, bare_python, no_pythonpath):
    checkout = with_export(v20, tmp_path)
    catalog = ttis_checkout.load_checkout(checkout, python=bare_python)
    assert catalog["source"] == "release_model_spec.json"
    assert catalog["import_error"]["cause"] == ttis_checkout.CAUSE_PYYAML
    (warning,) = catalog["warnings"]
    assert f"{bare_python} (Python {'.'.join(map(str, sys.version_info[:3]))}) has no PyYAML" in warning
    assert "No module named 'yaml'" in warning
    assert PYTHON_HINT in warning
    assert "Repository root" not in warning


def test_fallback_when_the_interpreter_does_not_run(v20, tmp_path):
    checkout = with_export(v20, tmp_path)
    catalog = ttis_checkout.load_checkout(checkout, python=str(tmp_path / "no-such-python"))
    assert catalog["import_error"]["cause"] == ttis_checkout.CAUSE_INTERPRETER
    assert f"cannot run {tmp_path / 'no-such-python'}" in catalog["warnings"][0]
    assert PYTHON_HINT in catalog["warnings"][0]


def test_fallback_when_the_code_fails(v20, tmp_path):
    checkout = with_export(v20, tmp_path)
    # Break the release's own catalog: the error of upstream's YAML loader is the cause, with no Python hint.
    with open(os.path.join(checkout, "workflows", "model_specs", "prod", "llm.yaml"), "w", encoding="utf-8") as out:
        out.write("templates: [{impl: no_such_impl}]\n")
    catalog = ttis_checkout.load_checkout(checkout)
    assert catalog["import_error"]["cause"] == ttis_checkout.CAUSE_CODE
    (warning,) = catalog["warnings"]
    assert "failed to import with" in warning
    assert "ValueError: Unknown impl 'no_such_impl'" in warning
    assert "model_spec.py:" in warning
    assert PYTHON_HINT not in warning and "PyYAML" not in warning


def test_fallback_when_a_module_is_missing(v20, tmp_path):
    checkout = with_export(v20, tmp_path)
    # A module the release's code imports and the interpreter lacks (another than PyYAML).
    with open(os.path.join(checkout, "workflows", "utils_report.py"), "a", encoding="utf-8") as out:
        out.write("\nimport ttfleet_absent_module\n")
    catalog = ttis_checkout.load_checkout(checkout)
    assert catalog["import_error"]["cause"] == ttis_checkout.CAUSE_MODULE
    assert "lacks the module 'ttfleet_absent_module'" in catalog["warnings"][0]
    assert PYTHON_HINT in catalog["warnings"][0]


def test_fallback_without_code(tmp_path):
    checkout = tmp_path / "export-only"
    checkout.mkdir()
    with gzip.open(V20_EXPORT, "rb") as handle:
        (checkout / "release_model_spec.json").write_bytes(handle.read())
    catalog = ttis_checkout.load_checkout(str(checkout))
    assert "import_error" not in catalog
    assert "it has no workflows/model_spec.py" in catalog["warnings"][0]
    assert PYTHON_HINT not in catalog["warnings"][0]


CHECKOUT = "/opt/tt-inference-server/releases/v0.15.0"


@pytest.mark.parametrize(
    ("info", "cause", "words", "python_hint"),
    [
        (
            {
                "kind": "import",
                "type": "FileNotFoundError",
                "message": "Repository root not found. No '.git' found in parent directories.",
                "python": [3, 11, 2],
                "where": CHECKOUT + "/workflows/utils.py:71",
            },
            ttis_checkout.CAUSE_REPO_ROOT,
            "workflows.model_spec refused to import: Repository root not found. No '.git' found in parent "
            f"directories. (no .git in {CHECKOUT} or above it)",
            False,
        ),
        (
            {
                "kind": "import",
                "type": "TypeError",
                "message": "dataclass() got an unexpected keyword argument 'kw_only'",
                "python": [3, 9, 18],
                "where": CHECKOUT + "/workflows/model_spec.py:930",
            },
            ttis_checkout.CAUSE_PYTHON,
            "does not import with /usr/bin/python3 (Python 3.9.18), older than the Python 3.10",
            True,
        ),
        (
            {
                "kind": "import",
                "type": "ModuleNotFoundError",
                "message": "No module named 'yaml'",
                "module": "yaml",
                "python": [3, 11, 2],
            },
            ttis_checkout.CAUSE_PYYAML,
            "/usr/bin/python3 (Python 3.11.2) has no PyYAML",
            True,
        ),
        (
            {
                "kind": "import",
                "type": "ModuleNotFoundError",
                "message": "No module named 'workflows.gone'",
                "module": "workflows.gone",
                "python": [3, 11, 2],
            },
            ttis_checkout.CAUSE_CODE,
            "failed to import with /usr/bin/python3 (Python 3.11.2): ModuleNotFoundError",
            False,
        ),
        (
            {"kind": "elsewhere", "where": "/usr/lib/python3/dist-packages/workflows/model_spec.py", "python": [3, 11]},
            ttis_checkout.CAUSE_CODE,
            "imported workflows.model_spec from /usr/lib/python3/dist-packages/workflows/model_spec.py, not from",
            False,
        ),
    ],
)
def test_each_cause_has_its_own_words(info, cause, words, python_hint):
    failure = ttis_checkout._import_failure(info, "/usr/bin/python3", CHECKOUT)
    assert failure.cause == cause
    assert words in str(failure)
    assert (PYTHON_HINT in failure.hint) is python_hint


def test_a_non_python_interpreter(v20, tmp_path):
    fake = shutil.which("false")
    with pytest.raises(ttis_checkout.CodeImportError, match="exit status 1") as info:
        ttis_checkout.export_from_checkout(v20, python=fake)
    assert info.value.cause == ttis_checkout.CAUSE_OUTPUT


# --- upstream's dev catalog ----------------------------------------------------------------------


def test_dev_catalog_as_run_py_dev_mode(v20):
    before = tree(v20)
    dev = ttis_checkout.load_checkout(v20, model_specs_env="dev")
    assert tree(v20) == before
    assert (dev["source"], dev["model_specs_env"], dev["release_version"]) == ("checkout_code", "dev", "0.20.0")
    prod = ttis_checkout.load_checkout(v20)
    in_dev = {key(spec) for spec in ttis_catalog.iter_specs(dev)}
    in_prod = {key(spec) for spec in ttis_catalog.iter_specs(prod)}
    assert (len(in_dev), len(in_prod)) == (298, 225)
    assert ("Llama-3.1-8B-Instruct", "P150", "forge_vllm_plugin", "forge") in in_dev - in_prod
    # Dev specs pin no image and no version (v0.17.0 and later): run.py needs --override-docker-image.
    assert not any(spec.get("version") or spec.get("docker_image") for spec in ttis_catalog.iter_specs(dev))
    with pytest.raises(SpecError, match=r"pins no version.*--override-docker-image.*option image"):
        ttis_derive.resolve(dev, "Qwen3-32B", "p300x2")
    result = ttis_derive.resolve(dev, "Qwen3-32B", "p300x2", volume_root="/srv/tt", image=DEV_IMAGE)
    assert result["volume_name"] == "volume_id_tt_transformers-Qwen3-32B-v0.20.0"
    assert (result["docker_image"], result["tt_metal_commit"]) == (DEV_IMAGE, None)
    with pytest.raises(SpecError, match=r"the dev catalog of tt-inference-server 0\.20\.0"):
        ttis_derive.resolve(dev, "Qwen3-32B", "n150")


def test_dev_catalog_refused_before_v016(v15):
    with pytest.raises(SpecError, match=r"has no dev catalog .*since v0\.16\.0.*Set model_specs_env to prod"):
        ttis_checkout.load_checkout(v15, model_specs_env="dev")


def test_dev_catalog_has_no_fallback(v20, tmp_path, bare_python, no_pythonpath):
    checkout = with_export(v20, tmp_path)
    with pytest.raises(SpecError, match=r"has no PyYAML.*There is no fallback") as info:
        ttis_checkout.load_checkout(checkout, python=bare_python, model_specs_env="dev")
    assert PYTHON_HINT in str(info.value)


def test_dev_catalog_needs_a_checkout(tmp_path):
    with pytest.raises(SpecError, match=r"spec_file .* is an export, one catalog already"):
        ttis_source.load_catalog(spec_file=V20_EXPORT, model_specs_env="dev")
    with pytest.raises(SpecError, match="model_specs_env must be one of prod, dev"):
        ttis_checkout.load_checkout(str(tmp_path), model_specs_env="staging")


def test_module_dev_catalog(capsys, v20, v15):
    args = {"model": "Qwen3-32B", "device": "p300x2", "tt_inference_server_dir": v20, "model_specs_env": "dev"}
    code, result = run_module(capsys, {**args, "image": DEV_IMAGE, "volume_root": "/srv/tt"})
    assert code == 0, result
    assert (result["model_specs_env"], result["version"]) == ("dev", "0.20.0")
    assert result["paths"]["volume"] == "/srv/tt/volume_id_tt_transformers-Qwen3-32B-v0.20.0"
    code, result = run_module(capsys, {**args, "list": True})
    assert code == 0, result
    assert {row["impl_id"] for row in result["models"]} == {"tt_transformers", "forge_vllm_plugin"}
    assert all(row["volume_name"] is None for row in result["models"])
    code, result = run_module(capsys, args)
    assert code == 1 and "--override-docker-image" in result["msg"]
    code, result = run_module(capsys, {**args, "tt_inference_server_dir": v15})
    assert code == 1 and "has no dev catalog" in result["msg"]
    code, result = run_module(capsys, {**args, "image": "-rm"})
    assert code == 1 and "is not a Docker image reference" in result["msg"]
    code, result = run_module(capsys, {**args, "model_specs_env": "staging"})
    assert code == 1 and "model_specs_env" in result["msg"]


def test_image_override_outside_dev(v20):
    # run.py --override-docker-image: the tag's version names the volume, commits come from a CI tag only.
    prod = ttis_checkout.load_checkout(v20)
    ci = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-dev-ubuntu-22.04-amd64:" + (
        "0.21.0-" + "a" * 40 + "-bbbbbbb-1234"
    )
    result = ttis_derive.resolve(prod, "Qwen3-32B", "p300x2", image=ci)
    assert (result["version"], result["tt_metal_commit"], result["vllm_commit"]) == ("0.21.0", "a" * 40, "bbbbbbb")
    kept = ttis_derive.resolve(prod, "Qwen3-32B", "p300x2", image="example/tt:dev")
    assert (kept["version"], kept["docker_image"]) == ("0.17.0", "example/tt:dev")
    media = "ghcr.io/tenstorrent/tt-media-inference-server:0.21.0-" + "c" * 40 + "-ddddddd-1"
    assert ttis_tags.image_commits(media) == ("c" * 40, None)


# --- run.py --dev-mode --docker-server -----------------------------------------------------------

with open(os.path.join(FIXTURES, "ttis", "devmode-v0.20.0-docker.json"), encoding="utf-8") as _handle:
    UPSTREAM = json.load(_handle)
SDXL = next(case for case in UPSTREAM["cases"] if case["model"] == "stable-diffusion-xl-base-1.0")


@pytest.fixture(scope="module")
def dev_checkout(tmp_path_factory):
    """The v0.20.0 archive, plus the entries of tt-media-server/ that run.py mounts one by one for the C++ server."""
    path = unpack("v0.20.0", tmp_path_factory.mktemp("devmode"))
    media = os.path.join(path, "tt-media-server")
    os.mkdir(media)
    os.mkdir(os.path.join(media, "cpp_server"))
    prefix = "type=bind,src={checkout}/tt-media-server/"
    for argument in SDXL["argv"]:
        if argument.startswith(prefix):
            open(os.path.join(media, argument[len(prefix) :].split(",", 1)[0]), "w").close()
    return path


@pytest.fixture(scope="module")
def dev(dev_checkout):
    return ttis_checkout.load_checkout(dev_checkout, model_specs_env="dev")


def command(catalog, case, **extra):
    spec = ttis_select.select_spec(catalog, case["model"], case["device"], engine=case["engine"])
    argv = case["argv"]
    options = {
        "volume_root": case["volume_root"],
        "port": case["port"],
        "image": case["image"],
        "name": argv[argv.index("--name") + 1],
        "env_file": argv[argv.index("--env-file") + 1].replace("{checkout}", catalog["checkout"]),
        "runtime_spec_file": case["runtime_spec_file"],
    }
    options.update(extra)
    return container_command(spec, catalog, **options)


@pytest.mark.parametrize("case", UPSTREAM["cases"], ids=lambda case: f"{case['model']}-{case['engine']}")
def test_dev_mode_command_is_upstreams(dev, case):
    result = command(dev, case)
    assert result["argv"] == with_hardening(
        argument.replace("{checkout}", dev["checkout"]) for argument in case["argv"]
    )
    assert result["version"] == "0.20.0"
    runtime = result["runtime_model_spec"]["runtime_model_spec"]
    assert runtime["docker_image"] == case["image"]
    if "runtime_model_spec" in case:
        assert runtime == case["runtime_model_spec"]


def test_dev_mode_needs_the_image_and_the_spec_file(dev):
    case = UPSTREAM["cases"][0]
    with pytest.raises(SpecError, match=r"pins no Docker image \(a dev spec\).*requires --override-docker-image"):
        command(dev, case, image=None)
    with pytest.raises(SpecError, match=r"RUNTIME_MODEL_SPEC_JSON_PATH.*set runtime_spec_file"):
        command(dev, case, runtime_spec_file=None)
    with pytest.raises(SpecError, match=r"pins no version.*--override-docker-image"):
        command(dev, case, image="example/tt:dev")


def test_dev_mode_of_older_releases(dev):
    # v0.16.0 to v0.18.0 mounted benchmarking/ and evals/ instead of reference_config/, and counted TRAINING as vLLM.
    older = {**dev, "release_version": "0.18.0"}
    argv = command(older, UPSTREAM["cases"][0])["argv"]
    mounted = [argument.split(",")[2] for argument in argv if argument.startswith("type=bind,src=" + dev["checkout"])]
    app = "dst=/home/container_app_user/app/"
    assert mounted == [app + "benchmarking", app + "evals", app + "utils", app + "tests", app + "src"]


def test_prod_catalog_has_no_dev_mounts(dev_checkout):
    prod = ttis_checkout.load_checkout(dev_checkout)
    spec = ttis_select.select_spec(prod, "Qwen3-32B", "p300x2")
    result = container_command(spec, prod, volume_root="/srv/tt", runtime_spec_file="/etc/x.json")
    assert result["runtime_model_spec"] is None
    assert not any("RUNTIME_MODEL_SPEC_JSON_PATH" in argument or "/app/" in argument for argument in result["argv"])
    assert result["volume"] == "/srv/tt/volume_id_tt_transformers-Qwen3-32B-v0.17.0"


def test_module_dev_mode(capsys, dev_checkout):
    case = UPSTREAM["cases"][0]
    args = {
        "model": case["model"],
        "device": case["device"],
        "tt_inference_server_dir": dev_checkout,
        "model_specs_env": "dev",
        "image": DEV_IMAGE,
        "volume_root": "/srv/tt",
        "runtime_spec_file": "/etc/ttfleet/serve/qwen3-32b.model_spec.json",
    }
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        container_command_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0, result
    assert (
        "RUNTIME_MODEL_SPEC_JSON_PATH=/home/container_app_user/model_specs/qwen3-32b.model_spec.json" in result["argv"]
    )
    assert result["runtime_model_spec"]["runtime_model_spec"]["version"] == "0.20.0"
    assert result["volume"] == "/srv/tt/volume_id_tt_transformers-Qwen3-32B-v0.20.0"
    # The file's text is what ansible's own to_nice_json made of the document before (serve wrote that): a file
    # written by an older collection is byte for byte the same, so upgrading the collection restarts nothing.
    from ansible.plugins.filter.core import to_nice_json

    assert result["runtime_model_spec_text"] == to_nice_json(result["runtime_model_spec"], sort_keys=True) + "\n"


def test_dev_mode_media_server_entries_must_be_listable(dev, tmp_path):
    copy = tmp_path / "release"
    shutil.copytree(dev["checkout"], copy, ignore=shutil.ignore_patterns("tt-media-server"))
    with pytest.raises(SpecError, match=r"cannot list .*tt-media-server"):
        command({**dev, "checkout": str(copy)}, SDXL)
