"""Issue 29 cases 3 and 4: a model package's env, against the real tt_model_entries filter and container_command module.

A package (``tt_model_packages``) comes from outside the catalog: whoever publishes it writes its
``hardware.<device>.env`` and its profiles' ``env``. Before the fix that env was merged over the collection's own
values: ``NO_AUTH=1`` reached a media container while ``no_auth`` was false (the server ran with no key and ``ready``
passed), ``TT_CACHE_PATH`` and ``MODEL_WEIGHTS_DIR`` pointed the server away from the managed cache and the verified
weights, and ``HF_TOKEN`` landed on the media argv (visible in /proc, and in the 0644 ``<instance>.conf``) or in the
0644 runtime spec of a vLLM container. Now one env gate refuses reserved names and secrets from every source (package
hardware, profile, entry, runtime spec), naming the package or entry, the key and the reason, and the collection's own
values are applied last.

The filter runs in a child with the checkout's collection on PYTHONPATH (TTFLEET_ATTACK_CHECKOUT selects the code), as
the serve role's ``__serve_plan`` runs it; the module runs as Ansible runs it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import CHECKOUT, COLLECTIONS, PYTHON, TIMEOUT

SPEC_FILE = CHECKOUT / "tests" / "fixtures" / "specs" / "release_model_spec-v0.20.0.json.gz"
SECRET = "not-a-real-token-SECRET"
FILTER = """
import json, sys
from ansible.errors import AnsibleFilterError
from ansible_collections.ttfleet.inference.plugins.filter.tt_models import tt_model_entries
models, device, packages = json.load(sys.stdin)
try:
    print(json.dumps({"entries": tt_model_entries(models, device, packages, {})}))
except AnsibleFilterError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _package(engine, env=None, profile_env=None, vllm_args=None, profile_vllm=None):
    hardware = {"max_context": 8192, "max_concurrency": 4}
    if env is not None:
        hardware["env"] = env
    if vllm_args is not None:
        hardware["vllm_args"] = vllm_args
    if profile_env is not None or profile_vllm is not None:
        hardware["default_profile"] = "fast"
        profile = {"env": profile_env} if profile_env is not None else {"vllm_override_args": profile_vllm}
        hardware["profiles"] = {"fast": profile}
    return {
        "model": "acme/Acme-8B",
        "revision": "0" * 40,
        "image": "ghcr.io/acme/acme-8b:1.0.0",
        "version": "1.0.0",
        "engine": engine,
        "hardware": {"n150": hardware},
    }


def _plan(package):
    """The checkout's tt_model_entries on one entry of ``package``: ``{"entries": [...]}`` or ``{"error": msg}``."""
    proc = subprocess.run(
        [PYTHON, "-c", FILTER],
        input=json.dumps(
            [[{"name": "acme/Acme-8B", "package": "acme", "instance": "acme"}], "n150", {"acme": package}]
        ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={"PYTHONPATH": str(COLLECTIONS), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _run_command(arena, entry):
    """container_command for the planned entry, with the serve role's arguments (no_auth false, a host volume)."""
    args = {
        "model": entry["name"],
        "device": "n150",
        "spec_file": str(SPEC_FILE),
        "volume_root": str(arena.root),
        "no_auth": False,
        "env_file": "/etc/ttfleet/serve/acme.env",
        "name": "tt-serve-acme",
        "runtime_spec_file": "/etc/ttfleet/serve/acme.model_spec.json",
    }
    args.update({key: entry[key] for key in ("spec", "env", "profile") if entry.get(key)})
    return arena.module("container_command", args)


def _command(arena, entry):
    result = _run_command(arena, entry)
    assert not result.failed, result
    return result


def _reached(result):
    """What the container gets: its -e values and the runtime spec's env (both levels), as one text."""
    spec = (result.get("runtime_model_spec") or {}).get("runtime_model_spec") or {}
    env = {**(spec.get("device_model_spec") or {}).get("env_vars", {}), **(spec.get("env_vars") or {})}
    argv_env = [arg for arg in result["argv"] if "=" in arg and not arg.startswith("type=")]
    return f"argv -e: {argv_env}; runtime spec env: {env}"


def _assert_refused(arena, package, source, key, reason):
    plan = _plan(package)
    if "entries" in plan:
        (entry,) = plan["entries"]
        pytest.fail(f"the package's {source} {key} was accepted; the container gets {_reached(_command(arena, entry))}")
    msg = plan["error"]
    assert "tt_model_packages.acme" in msg and f"{source} key {key}" in msg and reason in msg, msg
    assert SECRET not in msg, msg


@pytest.mark.broke29(3)
@pytest.mark.parametrize(
    "engine, key, value",
    [
        ("media", "NO_AUTH", "1"),
        ("media", "TT_CACHE_PATH", "/tmp/elsewhere"),
        ("media", "MODEL_WEIGHTS_DIR", "/tmp/other-weights"),
        ("vLLM", "TT_CACHE_PATH", "/tmp/elsewhere"),
    ],
    ids=["media-no-auth", "media-cache", "media-weights", "vllm-cache"],
)
def test_case3_package_env_cannot_override_auth_caches_or_weights(arena, engine, key, value):
    _assert_refused(arena, _package(engine, env={key: value}), "hardware.n150.env", key, "is reserved")


@pytest.mark.broke29(3)
def test_case3_profile_env_cannot_switch_auth_off(arena):
    plan = _plan(_package("media", profile_env={"NO_AUTH": "1"}))
    assert "error" in plan, f"accepted; the container gets {_reached(_command(arena, plan['entries'][0]))}"
    assert "profile fast" in plan["error"] and "env key NO_AUTH is reserved" in plan["error"], plan["error"]


@pytest.mark.broke29(4)
@pytest.mark.parametrize("engine", ["media", "vLLM"])
def test_case4_package_secret_reaches_neither_argv_nor_spec(arena, engine):
    _assert_refused(arena, _package(engine, env={"HF_TOKEN": SECRET}), "hardware.n150.env", "HF_TOKEN", "secret")


@pytest.mark.broke29(3)
def test_case3_package_vllm_args_cannot_set_the_servers_api_key(arena):
    # Not env, but the same hole: vLLM's --api-key from a package would give the server a key its publisher chose,
    # written to the 0644 runtime spec.
    _assert_refused(
        arena, _package("vLLM", vllm_args={"api_key": SECRET}), "hardware.n150.vllm_args", "api_key", "secret"
    )


@pytest.mark.broke29(3)
def test_case3_profile_vllm_override_args_cannot_set_the_servers_api_key(arena):
    plan = _plan(_package("vLLM", profile_vllm={"api_key": SECRET}))
    assert "error" in plan, f"accepted; the container gets argv {_command(arena, plan['entries'][0])['argv']}"
    assert "vllm_override_args key api_key" in plan["error"] and SECRET not in plan["error"], plan["error"]


def test_case3_control_a_plain_package_env_reaches_the_container_under_the_collections_values(arena):
    plan = _plan(_package("media", env={"MAX_BATCH_SIZE": "2"}))
    assert "entries" in plan, plan
    result = _command(arena, plan["entries"][0])
    argv = result["argv"]
    assert "MAX_BATCH_SIZE=2" in argv and not any(arg.startswith("NO_AUTH=") for arg in argv), argv
    assert any(arg.startswith(f"TT_CACHE_PATH={'/home/container_app_user/cache_root'}") for arg in argv), argv


@pytest.mark.broke29(3)
def test_case3_an_entrys_own_spec_cannot_switch_auth_off_either(arena):
    # The same env through an entry's runtime spec (tt_models[].spec), straight to the module.
    plan = _plan(_package("media"))
    entry = plan["entries"][0]
    entry["spec"]["device_model_spec"]["env_vars"]["NO_AUTH"] = "1"
    result = _run_command(arena, entry)
    assert result.failed, f"accepted; the container gets {_reached(result)}"
    assert "device_model_spec.env_vars key NO_AUTH is reserved" in result["msg"], result["msg"]
