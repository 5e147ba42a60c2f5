# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Everything a playbook needs about one spec (names, paths, image, requirements), and select-then-derive."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import ensure_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import mesh_name
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    CONTAINER_CACHE_ROOT,
    container_path,
    container_tt_cache_path,
    named_volume,
    tt_metal_cache_subdir,
    volume_name,
    weights_subdir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.select import (
    select_entry,
    select_spec,
    validate_inputs,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import (
    is_legacy_interface,
    override_image,
    parse_image_version,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.validate import (
    check_argument,
    check_component,
    check_env,
    check_spec_shape,
    check_volume_root,
    show,
    source_label,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]


def _system_requirements(value: object) -> dict[str, JSON | None] | None:
    if not isinstance(value, dict):
        return None
    result: dict[str, JSON | None] = {}
    for key in ("firmware", "kmd"):
        requirement = value.get(key)
        result[key] = (
            {"specifier": requirement.get("specifier"), "mode": requirement.get("mode")}
            if isinstance(requirement, dict)
            else None
        )
    return result


def spec_mesh(spec: Mapping[str, Any], catalog: Mapping[str, Any] | None = None) -> str:
    """Tensor cache leaf of a spec: the data-parallel subdevice's mesh first, else the device's."""
    device_mesh = (catalog or {}).get("device_mesh")
    return mesh_name(spec.get("subdevice_type") or spec["device_type"], device_mesh)


def derive(spec: Mapping[str, Any], catalog: Mapping[str, Any] | None = None, volume_root: str | None = None) -> JSON:
    """Everything a playbook needs about one spec: names, paths, image, requirements."""
    catalog = catalog or {}
    source = source_label(catalog.get("path"), catalog.get("release_version"))
    check_spec_shape(spec, source)
    where = f"{source}: the spec of {show(spec['model_name'])} on {show(spec['device_type'])}"
    # Every value below reaches a path, a docker argument or a --mount value (container_command).
    model_name = check_component(spec["model_name"], "model_name", where, mount=True)
    impl_id = check_component(spec["impl"]["impl_id"], "impl.impl_id", where, mount=True)
    version = spec.get("version")
    if version in (None, ""):
        raise SpecError(
            f"{where} pins no version, so its volume name is undefined. Dev specs of tt-inference-server v0.17.0 and "
            "later pin neither a version nor an image: as run.py --dev-mode needs --override-docker-image, give the "
            "image to run (option image, tt_models[].image); the version its tag starts with names the volume. "
            "Otherwise use the prod catalog."
        )
    version = check_component(str(version), "version", where, mount=True)
    try:
        mesh = spec_mesh(spec, catalog)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from exc
    ours = spec.get("ttfleet") or {}
    if ours.get("cache_variant"):
        # A profile that compiles other programs keeps its kernel cache beside the spec's own.
        mesh = f"{mesh}-{ours['cache_variant']}"
    mesh = check_component(mesh, "mesh", where)
    check_argument(spec["hf_model_repo"], "hf_model_repo", where, allow_org=True)
    for key in ("hf_weights_repo", "docker_image"):
        if spec.get(key) is not None:
            check_argument(spec[key], key, where, allow_org=key == "hf_weights_repo")
    if spec["impl"].get("impl_name") is not None:
        check_argument(spec["impl"]["impl_name"], "impl.impl_name", where)
    check_env(spec.get("env_vars"), "env_vars", where)
    check_env((spec.get("device_model_spec") or {}).get("env_vars"), "device_model_spec.env_vars", where)
    dms = spec.get("device_model_spec") or {}
    engine = spec.get("inference_engine") or "vLLM"
    image_version = parse_image_version(spec.get("docker_image"))
    root = check_volume_root(volume_root)
    vol = volume_name(impl_id, model_name, version)
    weights = weights_subdir(model_name)
    cache = tt_metal_cache_subdir(model_name, mesh)
    volume_path = posixpath.join(root, vol) if root else vol
    env_vars = {**(spec.get("env_vars") or {}), **(dms.get("env_vars") or {})}
    container: dict[str, str] = {
        "cache_root": CONTAINER_CACHE_ROOT,
        "tt_cache_path": container_tt_cache_path(model_name, mesh),
        "weights": container_path(weights),
    }
    return {
        "model_name": model_name,
        "hf_model_repo": spec["hf_model_repo"],
        "hf_weights_repo": spec.get("hf_weights_repo") or spec["hf_model_repo"],
        "model_id": spec.get("model_id"),
        "impl_id": impl_id,
        "impl_name": spec["impl"].get("impl_name", impl_id.replace("_", "-")),
        "inference_engine": engine,
        "device": str(spec["device_type"]).lower(),
        "device_type": str(spec["device_type"]).upper(),
        "subdevice_type": spec.get("subdevice_type"),
        "default_impl": bool(dms.get("default_impl")),
        "version": version,
        "release_version": catalog.get("release_version"),
        "docker_image": spec.get("docker_image"),
        "image_version": ".".join(str(n) for n in image_version) if image_version else None,
        "tt_metal_commit": spec.get("tt_metal_commit"),
        "vllm_commit": spec.get("vllm_commit"),
        "mesh": mesh,
        "volume_name": vol,
        "named_volume": named_volume(impl_id, model_name),
        "weights_subdir": weights,
        "tt_metal_cache_subdir": cache,
        "paths": {
            "volume": volume_path,
            "weights": posixpath.join(volume_path, weights) if root else weights,
            "tt_metal_cache": posixpath.join(volume_path, cache) if root else cache,
            "container": container,
        },
        # Also at the top level: templates read result.container.tt_cache_path as often as paths.
        "container": container,
        "legacy_interface": is_legacy_interface(engine, version),
        "legacy_layout": bool(catalog.get("legacy_layout")),
        "min_disk_gb": spec.get("min_disk_gb"),
        "min_ram_gb": spec.get("min_ram_gb"),
        "param_count": spec.get("param_count"),
        "system_requirements": _system_requirements(spec.get("system_requirements")),
        "env_vars": {key: str(value) for key, value in env_vars.items()},
        "vllm_args": dict(dms.get("vllm_args") or {}),
        "max_concurrency": dms.get("max_concurrency"),
        "max_context": dms.get("max_context"),
        "tensor_cache_timeout": dms.get("tensor_cache_timeout", 3600.0),
        "status": spec.get("status"),
        "model_type": spec.get("model_type"),
        "supported_modalities": list(spec.get("supported_modalities") or []),
        "uses_tensor_model_cache": spec.get("uses_tensor_model_cache", True),
        "spec_source": catalog.get("source"),
        "spec_path": catalog.get("path"),
        "profile": ours.get("profile"),
        "override_tt_config": dict(dms.get("override_tt_config") or {}),
    }


def resolve_params(specs: Mapping[str, Any], params: Mapping[str, Any], volume_root: str | None = None) -> JSON:
    """``resolve`` for a module's ``model``, ``device``, ``impl``, ``engine`` and ``image`` options."""
    entry = {"name": params["model"], "impl": params["impl"], "engine": params["engine"], "image": params.get("image")}
    return resolve_entry(specs, entry, params["device"], volume_root=volume_root)


def resolve_entry(
    specs: Mapping[str, Any], entry: Mapping[str, Any], device: str, volume_root: str | None = None
) -> JSON:
    """``resolve`` for a ``tt_models`` entry on ``device``: select_entry, then derive."""
    check_volume_root(volume_root)
    spec, catalog = select_entry(specs, entry, device)
    return derive(spec, catalog, volume_root=volume_root)


def resolve(
    specs: Mapping[str, Any],
    model: str,
    device: str,
    impl: str | None = None,
    engine: str | None = None,
    volume_root: str | None = None,
    image: str | None = None,
) -> JSON:
    """Select (model, device[, impl][, engine]) as run.py does and derive its names and paths.

    ``specs`` is a catalog from one of the loaders or a parsed export of either shape. ``image`` is
    ``run.py --override-docker-image`` (see override_image).
    Raises SpecError with a message that names the input and lists the valid choices.
    """
    validate_inputs(model, device, impl=impl, engine=engine, volume_root=volume_root, image=image)
    catalog = ensure_catalog(specs)
    spec = select_spec(catalog, model, device, impl=impl, engine=engine)
    return derive(override_image(spec, image), catalog, volume_root=volume_root)
