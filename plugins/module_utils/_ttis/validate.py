# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Checks of what reaches a path or a docker argument: selection inputs, spec values and the shape of a spec."""

from __future__ import annotations

import os
import posixpath
import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# Characters that change the meaning of a docker argument built from a spec value: ',' and '"' split or quote
# the CSV of --mount, '=' splits a mount option, ':' splits --volume NAME:PATH[:MODE].
_MOUNT_UNSAFE = re.compile(r'[,=:"]')
_DEVICE_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


SPEC_FIX = (
    "fix that entry, or use the release_model_spec.json of a tt-inference-server release tag "
    "(or re-export it with workflows.model_spec.export_model_specs_json)"
)


# Input validation


def check_name(value: object, option: str, allow_org: bool = False) -> str:
    """Return ``value`` if it is a safe name for ``option``, else raise SpecError.

    Names end up in paths and docker arguments: at most one ``/`` (an HF ``org/name``) when
    ``allow_org``, none otherwise; no ``..``, backslash, control character, empty part or
    leading ``-``.
    """
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{option} must be a non-empty string, got {value!r}.")
    problem = None
    parts = value.split("/")
    if CONTROL_CHARS.search(value):
        problem = "contains a control character"
    elif ".." in value:
        problem = "contains '..'"
    elif "\\" in value:
        problem = "contains a backslash"
    elif value != value.strip():
        problem = "has leading or trailing whitespace"
    elif len(parts) > (2 if allow_org else 1):
        problem = "may hold at most one '/' (HF org/name)" if allow_org else "may not contain '/'"
    elif any(not part or part == "." for part in parts):
        problem = "has an empty path component"
    elif value.startswith("-"):
        problem = "starts with '-'"
    if problem:
        raise SpecError(f"{option} {value!r} {problem}; give a plain name as listed by list mode.")
    return value


def spec_error(where: str, field: str, value: object, problem: str) -> SpecError:
    return SpecError(f"{where}: {field} {value!r} {problem}; {SPEC_FIX}.")


def check_component(value: object, field: str, where: str, mount: bool = False) -> str:
    """A spec value that becomes one path component (of a volume, weights or cache directory).

    With ``mount`` it also reaches ``docker run --mount``/``--volume`` values, which it must not split.
    """
    if not isinstance(value, str) or not value:
        raise spec_error(where, field, value, "must be a non-empty string")
    if CONTROL_CHARS.search(value):
        raise spec_error(where, field, value, "contains a control character (newline, NUL, ...)")
    if value in (".", "..") or "/" in value or "\\" in value:
        raise spec_error(where, field, value, "must be a single path component")
    unsafe = _MOUNT_UNSAFE.search(value) if mount else None
    if unsafe:
        raise spec_error(
            where,
            field,
            value,
            f"contains {unsafe.group()!r}, which would change the docker --mount or --volume options",
        )
    return value


def check_argument(value: object, field: str, where: str, allow_org: bool = False) -> str:
    """A spec value passed as one docker or container argument (an image, an HF repository, an impl name)."""
    if not isinstance(value, str) or not value:
        raise spec_error(where, field, value, "must be a non-empty string")
    if CONTROL_CHARS.search(value) or re.search(r"\s", value):
        raise spec_error(where, field, value, "contains whitespace or a control character")
    if value.startswith("-"):
        raise spec_error(where, field, value, "starts with '-' and would be read as an option")
    if allow_org and (value.count("/") > 1 or ".." in value or "\\" in value):
        raise spec_error(where, field, value, "is not a Hugging Face repository id (org/name)")
    return value


def check_env(env: object, field: str, where: str) -> None:
    """``env_vars`` of a spec: names docker -e accepts, single-line scalar values."""
    if env is None:
        return
    if not isinstance(env, dict):
        raise spec_error(where, field, env, f"is a {type(env).__name__}, not a mapping of NAME: value")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise spec_error(where, f"{field} name", key, "is not a variable name (letters, digits, '_')")
        if isinstance(value, (dict, list)) or value is None:
            raise spec_error(where, f"{field}.{key}", value, "must be a string or a number")
        if CONTROL_CHARS.search(str(value)):
            raise spec_error(where, f"{field}.{key}", value, "contains a control character (newline, NUL, ...)")


def show(value: object) -> str:
    """``value`` as it is when printable, else its repr (a newline must not split an error message)."""
    return value if isinstance(value, str) and value.isprintable() else repr(value)


def source_label(path: str | None, release_version: object) -> str:
    """How error messages name where specs come from."""
    if path and release_version:
        return f"{path} (tt-inference-server {release_version})"
    if path:
        return str(path)
    return f"the specs of tt-inference-server {release_version}" if release_version else "the given specs"


def _require(
    mapping: Mapping[str, Any], key: str, types: tuple[type, ...], where: str, field: str, optional: bool = False
) -> Any:
    """``mapping[key]`` when it has one of ``types`` (a string must not be empty), else SpecError naming it."""
    value = mapping.get(key)
    if value is None and optional:
        return None
    if key not in mapping:
        raise SpecError(f"{where} has no {field!r}; {SPEC_FIX}.")
    if not isinstance(value, types) or value == "":
        # Annotated: mypy infers the keys of the literal as ABCMeta, which a ``type`` does not match.
        type_names: dict[type, str] = {dict: "a mapping", str: "a non-empty string"}
        wanted = " or ".join(type_names.get(t, t.__name__) for t in types)
        raise SpecError(f"{where}: {field} {value!r} is a {type(value).__name__}, not {wanted}; {SPEC_FIX}.")
    return value


def check_spec_shape(spec: Mapping[str, Any], source: str, model: str | None = None, device: str | None = None) -> None:
    """The keys that selecting and deriving read, with their types, so a malformed spec fails with a message that
    names the source, the model, the device and the key instead of a bare KeyError."""
    if isinstance(spec.get("model_name"), str):
        model = spec["model_name"]
    if isinstance(spec.get("device_type"), str):
        device = spec["device_type"]
    where = f"{source}: the spec of {show(model or '(unnamed model)')} on {show(device or '(no device)')}"
    for key in ("model_name", "device_type", "hf_model_repo"):
        _require(spec, key, (str,), where, key)
    # Selection compares device names; one with a newline would never match and would split messages.
    if not _DEVICE_TYPE.fullmatch(spec["device_type"]):
        raise spec_error(where, "device_type", spec["device_type"], "is not a device name (letters, digits, '_')")
    impl = _require(spec, "impl", (dict,), where, "impl")
    _require(impl, "impl_id", (str,), where, "impl.impl_id")
    _require(impl, "impl_name", (str,), where, "impl.impl_name", optional=True)
    for key in ("inference_engine", "docker_image", "subdevice_type", "hf_weights_repo"):
        _require(spec, key, (str,), where, key, optional=True)
    _require(spec, "version", (str, int, float), where, "version", optional=True)
    _require(spec, "env_vars", (dict,), where, "env_vars", optional=True)
    dms = _require(spec, "device_model_spec", (dict,), where, "device_model_spec", optional=True) or {}
    for key in ("env_vars", "vllm_args"):
        _require(dms, key, (dict,), where, f"device_model_spec.{key}", optional=True)


def check_volume_root(volume_root: object) -> str | None:
    if not volume_root:
        return None
    if not isinstance(volume_root, str) or CONTROL_CHARS.search(volume_root):
        raise SpecError(f"volume_root {volume_root!r} must be an absolute path without control characters.")
    root = os.path.expanduser(volume_root)
    if not posixpath.isabs(root):
        raise SpecError(f"volume_root {volume_root!r} must be an absolute path (for example /opt/tt-cache).")
    return posixpath.normpath(root)
