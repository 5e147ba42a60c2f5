# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The parity table of the image entrypoints (tests/fixtures/ttis/entrypoint-parity.json), derived from upstream's code.

For every release archived in tests/fixtures/ttis/entrypoints, upstream's own ``run_vllm_api_server.py`` with its
``utils/`` runs in a child interpreter, as the image runs it, with only vLLM replaced (the lab's stand-in package,
tests/lab/upstream_image/stubs, which records the final ``sys.argv`` and environment instead of serving). Each row of
the table must be what that code does; the collection's rules (plugins/module_utils/_entrypoint.py) must equal every
row; and every vLLM image version the catalogs in tests/fixtures/specs pin must be covered. A new upstream release that
changes the rule therefore fails here once its archive is added, not on a fleet.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
from unit_helpers import unpack

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import entrypoint
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import parse_version_tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
ARCHIVES = os.path.join(FIXTURES, "ttis", "entrypoints")
STUBS = os.path.join(ROOT, "tests", "lab", "upstream_image", "stubs")
with open(os.path.join(FIXTURES, "ttis", "entrypoint-parity.json"), encoding="utf-8") as _handle:
    TABLE = json.load(_handle)
ROWS = {row["tag"]: row for row in TABLE["releases"]}
ARCHIVED = sorted(
    (name.split("-")[3] for name in os.listdir(ARCHIVES) if name.endswith("-entrypoint.tgz")),
    key=lambda tag: parse_version_tuple(tag.lstrip("v")),
)
MODEL = "meta-llama/Llama-3.2-1B-Instruct"


def _version(tag):
    return parse_version_tuple(tag.lstrip("v"))


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """Each archived release unpacked once: {tag: checkout}."""
    root = tmp_path_factory.mktemp("entrypoints")
    out = {}
    for tag in ARCHIVED:
        unpack(os.path.join(ARCHIVES, f"tt-inference-server-{tag}-entrypoint.tgz"), root / tag)
        (top,) = list((root / tag).iterdir())
        out[tag] = top
    return out


def spec(vllm_args=None, dms_env=None, env=None):
    """A runtime spec in the shape every release's run.py writes (RUNTIME_MODEL_SPEC_JSON_PATH)."""
    return {
        "model_id": "id_tt-transformers_Llama-3.2-1B-Instruct_n150",
        "impl": {"impl_id": "tt_transformers", "impl_name": "tt-transformers"},
        "hf_model_repo": MODEL,
        "model_name": "Llama-3.2-1B-Instruct",
        "inference_engine": "vLLM",
        "device_type": "N150",
        "env_vars": env or {},
        "device_model_spec": {
            "device": "N150",
            "max_concurrency": 32,
            "max_context": 131072,
            "vllm_args": {"model": MODEL, "max_num_seqs": "32", "seed": "9472", **(vllm_args or {})},
            "override_tt_config": {},
            "env_vars": dms_env or {},
        },
    }


def start(checkout, tmp_path, argv=(), runtime=None, env=None, weights=True, catalog=None):
    """Run the release's entrypoint; returns (record of what vLLM was started with, the entrypoint's log)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cache = tmp_path / "cache_root"
    (cache / "weights" / "Llama-3.2-1B-Instruct").mkdir(parents=True, exist_ok=True)
    (cache / "weights" / "Llama-3.2-1B-Instruct" / "config.json").write_text("{}")
    record = tmp_path / "record.json"
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([STUBS, str(checkout)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "CACHE_ROOT": str(cache),
        "TT_CACHE_PATH": str(cache / "tt_metal_cache"),
        "TT_METAL_HOME": str(tmp_path / "tt-metal"),
        "TT_METAL_LOGS_PATH": str(tmp_path / "logs"),
        "LAB_VLLM_RECORD": str(record),
        "LAB_VLLM_NO_SERVE": "1",
        # No hub: a refused port fails at once.
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HUB_ETAG_TIMEOUT": "2",
        "HF_HUB_DOWNLOAD_TIMEOUT": "2",
    }
    if weights:
        environ["MODEL_WEIGHTS_DIR"] = str(cache / "weights" / "Llama-3.2-1B-Instruct")
    if runtime is not None:
        path = tmp_path / "runtime.json"
        path.write_text(json.dumps({"runtime_model_spec": runtime}))
        environ["RUNTIME_MODEL_SPEC_JSON_PATH"] = str(path)
    if catalog is not None:
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps(catalog))
        environ["MODEL_SPECS_JSON_PATH"] = str(path)
        environ["RUNTIME_MODEL_SPEC_JSON_PATH"] = str(tmp_path / "absent.json")
    environ.update(env or {})
    command = [sys.executable, "run_vllm_api_server.py", "--model", MODEL, "--tt-device", "n150"]
    command += ["--disable-trace-capture", *argv]
    proc = subprocess.run(
        command,
        cwd=checkout / "vllm-tt-metal" / "src",
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(record.read_text()), proc.stdout + proc.stderr


def tt_config_arg_of(checkout):
    """The TT config argument of the release's DeviceModelSpec defaults (its image catalog is written with it)."""
    text = (checkout / "workflows" / "model_spec.py").read_text()
    found = set(re.findall(r'"(\w+)": json\.dumps\((\{"tt": )?self\.override_tt_config', text))
    assert len(found) == 1, found
    ((arg, wrap),) = found
    return arg, bool(wrap)


def derive(checkout, tmp_path):
    """The row of a release, from what its code does (its starts run side by side: each waits on imports)."""
    catalog = {"model_specs": {MODEL: {"N150": {"vLLM": {"tt_transformers": {**spec(), "docker_image": "x"}}}}}}
    starts = {
        "argv": (["--max-num-seqs", "16", "--service-port", "8123"], {"runtime": spec()}),
        "env": (
            [],
            {
                "runtime": spec(dms_env={"LAB_A": "dms", "LAB_B": "dms"}, env={"LAB_B": "top"}),
                "env": {"LAB_A": "container", "LAB_C": "container"},
            },
        ),
        "catalog": ([], {"catalog": catalog}),
        "runtime": ([], {"runtime": spec()}),
        "weights": ([], {"runtime": spec(), "weights": False}),
        "noauth": (["--no-auth"], {"runtime": spec(), "env": {"VLLM_API_KEY": "k"}}),
        "jwt": ([], {"runtime": spec(), "env": {"JWT_SECRET": "s"}}),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(start, checkout, tmp_path / name, argv, **options)
            for name, (argv, options) in starts.items()
        }
        done = {name: future.result() for name, future in futures.items()}
    argv_record = done["argv"][0]
    env_record = done["env"][0]
    order = ["container"]
    if env_record["env"].get("LAB_A") == "dms":
        order.append("device_model_spec.env_vars")
    if env_record["env"].get("LAB_B") == "top":
        order.append("env_vars")
    catalog_record, runtime_record = done["catalog"][0], done["runtime"][0]
    weights_log = done["weights"][1]
    no_auth, jwt = done["noauth"][0], done["jwt"][0]
    arg, wrapped = tt_config_arg_of(checkout)
    return {
        "spec_read_from": [
            "RUNTIME_MODEL_SPEC_JSON_PATH" if runtime_record["spec_source"].endswith("runtime.json") else "?",
            "MODEL_SPECS_JSON_PATH" if catalog_record["spec_source"].endswith("catalog.json") else "?",
        ],
        "cli_over_spec": str(argv_record["vllm_args"].get("max_num_seqs")) == "16",
        "service_port_to_vllm": str(argv_record["vllm_args"].get("port")) == "8123",
        "tt_config_arg": arg,
        "tt_config_wrapped": wrapped,
        "weights_always_checked": "Downloading weights from" in weights_log,
        "env_precedence": order if env_record["env"].get("LAB_C") == "container" else ["?"],
        "auth": {
            "no_auth_clears_key": "VLLM_API_KEY" not in no_auth["env"],
            "jwt_secret_makes_key": "VLLM_API_KEY" in jwt["env"],
        },
    }


def test_every_archived_release_has_a_row():
    assert sorted(ROWS, key=_version) == ARCHIVED


@pytest.mark.parametrize("tag", ARCHIVED)
def test_row_is_what_upstreams_code_does(checkouts, tmp_path, tag):
    checkout = checkouts[tag]
    blob = (checkout / "vllm-tt-metal" / "src" / "run_vllm_api_server.py").read_bytes()
    header = f"blob {len(blob)}\0".encode()

    assert hashlib.sha1(header + blob, usedforsecurity=False).hexdigest() == ROWS[tag]["run_vllm_api_server_blob"], (
        f"{tag}: the entrypoint is not the one this row was derived from"
    )
    row = {key: value for key, value in ROWS[tag].items() if key not in ("tag", "run_vllm_api_server_blob")}
    assert derive(checkout, tmp_path) == row


@pytest.mark.parametrize("tag", sorted(ROWS, key=_version))
def test_collection_rules_equal_the_row(tag):
    gen = entrypoint.generation(_version(tag))
    row = ROWS[tag]
    assert (gen.cli_over_spec, gen.service_port_to_vllm, gen.tt_config_arg, gen.tt_config_wrapped) == (
        row["cli_over_spec"],
        row["service_port_to_vllm"],
        row["tt_config_arg"],
        row["tt_config_wrapped"],
    )
    assert gen.weights_always_checked == row["weights_always_checked"]


def _pinned_vllm_versions(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)

    def walk(node):
        if isinstance(node, dict):
            if "docker_image" in node:
                yield node
                return
            for value in node.values():
                yield from walk(value)

    for spec_ in walk(data.get("model_specs", data)):
        version = parse_version_tuple(str(spec_["docker_image"]).rsplit(":", 1)[-1])
        if spec_.get("inference_engine") == "vLLM" and version and version >= entrypoint.GENERATIONS[0].first:
            yield version


def test_every_pinned_image_version_is_covered():
    newest = _version(ARCHIVED[-1])
    beyond = set()
    specs = os.path.join(FIXTURES, "specs")
    for name in sorted(os.listdir(specs)):
        if name.endswith(".json.gz"):
            beyond |= {version for version in _pinned_vllm_versions(os.path.join(specs, name)) if version > newest}
    assert sorted(".".join(map(str, version)) for version in beyond) == TABLE["unverified_pins"]["versions"]
