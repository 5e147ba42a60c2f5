# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Serve profiles and model packages: what a ``tt_models`` entry serves once its profile and package are applied.

Private to the collection. Pure functions, standard library only; the schema is documented in
``docs/model-packages.md``.

- ``tt_serve_profiles``: ``{model: {device: {profile: settings}}}``, named tunings of catalog models.
- ``tt_model_packages``: ``{package: package}``, models from outside the catalog as a model package publishes them
  (image, weights repository and revision, profiles per hardware, extra repositories, readiness, provenance).

``expand_entries`` turns ``tt_models`` into entries that carry everything the modules read: ``spec`` (for a
package, a runtime model spec built from it), ``vllm_override_args``, ``override_tt_config``, ``env``,
``extra_repos``, ``profile``, ``kernel_cache``, ``ready_log_marker``, ``start_timeout``, ``first_start_timeout`` and
``boards``. The entry's own settings win over its profile's, which win over the package's.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, TypeVar

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.overrides import (
    TuningError,
    check_tuning,
    gate_env,
    gate_vllm_args,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    JSON = dict[str, Any]


_T = TypeVar("_T")


class ProfileError(FleetError, ValueError):
    """A profile or package that cannot be used, with the fix."""


# Settings a profile may hold (and an entry may give itself), merged key by key for the mappings.
PROFILE_KEYS = (
    "vllm_override_args",
    "override_tt_config",
    "env",
    "extra_repos",
    "mesh",
    "kernel_cache",
    "ready_log_marker",
    "start_timeout",
    "first_start_timeout",
)
MERGED = ("vllm_override_args", "override_tt_config", "env")
PACKAGE_KEYS = frozenset(
    {
        "model",
        "model_name",
        "revision",
        "image",
        "version",
        "impl",
        "engine",
        "readiness",
        "provenance",
        "hardware",
        "description",
        "status",
        "system_requirements",
    }
)
HARDWARE_KEYS = frozenset(
    {
        "device_type",
        "mesh",
        "boards",
        "max_context",
        "max_concurrency",
        "default_profile",
        "profiles",
        "system_requirements",
        "min_disk_gb",
        "min_ram_gb",
        "tensor_cache_timeout",
        "env",
        "vllm_args",
    }
)
READINESS_KEYS = frozenset({"log_marker", "start_timeout", "first_start_timeout"})
# A ready_log_marker is matched against the start of one whole log line (roles/serve/files/ttfleet-serve).
MAX_MARKER = 200
_MARKER_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MESH_KEYS = frozenset({"device", "descriptor"})
# tt-metal reads a custom mesh graph descriptor (a .textproto path) from this variable.
MESH_DESCRIPTOR_ENV = "TT_MESH_GRAPH_DESC_PATH"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
_SHA = re.compile(r"[0-9a-f]{40}\Z")


def _names(mapping: Mapping[str, Any]) -> str:
    return ", ".join(sorted(str(key) for key in mapping)) or "none"


def _mapping(value: object, where: str) -> JSON:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileError(f"{where} must be a mapping, got {value!r}.")
    return value


def _unknown(mapping: Mapping[str, Any], allowed: frozenset[str] | tuple[str, ...], where: str) -> None:
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ProfileError(
            f"{where} has unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))} "
            "(docs/model-packages.md)."
        )


def _short(name: object) -> str:
    return str(name).rstrip("/").rsplit("/", 1)[-1]


def _lookup(mapping: Mapping[str, Any], name: str) -> Any:
    """``mapping[name]``, also under the short model name or the repository id."""
    for key in (name, _short(name)):
        if key in mapping:
            return mapping[key]
    for key, value in mapping.items():
        if _short(key) == _short(name):
            return value
    return None


def check_extra_repos(value: object, where: str) -> list[JSON]:
    """Extra weight repositories (a draft model): ``[{repo, revision, [path]}]``, each pinned at a commit."""
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise ProfileError(f"{where}: extra_repos must be a list of {{repo, revision}}, got {value!r}.")
    out = []
    for index, item in enumerate(value):
        here = f"{where}: extra_repos[{index}]"
        if not isinstance(item, dict):
            raise ProfileError(f"{here} must be a mapping {{repo, revision}}, got {item!r}.")
        _unknown(item, ("repo", "revision", "path", "sources"), here)
        repo = item.get("repo")
        if not isinstance(repo, str) or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", repo
        ):
            raise ProfileError(f"{here}: repo {repo!r} must be a Hugging Face repository id such as org/name.")
        revision = item.get("revision")
        if not isinstance(revision, str) or not _SHA.match(revision):
            raise ProfileError(
                f"{here}: revision {revision!r} of {repo} must be the full 40-hex commit, pinned like the main "
                "weights (hf api: GET /api/models/<repo>/revision/main gives its sha)."
            )
        out.append(dict(item))
    return out


def _gated(gate: Callable[[str, str, Any], _T], where: str, field: str, value: Any) -> _T:
    """``value`` through one of the env gate's checks (overrides.gate_env, gate_vllm_args), as a ProfileError."""
    try:
        return gate(where, field, value)
    except TuningError as exc:
        raise ProfileError(str(exc)) from exc


def _check_timeouts(settings: Mapping[str, Any], where: str) -> None:
    """``start_timeout`` and ``first_start_timeout`` of a profile or a package's readiness: positive whole seconds."""
    for key in ("start_timeout", "first_start_timeout"):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ProfileError(
                f"{where}: {key} {value!r} must be a positive whole number of seconds (for example {key}: 1800)."
            )


def check_marker(value: object, where: str, field: str = "ready_log_marker") -> str:
    """A ready_log_marker: one line of text the server logs, at most MAX_MARKER characters, no control characters."""
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(
            f"{where}: {field} {value!r} must be a non-empty string, the start of the line the server logs once it "
            "serves (for example 'Application startup complete')."
        )
    if _MARKER_BAD.search(value) or len(value) > MAX_MARKER or value != value.strip():
        raise ProfileError(
            f"{where}: {field} {value[:MAX_MARKER]!r} must be one line of at most {MAX_MARKER} characters without "
            "control characters or surrounding spaces: it is matched at the start of one whole log line of the "
            "server (docs/model-packages.md, Readiness)."
        )
    return value


def _check_profile(settings: object, where: str) -> JSON:
    settings = _mapping(settings, where)
    _unknown(settings, PROFILE_KEYS, where)
    out = copy.deepcopy(settings)
    if "extra_repos" in out:
        out["extra_repos"] = check_extra_repos(out["extra_repos"], where)
    mesh = out.pop("mesh", None)
    if mesh is not None:
        mesh = _mapping(mesh, f"{where}: mesh")
        _unknown(mesh, MESH_KEYS, f"{where}: mesh")
        env = dict(_mapping(out.get("env"), f"{where}: env"))
        if mesh.get("descriptor"):
            env.setdefault(MESH_DESCRIPTOR_ENV, str(mesh["descriptor"]))
        if mesh.get("device"):
            env.setdefault("MESH_DEVICE", str(mesh["device"]))
        out["env"] = env
    if "env" in out:
        _gated(gate_env, where, "env", out["env"])
    if out.get("ready_log_marker") is not None:
        out["ready_log_marker"] = check_marker(out["ready_log_marker"], where)
    if out.get("kernel_cache") not in (None, "own", "shared"):
        raise ProfileError(f"{where}: kernel_cache {out['kernel_cache']!r} must be own or shared.")
    _check_timeouts(out, where)
    return out


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> JSON:
    out = dict(base)
    for key, value in top.items():
        if key in MERGED and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif value is not None:
            out[key] = value
    return out


def _check_readiness(readiness: JSON, where: str) -> JSON:
    """A package's ``readiness``: log_marker a marker line (check_marker), the timeouts positive whole seconds."""
    _unknown(readiness, READINESS_KEYS, where)
    if readiness.get("log_marker") is not None:
        check_marker(readiness["log_marker"], where, "log_marker")
    _check_timeouts(readiness, where)
    return readiness


def package_spec(name: str, package: Mapping[str, Any], device: str) -> tuple[JSON, JSON]:
    """The runtime model spec of ``package`` on ``device`` and that hardware's entry (profiles, boards, ...)."""
    where = f"tt_model_packages.{name}"
    _unknown(package, PACKAGE_KEYS, where)
    for key in ("model", "image", "version"):
        if not isinstance(package.get(key), (str, int, float)) or package.get(key) in ("", None):
            raise ProfileError(f"{where} has no {key}; a package names its model (org/name), image and version.")
    repo = str(package["model"])
    hardware = _mapping(package.get("hardware"), f"{where}.hardware")
    here = _lookup(hardware, device) if device else None
    if here is None:
        raise ProfileError(
            f"{where} has no hardware entry for device {device or '(none)'}; it runs on: {_names(hardware)}. "
            "Serve it on one of those, or add the hardware to the package."
        )
    here = _mapping(here, f"{where}.hardware.{device}")
    _unknown(here, HARDWARE_KEYS, f"{where}.hardware.{device}")
    readiness = _check_readiness(_mapping(package.get("readiness"), f"{where}.readiness"), f"{where}.readiness")
    provenance = _mapping(package.get("provenance"), f"{where}.provenance")
    impl = package.get("impl") or {}
    if isinstance(impl, str):
        impl = {"impl_id": impl.replace("-", "_"), "impl_name": impl.replace("_", "-")}
    impl = _mapping(impl, f"{where}.impl")
    impl_id = impl.get("impl_id") or re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()
    impl = {"impl_id": impl_id, "impl_name": impl.get("impl_name") or impl_id.replace("_", "-")}
    device_type = str(here.get("device_type") or device).upper()
    mesh = here.get("mesh")
    if isinstance(mesh, dict):
        mesh = mesh.get("device")
    env = _gated(gate_env, where, f"hardware.{device}.env", here.get("env"))
    if mesh:
        env["MESH_DEVICE"] = str(mesh)
    model_name = str(package.get("model_name") or _short(repo))
    dms: JSON = {
        "device": device_type,
        "max_concurrency": here.get("max_concurrency") or 32,
        "max_context": here.get("max_context") or 131072,
        "default_impl": True,
        "env_vars": env,
        "vllm_args": dict(_mapping(here.get("vllm_args"), f"{where}.hardware.{device}.vllm_args")),
    }
    _gated(gate_vllm_args, where, f"hardware.{device}.vllm_args", dms["vllm_args"])
    timeout = here.get("tensor_cache_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ProfileError(
            f"{where}.hardware.{device}: tensor_cache_timeout {timeout!r} must be a positive number of seconds."
        )
    if here.get("tensor_cache_timeout") or readiness.get("first_start_timeout"):
        dms["tensor_cache_timeout"] = float(here.get("tensor_cache_timeout") or readiness["first_start_timeout"])
    spec: JSON = {
        "model_id": f"id_{impl['impl_name']}_{model_name}_{device.lower()}",
        "impl": impl,
        "hf_model_repo": repo,
        "model_name": model_name,
        "inference_engine": package.get("engine") or "vLLM",
        "device_type": device_type,
        "device_model_spec": dms,
        "version": str(package["version"]),
        "docker_image": str(package["image"]),
        "status": package.get("status") or "EXPERIMENTAL",
        "metadata": {"package": name, "provenance": dict(provenance)},
    }
    for key in ("tt_metal_commit", "vllm_commit"):
        if provenance.get(key):
            spec[key] = str(provenance[key])
    requirements = here.get("system_requirements") or package.get("system_requirements")
    if requirements:
        spec["system_requirements"] = requirements
    for key in ("min_disk_gb", "min_ram_gb"):
        if here.get(key):
            spec[key] = here[key]
    return spec, {**here, "readiness": readiness}


def expand_entries(
    models: list[Any] | None,
    device: str | None,
    packages: Mapping[str, Any] | None = None,
    profiles: Mapping[str, Any] | None = None,
) -> list[JSON]:
    """``tt_models`` with packages and profiles applied (see the module docstring), in order."""
    packages = packages or {}
    profiles = profiles or {}
    if not isinstance(packages, dict):
        raise ProfileError(f"tt_model_packages must be a mapping of package name to package, got {packages!r}.")
    if not isinstance(profiles, dict):
        raise ProfileError(
            f"tt_serve_profiles must be a mapping {{model: {{device: {{profile: ...}}}}}}, got {profiles!r}."
        )
    out: list[JSON] = []
    for index, entry in enumerate(models or []):
        if not isinstance(entry, dict):
            out.append(entry)
            continue
        entry = dict(entry)
        where = f"tt_models entry {entry.get('name') or entry.get('package') or index}"
        entry_device = str(entry.get("device") or device or "").lower()
        available: Mapping[str, Any] = {}
        default_profile = None
        base: JSON = {}
        package_name = entry.get("package")
        if package_name not in (None, ""):
            package = packages.get(str(package_name))
            if package is None:
                raise ProfileError(
                    f"{where}: package {package_name!r} is not in tt_model_packages (defined: {_names(packages)})."
                )
            package = _mapping(package, f"tt_model_packages.{package_name}")
            spec, hardware = package_spec(str(package_name), package, entry_device)
            entry.setdefault("name", spec["hf_model_repo"])
            if entry.get("spec") not in (None, "", {}):
                raise ProfileError(f"{where}: give either package or spec, not both.")
            entry["spec"] = spec
            if package.get("revision") and not entry.get("revision"):
                entry["revision"] = str(package["revision"])
            if hardware.get("boards") and not entry.get("boards"):
                entry["boards"] = hardware["boards"]
            readiness = hardware["readiness"]
            given = {
                "ready_log_marker": readiness.get("log_marker"),
                "start_timeout": readiness.get("start_timeout"),
                "first_start_timeout": readiness.get("first_start_timeout"),
            }
            base = _check_profile(
                {key: value for key, value in given.items() if value is not None},
                f"tt_model_packages.{package_name}.readiness",
            )
            available = _mapping(hardware.get("profiles"), f"tt_model_packages.{package_name}.hardware.{entry_device}")
            default_profile = hardware.get("default_profile")
        if not entry.get("name"):
            raise ProfileError(f"tt_models entry {index} ({entry!r}) has no name; every entry needs the model's name.")
        if not available:
            by_device = _lookup(profiles, str(entry["name"])) or {}
            available = _mapping(_lookup(_mapping(by_device, "tt_serve_profiles"), entry_device) or {}, where)
        profile = entry.get("profile") or default_profile
        if profile not in (None, ""):
            settings = available.get(str(profile))
            if settings is None:
                raise ProfileError(
                    f"{where}: profile {profile!r} is not defined for {entry['name']} on "
                    f"{entry_device or '(no device)'}"
                    f"; defined: {_names(available)} (tt_serve_profiles, or the package's hardware profiles)."
                )
            base = _merge(base, _check_profile(settings, f"{where}: profile {profile}"))
            entry["profile"] = str(profile)
        # The profile's settings and the entry's own are checked by _check_profile (extra_repos included).
        merged = _merge(base, _check_profile({key: entry[key] for key in PROFILE_KEYS if key in entry}, where))
        try:
            # Refused here, before any role changes anything (run.py would only warn and drop them).
            check_tuning(where, merged)
        except TuningError as exc:
            raise ProfileError(str(exc)) from exc
        entry.update(merged)
        out.append(entry)
    return out
