# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Per-instance tuning and specs from outside the catalog, with run.py's rules.

Private to the collection. Pure functions, standard library only.

- ``apply_overrides``: ``run.py --vllm-override-args`` and ``--override-tt-config`` as
  ``ModelSpec.apply_overrides`` (TTIS ``workflows/model_spec.py``) merges them into a spec: a null value
  removes a key, the TT config becomes ``vllm_args.additional_config`` (``{"tt": ...}``), and
  ``max_num_seqs`` / ``max_model_len`` are mirrored into ``MAX_NUM_SEQS`` / ``MAX_MODEL_LENGTH`` for the
  media and forge images, which read environment variables.
- ``override_cli_args``: the container arguments ``_vllm_override_cli_args``
  (``workflows/run_docker_server.py``) renders from the same JSON for vLLM images.
- ``runtime_spec``: ``run.py --runtime-model-spec-json FILE`` (``ModelSpec.from_json``), a spec taken as is,
  with the defaults ``ModelSpec.__post_init__`` and ``DeviceModelSpec.__post_init__`` fill in.

Where the collection is stricter than run.py: run.py logs a warning and drops a malformed JSON, a reserved
wrapper flag or a non-object value; here each is an error naming the model, the key and the value.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import device_row

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]


class TuningError(FleetError, ValueError):
    """A tuning setting or runtime spec that cannot be served, with the fix."""


# run_docker_server._RESERVED_WRAPPER_FLAGS (v0.17.0 and later): flags that run_vllm_api_server takes as its own
# (parse_known_args) or that the orchestrator sets (port, host). As keys of vllm_override_args they are refused.
RESERVED_WRAPPER_FLAGS = frozenset(
    {
        "model",
        "tt-device",
        "device",
        "engine",
        "impl",
        "no-auth",
        "disable-trace-capture",
        "service-port",
        "port",
        "host",
    }
)
# ModelSpec.apply_overrides: vllm_args mirrored into env_vars for the forge and media images.
VLLM_ARG_TO_ENV = {"max_num_seqs": "MAX_NUM_SEQS", "max_model_len": "MAX_MODEL_LENGTH"}

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_DEPTH = 8
_MAX_JSON = 64 << 10

# The env gate (gate_env): every environment that comes from outside the catalog (a package's hardware env, a profile's
# or an entry's env, a runtime spec's env_vars) passes it. Two rules: the secret-name rule (env lands in 0644 files,
# the runtime spec and the media argv, visible in /proc), and the reserved names below, which the collection sets
# itself from its own settings (generate_docker_run_command, get_media_server_docker_env_vars and the vLLM entrypoint
# run_vllm_api_server.py of TTIS). The collection's values are also applied last (container.py), so a reserved name
# that reached a spec some other way still loses.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|API_KEY|ACCESS_KEY|PRIVATE|CREDENTIAL|AUTHORIZATION)", re.IGNORECASE)
# The same rule for the server's arguments, where TOKEN counts only as the last word (max_num_batched_tokens and
# tokenizer are tuning, hf_token is a secret).
_SECRET_ARG = re.compile(
    r"(SECRET|PASSW|API_KEY|ACCESS_KEY|PRIVATE|CREDENTIAL|AUTHORIZATION|(^|_)TOKEN$)", re.IGNORECASE
)
_AUTH = "sets or switches off the server's authentication; the serve role sets it (serve_no_auth, serve_api_keys)"
_CREDENTIAL = (
    "is a credential; give the Hugging Face token with serve_hf_token and API keys with serve_api_keys, which stay in "
    "the instance's 0600 env file"
)
_CACHE = "points the server at another cache; the collection sets it to the managed volume (tt_volume_root)"
_WEIGHTS = "points the server at other weights; the collection mounts the verified weights itself"
_SPEC = "points the server at another model spec; the collection passes the resolved spec itself (runtime_spec_file)"
_MODEL = "names another model or device; the collection sets it from the entry's name and device"
RESERVED_ENV = {
    "NO_AUTH": _AUTH,
    "API_KEY": _AUTH,
    "VLLM_API_KEY": _AUTH,
    "OPENAI_API_KEY": _AUTH,
    "JWT_SECRET": _AUTH,
    "AUTHORIZATION": _AUTH,
    "HF_TOKEN": _CREDENTIAL,
    "HUGGING_FACE_HUB_TOKEN": _CREDENTIAL,
    "TT_CACHE_PATH": _CACHE,
    "CACHE_ROOT": _CACHE,
    "HF_HOME": _CACHE,
    "TT_TRIAGE_LOGS_PATH": _CACHE,
    "MODEL_WEIGHTS_DIR": _WEIGHTS,
    "MODEL_WEIGHTS_PATH": _WEIGHTS,
    "RUNTIME_MODEL_SPEC_JSON_PATH": _SPEC,
    "TT_MODEL_SPEC_JSON_PATH": _SPEC,
    "MODEL": _MODEL,
    "DEVICE": _MODEL,
    "HF_MODEL_REPO_ID": _MODEL,
}

# The fields of ModelSpec and DeviceModelSpec (TTIS v0.20.0): from_json passes a spec's keys to the dataclass, so
# any other key is a TypeError there and an error here. The required ones have no default.
MODEL_SPEC_REQUIRED = (
    "model_id",
    "impl",
    "hf_model_repo",
    "model_name",
    "inference_engine",
    "device_type",
    "device_model_spec",
)
MODEL_SPEC_FIELDS = frozenset(
    (
        *MODEL_SPEC_REQUIRED,
        "system_requirements",
        "env_vars",
        "tt_metal_commit",
        "vllm_commit",
        "hf_weights_repo",
        "param_count",
        "min_disk_gb",
        "min_ram_gb",
        "model_type",
        "repacked",
        "version",
        "docker_image",
        "status",
        "code_link",
        "override_tt_config",
        "supported_modalities",
        "subdevice_type",
        "uses_tensor_model_cache",
        "has_builtin_warmup",
        "metadata",
        "cli_args",
    )
)
DEVICE_SPEC_REQUIRED = ("device", "max_concurrency", "max_context")
DEVICE_SPEC_FIELDS = frozenset(
    (
        *DEVICE_SPEC_REQUIRED,
        "max_tokens_all_users_override",
        "max_tokens_all_users",
        "perf_targets_map",
        "default_impl",
        "perf_reference",
        "vllm_args",
        "override_tt_config",
        "env_vars",
        "tensor_cache_timeout",
        "system_requirements",
        "known_issues",
        "eval_max_retries",
        "image_benchmark_num_batches",
    )
)
IMPL_REQUIRED = ("impl_id", "impl_name")
# InferenceEngine values of TTIS (select.canonical_engine takes them from here).
ENGINES = ("vLLM", "media", "forge")
# ModelSpec.__post_init__: the environment of vLLM images (not forge or media).
VLLM_DEFAULT_ENV = {
    "VLLM_CONFIGURE_LOGGING": "1",
    "VLLM_RPC_TIMEOUT": "900000",
    "VLLM_TARGET_DEVICE": "tt",
    "TORCHDYNAMO_DISABLE": "1",
}


def _show(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


def _check_value(where: str, key: str, value: object, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise TuningError(f"{where}: {key} nests deeper than {_MAX_DEPTH} levels; flatten it.")
    if isinstance(value, str):
        if _CONTROL.search(value):
            raise TuningError(f"{where}: {key} = {_show(value)} holds a control character; remove it.")
    elif isinstance(value, dict):
        for inner, item in value.items():
            if not isinstance(inner, str):
                raise TuningError(f"{where}: {key} has the key {_show(inner)}, which is not a string.")
            _check_value(where, f"{key}.{inner}", item, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_value(where, f"{key}[{index}]", item, depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise TuningError(
            f"{where}: {key} = {value!r} is a {type(value).__name__}; give a string, number, boolean, null, list or "
            "mapping (JSON)."
        )


def _mapping(where: str, option: str, value: object) -> JSON:
    """``value`` as a dict: a mapping, or a JSON object string as run.py takes it on its command line."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        if len(value) > _MAX_JSON:
            raise TuningError(f"{where}: {option} is longer than {_MAX_JSON} bytes.")
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise TuningError(
                f"{where}: {option} {_show(value)} is not JSON ({exc}); give a mapping, for example "
                '{"max_num_seqs": 8, "max_model_len": 65536}.'
            ) from exc
    if not isinstance(value, dict):
        raise TuningError(
            f"{where}: {option} must be a mapping (a JSON object), got {_show(value)}; for example "
            '{"max_num_seqs": 8}.'
        )
    out: JSON = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise TuningError(
                f"{where}: {option} has the key {_show(key)}; keys are option names such as max_num_seqs "
                "(letters, digits, '_' and '-', starting with a letter)."
            )
        _check_value(where, f"{option}.{key}", item)
        out[key] = item
    return out


def check_tuning(where: str, settings: Mapping[str, Any]) -> JSON:
    """The tuning settings of a ``tt_models`` entry, checked: ``vllm_override_args``, ``override_tt_config``, ``env``.

    ``where`` names the entry in messages (``tt_models entry Qwen3-32B``).
    """
    vllm = _mapping(where, "vllm_override_args", settings.get("vllm_override_args"))
    for key, value in vllm.items():
        flag = key.replace("_", "-")
        if flag in RESERVED_WRAPPER_FLAGS:
            raise TuningError(
                f"{where}: vllm_override_args key {key!r} = {_show(value)} is reserved: tt-inference-server's "
                f"container wrapper takes --{flag} itself ({', '.join(sorted(RESERVED_WRAPPER_FLAGS))}); run.py "
                "only warns and drops it. Remove the key; set the port with the entry's port, the model and device "
                "with name and device."
            )
    gate_vllm_args(where, "vllm_override_args", vllm)
    tt_config = _mapping(where, "override_tt_config", settings.get("override_tt_config"))
    env = gate_env(where, "env", settings.get("env"))
    return {"vllm_override_args": vllm, "override_tt_config": tt_config, "env": env}


def gate_env(where: str, field: str, env: object) -> dict[str, str]:
    """``env`` from outside the catalog (a mapping or its JSON text), checked by the env gate; values as strings.

    ``where`` names the package, profile, entry or spec and ``field`` the key that holds ``env`` (``hardware.n150.env``,
    ``env_vars``). Refuses a name that is not a variable name, a name that looks like a secret, a reserved name
    (RESERVED_ENV, with the reason), and a value that is not a single-line string, number or boolean.
    """
    out: dict[str, str] = {}
    for key, value in _mapping(where, field, env).items():
        if not _ENV_NAME.match(key):
            raise TuningError(
                f"{where}: {field} key {_show(key)} is not an environment variable name (A-Z, 0-9, '_'); rename it."
            )
        if _SECRET_NAME.search(key):
            raise TuningError(
                f"{where}: {field} key {key} looks like a secret; {field} is not for secrets (it is written to 0644 "
                "files and the runtime spec, and may reach the command line, visible in /proc). Give API keys with "
                "serve_api_keys and the Hugging Face token with serve_hf_token, which stay in the instance's 0600 env "
                f"file, and remove {key} from {field}."
            )
        reason = RESERVED_ENV.get(key.upper())
        if reason:
            raise TuningError(f"{where}: {field} key {key} is reserved: it {reason}. Remove {key} from {field}.")
        if isinstance(value, (dict, list)) or value is None:
            raise TuningError(f"{where}: {field} {key} = {_show(value)} must be a string or number.")
        # _mapping refused control characters in the values already.
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def gate_vllm_args(where: str, field: str, args: Mapping[str, Any]) -> None:
    """Refuses a vLLM argument in ``args`` whose name looks like a secret (``api_key``, ``hf_token``): the env gate's
    secret-name rule for the server's arguments, which reach the 0644 runtime spec and the command line. An
    ``api_key`` would also give the server a key the package or profile chose instead of serve_api_keys. The value is
    never shown."""
    for key in args:
        if _SECRET_ARG.search(str(key).replace("-", "_")):
            raise TuningError(
                f"{where}: {field} key {key} looks like a secret or sets the server's authentication; the "
                "server's arguments are written to the 0644 runtime spec and reach the command line (visible in "
                "/proc), and the serve role gives the server its API keys itself (serve_api_keys, serve_no_auth). "
                f"Remove {key} from {field}."
            )


def drop_reserved(env: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env`` without the reserved names (RESERVED_ENV): the collection sets those itself, after this."""
    return {key: value for key, value in (env or {}).items() if str(key).upper() not in RESERVED_ENV}


def merge_removing(base: Mapping[str, Any] | None, changes: Mapping[str, Any]) -> JSON:
    """``base`` updated with ``changes``, where a None value removes the key (run.py's override merge)."""
    merged = dict(base or {})
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def apply_overrides(spec: Mapping[str, Any], tuning: Mapping[str, Any]) -> JSON:
    """The spec after ``ModelSpec.apply_overrides`` with ``tuning`` (from check_tuning), as a new dict.

    Order and rules are run.py's: the TT config first (merged into ``device_model_spec.override_tt_config``, a null
    removes a key, then ``vllm_args.additional_config`` is ``json.dumps({"tt": merged})``), then the vLLM arguments
    (merged into ``device_model_spec.vllm_args``, a null removes a key; ``max_num_seqs`` and ``max_model_len``
    mirrored into the spec's ``env_vars``). ``env`` (not a run.py setting) is merged into ``env_vars`` last.
    """
    out = dict(spec)
    dms = dict(out.get("device_model_spec") or {})
    tt_config = tuning.get("override_tt_config") or {}
    if tt_config:
        merged_tt = merge_removing(dms.get("override_tt_config"), tt_config)
        dms["override_tt_config"] = merged_tt
        dms["vllm_args"] = {**(dms.get("vllm_args") or {}), "additional_config": json.dumps({"tt": merged_tt})}
    vllm = tuning.get("vllm_override_args") or {}
    env = dict(out.get("env_vars") or {})
    if vllm:
        dms["vllm_args"] = merge_removing(dms.get("vllm_args"), vllm)
        env.update({env_key: str(vllm[key]) for key, env_key in VLLM_ARG_TO_ENV.items() if vllm.get(key) is not None})
    env.update(tuning.get("env") or {})
    out["device_model_spec"] = dms
    out["env_vars"] = env
    return out


def override_cli_args(vllm_override_args: Mapping[str, Any] | None) -> list[str]:
    """The container arguments of ``_vllm_override_cli_args``: ``--key-name value`` per key, in order.

    True gives the bare flag, false and null give nothing (vLLM's default applies), a list or mapping its JSON.
    Reserved keys never get here (check_tuning refuses them).
    """
    argv: list[str] = []
    for key, value in (vllm_override_args or {}).items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def needs_runtime_spec(tuning: Mapping[str, Any]) -> bool:
    """Whether the container must read the resolved spec (RUNTIME_MODEL_SPEC_JSON_PATH) for ``tuning`` to apply.

    In docker-server mode run.py's merged spec stays in run.py's own process: the container resolves its own spec
    from the image's catalog and takes only the command-line flags of ``override_cli_args``. That carries every
    vLLM argument but a removal (null) or a false, and carries neither the TT config nor extra environment.
    """
    vllm = tuning.get("vllm_override_args") or {}
    return bool(
        tuning.get("override_tt_config")
        or tuning.get("env")
        or any(value is None or value is False for value in vllm.values())
    )


# ---------------------------------------------------------------------------------------------
# Runtime model specs (run.py --runtime-model-spec-json)


def _param_count(repo: str) -> int | None:
    """ModelSpec.infer_param_count: the last ``<number>B`` of the repository name, as an integer."""
    matches = re.findall(r"(\d+(?:\.\d+)?)[Bb]", repo)
    if not matches:
        return None
    try:
        return int(float(matches[-1]))
    except ValueError:
        return None


def _need(where: str, mapping: Mapping[str, Any], keys: tuple[str, ...], label: str) -> None:
    missing = [key for key in keys if mapping.get(key) in (None, "")]
    if missing:
        raise TuningError(
            f"{where}: the {label} has no {', '.join(missing)}; a runtime model spec needs every field that "
            "tt-inference-server's ModelSpec requires (model_id, impl {impl_id, impl_name}, hf_model_repo, model_name, "
            "inference_engine, device_type, device_model_spec {device, max_concurrency, max_context}) and a "
            "docker_image."
        )


def _unknown(where: str, mapping: Mapping[str, Any], fields: frozenset[str], label: str) -> None:
    unknown = sorted(set(mapping) - fields)
    if unknown:
        raise TuningError(
            f"{where}: the {label} has unknown fields {', '.join(unknown)} (run.py's ModelSpec.from_json would fail "
            "on them with a TypeError); remove them or check their spelling."
        )


def _device_name(where: str, value: object, field: str) -> str:
    text = str(value or "")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_]*", text):
        raise TuningError(f"{where}: {field} {_show(value)} is not a device name (letters, digits, '_').")
    return text.upper()


def runtime_spec(data: object, where: str) -> JSON:
    """A spec in run.py's runtime model spec format, with the defaults its dataclasses fill in.

    ``data`` is a mapping or its JSON text, either the spec itself or run.py's combined
    ``{"runtime_model_spec": ..., "runtime_config": ...}`` file. Fields are ``ModelSpec``'s; unknown ones are refused
    as ``from_json`` refuses them. A device tt-inference-server does not know (for example P150X2) is accepted when
    the spec names its mesh in ``device_model_spec.env_vars.MESH_DEVICE`` (or ``env_vars.MESH_DEVICE``).
    Returns the spec, with its mesh under the private key ``_mesh`` for the catalog built around it.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise TuningError(f"{where}: spec is not JSON ({exc}); give run.py's runtime model spec format.") from exc
    if not isinstance(data, dict):
        raise TuningError(f"{where}: spec must be a mapping in run.py's runtime model spec format, got {_show(data)}.")
    if "runtime_model_spec" in data and isinstance(data.get("runtime_model_spec"), dict):
        data = data["runtime_model_spec"]
    spec = json.loads(json.dumps(data))  # a deep copy of plain JSON
    _unknown(where, spec, MODEL_SPEC_FIELDS, "spec")
    _need(where, spec, (*MODEL_SPEC_REQUIRED, "docker_image"), "spec")
    for key in ("impl", "device_model_spec"):
        if not isinstance(spec[key], dict):
            raise TuningError(f"{where}: spec field {key} must be a mapping, got {_show(spec[key])}.")
    _need(where, spec["impl"], IMPL_REQUIRED, "spec's impl")
    dms = spec["device_model_spec"]
    _unknown(where, dms, DEVICE_SPEC_FIELDS, "spec's device_model_spec")
    _need(where, dms, DEVICE_SPEC_REQUIRED, "spec's device_model_spec")
    engine = next((value for value in ENGINES if value.lower() == str(spec["inference_engine"]).lower()), None)
    if engine is None:
        raise TuningError(
            f"{where}: spec inference_engine {_show(spec['inference_engine'])} is not one of {', '.join(ENGINES)}."
        )
    spec["inference_engine"] = engine
    device = _device_name(where, spec["device_type"], "device_type")
    if _device_name(where, dms["device"], "device_model_spec.device") != device:
        raise TuningError(
            f"{where}: spec device_type {spec['device_type']} and device_model_spec.device {dms['device']} differ; "
            "a spec is for one device."
        )
    spec["device_type"] = dms["device"] = device
    for label, key in (("max_concurrency", "max_concurrency"), ("max_context", "max_context")):
        if isinstance(dms[key], bool) or not isinstance(dms[key], int) or dms[key] < 1:
            raise TuningError(f"{where}: spec device_model_spec.{label} {_show(dms[key])} must be a positive integer.")
    for key in ("env_vars", "vllm_args", "override_tt_config"):
        for mapping, label in ((spec, key), (dms, f"device_model_spec.{key}")):
            if mapping.get(key) is not None and not isinstance(mapping[key], dict):
                raise TuningError(f"{where}: spec {label} must be a mapping, got {_show(mapping[key])}.")
    # Checked by the env gate, kept as given (run.py's spec values are not rewritten).
    gate_env(f"{where}: spec", "env_vars", spec.get("env_vars"))
    gate_env(f"{where}: spec", "device_model_spec.env_vars", dms.get("env_vars"))
    gate_vllm_args(f"{where}: spec", "vllm_args", spec.get("vllm_args") or {})
    gate_vllm_args(f"{where}: spec", "device_model_spec.vllm_args", dms.get("vllm_args") or {})

    # DeviceModelSpec.__post_init__ (_infer_data, _infer_env_vars).
    mesh = (dms.get("env_vars") or {}).get("MESH_DEVICE") or (spec.get("env_vars") or {}).get("MESH_DEVICE")
    row = device_row(device)
    mesh = mesh or (row.mesh if row else None)
    if not mesh or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.,()-]*", str(mesh)):
        raise TuningError(
            f"{where}: tt-inference-server does not know device {device.lower()}, so the spec must name its mesh: set "
            'device_model_spec.env_vars.MESH_DEVICE (for two p150 cards, "P150x2"). The mesh names the kernel cache '
            "directory and is what tt-metal opens."
        )
    tt_config = dict(dms.get("override_tt_config") or {})
    max_concurrency = dms["max_concurrency"]
    data_parallel = (dms.get("vllm_args") or {}).get("data_parallel_size")
    if isinstance(data_parallel, int) and data_parallel > 0 and not isinstance(data_parallel, bool):
        max_concurrency = max_concurrency // data_parallel
    default_args = {
        "block_size": "64",
        "max_model_len": str(dms["max_context"]),
        "max_num_seqs": str(max_concurrency),
        "max_num_batched_tokens": str(dms["max_context"]),
        "max-log-len": "32",
        "seed": "9472",
        "additional_config": json.dumps({"tt": tt_config}),
    }
    inferred_env: dict[str, str] = {}
    if row and row.eth_dispatch:
        inferred_env["WH_ARCH_YAML"] = "wormhole_b0_80_arch_eth_dispatch.yaml"
    inferred_env["MESH_DEVICE"] = str(mesh)
    if row and row.arch_name:
        inferred_env["ARCH_NAME"] = row.arch_name
    dms["override_tt_config"] = tt_config
    dms["env_vars"] = {**inferred_env, **(dms.get("env_vars") or {})}
    # ModelSpec.__post_init__: env defaults, then vllm_args with the model first.
    defaults_env = {} if engine in ("media", "forge") else dict(VLLM_DEFAULT_ENV)
    spec["env_vars"] = {**defaults_env, **(spec.get("env_vars") or {}), **dms["env_vars"]}
    dms["vllm_args"] = {"model": spec["hf_model_repo"], **default_args, **(dms.get("vllm_args") or {})}
    dms.setdefault("default_impl", True)
    dms.setdefault("tensor_cache_timeout", 3600.0)
    spec.setdefault("override_tt_config", {})
    if not spec.get("hf_weights_repo"):
        spec["hf_weights_repo"] = spec["hf_model_repo"]
    if not spec.get("param_count"):
        spec["param_count"] = _param_count(str(spec["hf_model_repo"]))
    if spec["param_count"] and not spec.get("min_disk_gb"):
        spec["min_disk_gb"] = spec["param_count"] * (3 if spec.get("repacked") else 2) + 20
    if spec["param_count"] and not spec.get("min_ram_gb"):
        spec["min_ram_gb"] = spec["param_count"] * 2.5
    spec.setdefault("model_type", "LLM")
    spec.setdefault("status", "EXPERIMENTAL")
    spec["_mesh"] = str(mesh)
    return spec


def runtime_catalog(spec: Mapping[str, Any], where: str) -> JSON:
    """A catalog holding only ``spec`` (from runtime_spec), in the nested export shape, for the usual selection."""
    spec = dict(spec)
    mesh = spec.pop("_mesh")
    device = spec["device_type"]
    return {
        "schema_version": None,
        "release_version": None,
        "model_specs": {spec["hf_model_repo"]: {device: {spec["inference_engine"]: {spec["impl"]["impl_id"]: spec}}}},
        "device_mesh": {device: mesh},
        "legacy_layout": False,
        "source": "runtime_model_spec",
        "path": where,
        "warnings": [],
    }


def strip_private(spec: Mapping[str, Any]) -> JSON:
    """The spec without the collection's own keys (``ttfleet``, ``_mesh``): what the container reads."""
    return {key: value for key, value in spec.items() if key not in ("ttfleet", "_mesh")}
