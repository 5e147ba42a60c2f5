# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The docker run command of _container.py against commands printed by run.py, and the module."""

from __future__ import annotations

import collections
import json
import os

import pytest
from conftest import patch_module_args
from unit_helpers import with_hardening

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.modules import container_command as container_module

FIXTURES = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4)), "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
V16 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.16.0.json.gz")
RUNPY = os.path.join(FIXTURES, "runpy", "runpy-v0.20.0-docker-examples.json")
VOLUME_ROOT = "/srv/tt-cache"

with open(RUNPY, encoding="utf-8") as _handle:
    RECORDED = json.load(_handle)["cases"]

# Flags whose value is ours, not run.py's.
OWN_VALUES = ("--name", "--env-file")
# docker run flags that take a value; anything else starting with '-' stands alone.
VALUED = {
    "--name",
    "--env-file",
    "--ipc",
    "--device",
    "--mount",
    "--volume",
    "--publish",
    "-e",
    "--user",
    "--security-opt",
}


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(V20)


def parse_argv(argv):
    """(multiset of docker options, image, multiset of container arguments) of a docker run argv."""
    assert argv[:2] == ["docker", "run"]
    options = collections.Counter()
    index = 2
    while argv[index].startswith("-"):
        flag = argv[index]
        if flag in VALUED:
            value = "<ours>" if flag in OWN_VALUES else argv[index + 1]
            options[(flag, value)] += 1
            index += 2
        else:
            options[(flag, None)] += 1
            index += 1
    image = argv[index]
    rest = argv[index + 1 :]
    args = collections.Counter()
    index = 0
    while index < len(rest):
        if index + 1 < len(rest) and not rest[index + 1].startswith("-"):
            args[(rest[index], rest[index + 1])] += 1
            index += 2
        else:
            args[(rest[index], None)] += 1
            index += 1
    return options, image, args


def options_of(argv):
    return parse_argv(argv)[0]


def args_of(argv):
    return parse_argv(argv)[2]


def options_from_flags(flags):
    """container_command keyword arguments for run.py flags."""
    kwargs = {}
    pending = list(flags)
    while pending:
        flag = pending.pop(0)
        if flag == "--no-auth":
            kwargs["no_auth"] = True
            continue
        value = pending.pop(0)
        if flag == "--device-id":
            kwargs["device_ids"] = [int(part) for part in value.split(",")]
        elif flag == "--service-port":
            kwargs["port"] = int(value)
        elif flag == "--bind-host":
            kwargs["bind_host"] = value
        elif flag == "--image-user":
            kwargs["image_user"] = value
        else:
            raise AssertionError(f"unhandled run.py flag {flag}")
    return kwargs


def recorded_argv(case):
    """run.py's argv with our one addition to it, no-new-privileges, after --ipc host."""
    return with_hardening(
        arg.replace("<VOLUME_ROOT>", VOLUME_ROOT).replace("<CHECKOUT>", "/opt/tts") for arg in case["argv"]
    )


def test_every_container_gets_no_new_privileges(v20):
    for case in RECORDED:
        argv = command(v20, case["model"], case["tt_device"], volume_root=VOLUME_ROOT)["argv"]
        image_at = argv.index(parse_argv(argv)[1])
        assert options_of(argv)[("--security-opt", "no-new-privileges")] == 1
        assert argv.index("--security-opt") < image_at


def command(catalog, model, device, **kwargs):
    spec = ttis_select.select_spec(catalog, model, device)
    return container_utils.container_command(spec, catalog, **kwargs)


# --- run.py v0.20.0, recorded --------------------------------------------------------------------


def test_recorded_cases_cover_every_option():
    flags = {flag for case in RECORDED for flag in case["run_py_flags"] if flag.startswith("--")}
    assert flags == {"--device-id", "--service-port", "--bind-host", "--no-auth", "--image-user"}
    assert len(RECORDED) == 12


@pytest.mark.parametrize(
    "case", RECORDED, ids=[f"{c['model']}-{c['tt_device']}-{'_'.join(c['run_py_flags']) or 'plain'}" for c in RECORDED]
)
def test_argv_matches_runpy(v20, case):
    result = command(
        v20, case["model"], case["tt_device"], volume_root=VOLUME_ROOT, **options_from_flags(case["run_py_flags"])
    )
    assert parse_argv(result["argv"]) == parse_argv(recorded_argv(case))
    assert result["argv"][:3] == ["docker", "run", "--rm"]
    assert result["image"] == parse_argv(recorded_argv(case))[1]


def test_comparison_notices_a_changed_value(v20):
    case = RECORDED[1]
    result = command(v20, case["model"], case["tt_device"], volume_root=VOLUME_ROOT)
    assert parse_argv(result["argv"]) != parse_argv(recorded_argv(case))


def test_vllm_argv_keeps_runpy_order(v20):
    # Same order as run.py prints, apart from our name and env file.
    case = RECORDED[3]
    result = command(v20, case["model"], case["tt_device"], volume_root=VOLUME_ROOT, image_user="1001")
    ours = list(result["argv"])
    theirs = recorded_argv(case)
    for flag in OWN_VALUES:
        ours[ours.index(flag) + 1] = theirs[theirs.index(flag) + 1]
    assert ours == theirs


# --- other forms -------------------------------------------------------------------------------


def test_named_volume_form_has_no_tt_cache_path(v20):
    result = command(v20, "Qwen3-32B", "p300x2")
    options, args = options_of(result["argv"]), args_of(result["argv"])
    assert options[("--volume", "volume_id_tt_transformers-Qwen3-32B:/home/container_app_user/cache_root")] == 1
    assert not [key for key in options if key[0] == "--mount" and "cache_root" in key[1]]
    assert not [key for key in options if key[0] == "-e"]
    assert args == collections.Counter({("--model", "Qwen/Qwen3-32B"): 1, ("--tt-device", "p300x2"): 1})
    assert result["volume"] == "volume_id_tt_transformers-Qwen3-32B"


def test_host_weights_dir_form(v20):
    result = command(v20, "Qwen3-32B", "p300x2", volume_root=VOLUME_ROOT, host_weights_dir="/data/weights/Qwen3-32B/")
    options = options_of(result["argv"])
    mount = "/home/container_app_user/readonly_weights_mount/Qwen3-32B"
    assert options[("--mount", f"type=bind,src=/data/weights/Qwen3-32B,dst={mount},readonly")] == 1
    assert options[("-e", f"MODEL_WEIGHTS_DIR={mount}")] == 1
    assert (
        options[("-e", "TT_CACHE_PATH=/home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/P300x2")] == 1
    )


def test_host_weights_dir_with_named_volume(v20):
    result = command(v20, "Qwen3-32B", "p300x2", host_weights_dir="/data/w")
    options = options_of(result["argv"])
    assert ("--volume", "volume_id_tt_transformers-Qwen3-32B:/home/container_app_user/cache_root") in options
    assert ("-e", "MODEL_WEIGHTS_DIR=/home/container_app_user/readonly_weights_mount/w") in options
    assert not [key for key in options if key[0] == "-e" and key[1].startswith("TT_CACHE_PATH=")]


def test_media_no_auth_is_an_env_var(v20):
    result = command(v20, "whisper-large-v3", "n300", volume_root=VOLUME_ROOT, no_auth=True, port=9000)
    options, args = options_of(result["argv"]), args_of(result["argv"])
    assert ("-e", "NO_AUTH=1") in options
    assert ("--publish", "0.0.0.0:9000:8000") in options
    assert not args


def test_cpp_sdxl_on_a_device_without_cpp_settings_uses_python_server(v20):
    spec = ttis_select.select_spec(v20, "stable-diffusion-xl-base-1.0", "t3k")
    spec = {**spec, "device_type": "N150X4"}
    options = options_of(container_utils.container_command(spec, v20)["argv"])
    assert ("-e", "MODEL=stable-diffusion-xl-base-1.0") in options
    assert not [key for key in options if key[1] == "SERVER_MODE=cpp"]


def test_older_release_rules(v20):
    # v0.16.0's run.py did not set HF_HOME yet; v0.13.0's published media on P:P with vLLM arguments.
    v16 = ttis_catalog.load_spec_file(V16)
    options = options_of(command(v16, "whisper-large-v3", "n300")["argv"])
    assert ("-e", "CACHE_ROOT=/home/container_app_user/cache_root") in options
    assert not [key for key in options if key[0] == "-e" and key[1].startswith("HF_HOME=")]
    old = {**v20, "release_version": "0.13.0"}
    argv = command(old, "whisper-large-v3", "n300", port=7001)["argv"]
    options, args = options_of(argv), args_of(argv)
    assert ("--publish", "0.0.0.0:7001:7001") in options
    assert ("--service-port", "7001") in args
    assert not [key for key in options if key[0] == "-e" and key[1].startswith("MESH_DEVICE=")]


def test_defaults(v20):
    result = command(v20, "Llama-3.2-1B-Instruct", "n150")
    assert result["container_name"] == "tt-llama-3.2-1b-instruct-n150"
    assert result["env_file"] == "/etc/ttfleet/serve/tt-llama-3.2-1b-instruct-n150.env"
    assert result["legacy_interface"] is False
    assert result["inference_engine"] == "vLLM"
    assert "--user" not in result["argv"]
    assert command(v20, "Llama-3.2-1B-Instruct", "n150", port=8001)["container_name"].endswith("-n150-8001")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd", "etc-passwd"),
        ("qwen; rm -rf /", "qwen-rm-rf"),
        ("-x\n$(id)", "x-id"),
        ("My_Server.1", "My_Server.1"),
    ],
)
def test_hostile_names_are_sanitised(v20, name, expected):
    result = command(v20, "Llama-3.2-1B-Instruct", "n150", name=name)
    assert result["container_name"] == expected
    assert result["env_file"] == f"/etc/ttfleet/serve/{expected}.env"


def test_name_without_usable_characters(v20):
    with pytest.raises(SpecError, match="no usable characters"):
        command(v20, "Llama-3.2-1B-Instruct", "n150", name="../;")


def test_hostile_model_name_in_spec_is_sanitised(v20):
    spec = {**ttis_select.select_spec(v20, "Llama-3.2-1B-Instruct", "n150"), "model_name": "evil;$(x) name"}
    result = container_utils.container_command(spec, v20)
    assert result["container_name"] == "tt-evil-x-name-n150"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"device_ids": [-1]}, "device_ids"),
        ({"bind_host": "0.0.0.0 -v /:/x"}, "bind_host"),
        ({"image_user": "--privileged"}, "image_user"),
        ({"image": "--privileged"}, "image"),
        ({"volume_root": "relative/dir"}, "volume_root"),
        ({"volume_root": "/a,b"}, "','"),
        ({"host_weights_dir": "/"}, "host_weights_dir"),
        ({"env_file": "x.env"}, "env_file"),
    ],
)
def test_bad_inputs_are_refused(v20, kwargs, match):
    with pytest.raises(SpecError, match=match):
        command(v20, "Llama-3.2-1B-Instruct", "n150", **kwargs)


# --- legacy interface ---------------------------------------------------------------------------


def test_legacy_spec_is_refused_with_the_way_out(v20):
    with pytest.raises(SpecError) as exc:
        command(v20, "Llama-3.1-8B-Instruct", "n150", volume_root=VOLUME_ROOT)
    message = str(exc.value)
    spec = ttis_select.select_spec(v20, "Llama-3.1-8B-Instruct", "n150")
    assert "Llama-3.1-8B-Instruct" in message
    assert f"v{spec['version']}" in message
    assert "set image" in message.lower()
    assert spec["tt_metal_commit"] in message


def test_legacy_spec_with_image_override_uses_current_interface(v20):
    image = (
        "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.19.0-b204341-9bd099c"
    )
    result = command(v20, "Llama-3.1-8B-Instruct", "n150", volume_root=VOLUME_ROOT, image=image)
    options, used, args = parse_argv(result["argv"])
    assert used == image == result["image"]
    assert result["legacy_interface"] is True
    assert result["version"] == "0.19.0"
    # run.py re-parses the version from the override tag, so the host volume follows it.
    volume = f"{VOLUME_ROOT}/volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.19.0"
    mount = f"type=bind,src={volume},dst=/home/container_app_user/cache_root"
    assert ("--mount", mount) in options
    assert ("--model", "meta-llama/Llama-3.1-8B-Instruct") in args


@pytest.mark.parametrize("tag", ["latest", "0.9.0-abc"])
def test_legacy_spec_with_old_or_unversioned_override_is_still_refused(v20, tag):
    with pytest.raises(SpecError, match=r"older than v0\.11\.0"):
        command(v20, "Llama-3.1-8B-Instruct", "n150", image=f"example.org/vllm:{tag}")


def test_legacy_release_catalog_is_refused(v20):
    with pytest.raises(SpecError, match=r"before v0\.11|older interface"):
        command({**v20, "legacy_layout": True, "release_version": "0.10.1"}, "Qwen3-32B", "p300x2")


def test_multihost_device_is_refused(v20):
    with pytest.raises(SpecError, match="multi-host"):
        command(v20, "DeepSeek-R1-0528", "dual_galaxy")


# --- module -------------------------------------------------------------------------------------


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        container_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_returns_runpy_command(capsys):
    case = RECORDED[1]
    code, result = run_module(
        capsys,
        {
            "model": case["model"],
            "device": case["tt_device"],
            "spec_file": V20,
            "volume_root": VOLUME_ROOT,
            "device_ids": [0, 1],
            "port": 8001,
            "bind_host": "127.0.0.1",
            "_ansible_check_mode": True,
        },
    )
    assert code == 0
    assert result["changed"] is False
    assert parse_argv(result["argv"]) == parse_argv(recorded_argv(case))
    assert result["container_name"] == "tt-llama-3.1-8b-instruct-p300x2-8001"
    assert result["env_file"] == "/etc/ttfleet/serve/tt-llama-3.1-8b-instruct-p300x2-8001.env"
    assert result["legacy_interface"] is False
    assert result["inference_engine"] == "vLLM"
    assert result["release_version"] == "0.20.0"


def test_module_warns_about_sanitised_name(capsys, monkeypatch):
    # Record warnings at the source: with controller code imported, ansible-core 2.19 sends them to
    # the display instead of the result.
    warned = []
    monkeypatch.setattr(container_module.AnsibleModule, "warn", lambda self, message: warned.append(message))
    code, result = run_module(capsys, {"model": "Qwen3-4B", "device": "n150", "spec_file": V20, "name": "my server"})
    assert code == 0
    assert result["container_name"] == "my-server"
    assert warned == ["name 'my server' is not a valid container name; using 'my-server'."]


def test_module_refuses_legacy_spec(capsys):
    code, result = run_module(capsys, {"model": "Llama-3.1-8B-Instruct", "device": "n150", "spec_file": V20})
    assert code == 1
    assert "Llama-3.1-8B-Instruct" in result["msg"]


def test_module_needs_model_and_device(capsys):
    code, result = run_module(capsys, {"device": "n150", "spec_file": V20})
    assert code == 1
    assert "model" in result["msg"]
