# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters for the names and paths tt-inference-server derives from a model spec.

Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_devices = module_utils("_ttis.devices")
_errors = module_utils("_ttis.errors")
_ttis_names = module_utils("_ttis.names")
_tags = module_utils("_ttis.tags")
_validate = module_utils("_ttis.validate")


def _fields(filter_name: str, value: object, names: tuple[str, ...], given: tuple[object, ...]) -> list[object]:
    """Positional values, or the same keys of a model_spec result passed as the input."""
    if isinstance(value, Mapping) and not any(v is not None for v in given):
        missing = [name for name in names if value.get(name) in (None, "")]
        if missing:
            raise AnsibleFilterError(f"{filter_name}: the input dict lacks {', '.join(missing)}.")
        return [value[name] for name in names]
    values = [value, *given]
    missing = [name for name, v in zip(names, values, strict=True) if v in (None, "")]
    if missing:
        raise AnsibleFilterError(
            f"{filter_name}: give {', '.join(missing)} (or a ttfleet.inference.model_spec result)."
        )
    return values


def _names(filter_name: str, values: list[object], options: tuple[str, ...]) -> list[str]:
    try:
        return [_validate.check_name(str(v), option) for v, option in zip(values, options, strict=True)]
    except _errors.SpecError as exc:
        raise AnsibleFilterError(f"{filter_name}: {exc}") from exc


def tt_volume_name(impl_id: object, model_name: object = None, version: object = None) -> str:
    """volume_id_<impl_id>-<model_name>-v<version>."""
    options = ("impl_id", "model_name", "version")
    values = _fields("tt_volume_name", impl_id, options, (model_name, version))
    return _ttis_names.volume_name(*_names("tt_volume_name", values, options))


def tt_named_volume(impl_id: object, model_name: object = None) -> str:
    """volume_id_<impl_id>-<model_name>."""
    options = ("impl_id", "model_name")
    values = _fields("tt_named_volume", impl_id, options, (model_name,))
    return _ttis_names.named_volume(*_names("tt_named_volume", values, options))


def tt_mesh(device: object) -> str:
    """Mesh directory name of a TTIS device."""
    (device,) = _names("tt_mesh", [device], ("device",))
    try:
        return _devices.mesh_name(device)
    except _errors.SpecError as exc:
        raise AnsibleFilterError(f"tt_mesh: {exc}") from exc


def tt_cache_subdir(model_name: object, mesh: object = None) -> str:
    """tt_metal_cache/cache_<model_name>/<mesh>, relative to the volume."""
    options = ("model_name", "mesh")
    values = _fields("tt_cache_subdir", model_name, options, (mesh,))
    return _ttis_names.tt_metal_cache_subdir(*_names("tt_cache_subdir", values, options))


def tt_cache_path(model_name: object, mesh: object = None) -> str:
    """TT_CACHE_PATH inside the container."""
    options = ("model_name", "mesh")
    values = _fields("tt_cache_path", model_name, options, (mesh,))
    return _ttis_names.container_tt_cache_path(*_names("tt_cache_path", values, options))


def tt_legacy_interface(version: object, inference_engine: object = "vLLM") -> bool:
    """Whether a spec's image predates the v0.11.0 container interface."""
    if isinstance(version, Mapping):
        return _tags.is_legacy_interface(version.get("inference_engine") or "vLLM", version.get("version"))
    return _tags.is_legacy_interface(inference_engine, None if version is None else str(version))


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "tt_volume_name": tt_volume_name,
            "tt_named_volume": tt_named_volume,
            "tt_mesh": tt_mesh,
            "tt_cache_subdir": tt_cache_subdir,
            "tt_cache_path": tt_cache_path,
            "tt_legacy_interface": tt_legacy_interface,
        }
