# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Selection as run.py makes it: the spec of (model, device[, impl][, engine]) or of a tt_models entry, and lists."""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import (
    catalog_from_data,
    ensure_catalog,
    iter_specs,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import DEVICES
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import volume_name
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.overrides import (
    ENGINES,
    TuningError,
    apply_overrides,
    check_tuning,
    runtime_catalog,
    runtime_spec,
    strip_private,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import (
    check_image,
    is_legacy_interface,
    override_image,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.validate import check_name, check_volume_root

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]


def _release_label(catalog: Mapping[str, Any]) -> str:
    release = catalog.get("release_version")
    label = f"tt-inference-server {release}" if release else "this spec"
    return f"the dev catalog of {label}" if catalog.get("model_specs_env") == "dev" else label


def known_devices(catalog: Mapping[str, Any]) -> set[str]:
    """Upper-case device names that the catalog or TTIS knows."""
    names = set(DEVICES) | set(catalog.get("devices") or ()) | set(catalog.get("device_mesh") or ())
    names.update(str(spec["device_type"]).upper() for spec in iter_specs(catalog))
    return names


def catalog_devices(catalog: Mapping[str, Any]) -> list[str]:
    """Lower-case device names that have at least one spec, sorted."""
    return sorted({str(spec["device_type"]).lower() for spec in iter_specs(catalog)})


def canonical_device(catalog: Mapping[str, Any], device: str) -> str:
    """Catalog key (upper case) of a TTIS device name given in any case."""
    check_name(device, "device")
    key = device.upper()
    if key in known_devices(catalog):
        return key
    served = catalog_devices(catalog)
    close = difflib.get_close_matches(device.lower(), [d.lower() for d in known_devices(catalog)], n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise SpecError(
        f"Unknown device {device!r}.{hint} Devices with models in {_release_label(catalog)}: {', '.join(served)}."
    )


def canonical_engine(engine: str) -> str:
    """Inference engine value (``vLLM``, ``media``, ``forge``) from a name in any case."""
    check_name(engine, "engine")
    for value in ENGINES:
        if value.lower() == engine.lower():
            return value
    raise SpecError(f"Unknown engine {engine!r}; choose one of: {', '.join(e.lower() for e in ENGINES)}.")


def _choice_text(spec: Mapping[str, Any]) -> str:
    dms = spec.get("device_model_spec") or {}
    impl = spec["impl"]
    default = ", default" if dms.get("default_impl") else ""
    return f"impl={impl['impl_name']} (impl_id {impl['impl_id']}), engine={spec['inference_engine'].lower()}{default}"


def _model_matches(spec: Mapping[str, Any], model: str) -> bool:
    return spec["model_name"] == model or spec["hf_model_repo"] == model


def _close_models(device_specs: Iterable[Mapping[str, Any]], model: str) -> list[str]:
    names = sorted({spec["model_name"] for spec in device_specs})
    by_lower: dict[str, str] = {}
    for name in names:
        by_lower.setdefault(name.lower(), name)
    wanted = model.rsplit("/", 1)[-1].lower()
    close = difflib.get_close_matches(wanted, list(by_lower), n=5, cutoff=0.5)
    return [by_lower[name] for name in close]


def select_spec(
    catalog: Mapping[str, Any], model: str, device: str, impl: str | None = None, engine: str | None = None
) -> JSON:
    """The spec that ``run.py --model MODEL --tt-device DEVICE [--impl] [--engine]`` would run.

    Among the specs of that model and device (filtered by impl and engine when given), the one
    marked ``default_impl`` wins; without a default, the first match is used only when impl or
    engine was given, otherwise the caller must choose.
    """
    catalog = ensure_catalog(catalog)
    check_name(model, "model", allow_org=True)
    device_key = canonical_device(catalog, device)
    engine_value = canonical_engine(engine) if engine else None
    if impl:
        check_name(impl, "impl")
    all_specs = list(iter_specs(catalog))
    device_specs = [spec for spec in all_specs if str(spec["device_type"]).upper() == device_key]
    if not device_specs:
        raise SpecError(
            f"No model is built for device {device_key.lower()} in {_release_label(catalog)}. "
            f"Devices with models: {', '.join(catalog_devices(catalog))}."
        )
    model_specs = [spec for spec in device_specs if _model_matches(spec, model)]
    if not model_specs:
        elsewhere = sorted({str(spec["device_type"]).lower() for spec in all_specs if _model_matches(spec, model)})
        if elsewhere:
            raise SpecError(
                f"Model {model!r} is not built for device {device_key.lower()} in {_release_label(catalog)}; "
                f"it supports: {', '.join(elsewhere)}."
            )
        close = _close_models(device_specs, model) or _close_models(all_specs, model)
        hint = f" Closest names: {', '.join(close)}." if close else ""
        served = ", ".join(sorted({str(spec["model_name"]) for spec in device_specs}))
        raise SpecError(
            f"Unknown model {model!r} for device {device_key.lower()} in {_release_label(catalog)}.{hint} "
            f"Models on {device_key.lower()}: {served}."
        )
    candidates = [
        spec
        for spec in model_specs
        if (not engine_value or spec["inference_engine"] == engine_value)
        and (not impl or impl in (spec["impl"]["impl_name"], spec["impl"]["impl_id"]))
    ]
    choices = "; ".join(_choice_text(spec) for spec in model_specs)
    if not candidates:
        wanted = ", ".join(f"{k}={v}" for k, v in (("impl", impl), ("engine", engine)) if v)
        raise SpecError(
            f"Model {model!r} on device {device_key.lower()} has no spec with {wanted} in {_release_label(catalog)}. "
            f"Choices: {choices}."
        )
    default = next((spec for spec in candidates if (spec.get("device_model_spec") or {}).get("default_impl")), None)
    if default is not None:
        return default
    if impl or engine:
        return candidates[0]
    raise SpecError(
        f"Model {model!r} has no default implementation on device {device_key.lower()} in {_release_label(catalog)}; "
        f"set impl (or engine). Choices: {choices}."
    )


# ---------------------------------------------------------------------------------------------
# Derivation


def entry_tuning(entry: Mapping[str, Any]) -> JSON:
    """The checked tuning of a ``tt_models`` entry (see overrides.check_tuning); SpecError when it is bad."""
    try:
        return check_tuning(f"tt_models entry {entry.get('name')}", entry)
    except TuningError as exc:
        raise SpecError(str(exc)) from exc


def select_entry(
    specs: Mapping[str, Any], entry: Mapping[str, Any], device: str, image: bool = True
) -> tuple[JSON, JSON]:
    """The spec a ``tt_models`` entry serves on ``device``, and the catalog it belongs to.

    An entry with ``spec`` (run.py --runtime-model-spec-json, taken as is) gets a catalog of that spec alone; any
    other entry selects from ``specs`` as run.py does. Then, as ``ModelSpec.apply_overrides``: ``image`` (unless
    ``image`` is false, for callers that apply it themselves), ``override_tt_config``, ``vllm_override_args`` and
    ``env``. A ``profile`` is recorded under the spec's private key ``ttfleet``; with ``kernel_cache: own`` its
    kernel cache is kept apart (the cache leaf gets the profile's name).
    """
    name = entry.get("name")
    tuning = entry_tuning(entry)
    if entry.get("spec") not in (None, "", {}):
        where = f"tt_models entry {name}"
        try:
            runtime = runtime_spec(entry["spec"], where)
        except TuningError as exc:
            raise SpecError(str(exc)) from exc
        catalog = catalog_from_data(runtime_catalog(runtime, where), "runtime_model_spec", path=where)
        # The rules of the installed release's run.py still apply (container_command).
        if isinstance(specs, dict):
            catalog["release_version"] = specs.get("release_version")
        wanted = str(device or runtime["device_type"]).upper()
        if wanted != runtime["device_type"]:
            raise SpecError(
                f"{where}: its spec is for device {runtime['device_type'].lower()}, but the entry serves on "
                f"{wanted.lower()}; give a spec for {wanted.lower()} or set the entry's device."
            )
        if name is not None and str(name) not in (runtime["model_name"], runtime["hf_model_repo"]):
            raise SpecError(
                f"{where}: its spec is for {runtime['hf_model_repo']} (model_name {runtime['model_name']}); name the "
                "entry after its spec."
            )
        spec: Mapping[str, Any] = strip_private(runtime)
    else:
        validate_inputs(name, device, impl=entry.get("impl"), engine=entry.get("engine"))
        catalog = ensure_catalog(specs)
        spec = select_spec(catalog, str(name), device, impl=entry.get("impl"), engine=entry.get("engine"))
    if image:
        spec = override_image(spec, entry.get("image"))
    out = apply_overrides(spec, tuning)
    profile = entry.get("profile")
    if profile not in (None, ""):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", str(profile)):
            raise SpecError(
                f"tt_models entry {name}: profile {profile!r} is not a profile name (1-63 letters, digits, '.', '_' "
                "and '-', starting with a letter or digit); it names the profile's kernel cache directory."
            )
        own = (entry.get("kernel_cache") or "own") == "own"
        out["ttfleet"] = {"profile": profile, "cache_variant": profile if own else None}
    return out, catalog


def validate_inputs(
    model: str | None = None,
    device: str | None = None,
    impl: str | None = None,
    engine: str | None = None,
    volume_root: str | None = None,
    image: str | None = None,
) -> None:
    """Reject hostile or malformed selection inputs before any spec is read."""
    if image is not None:
        check_image(image)
    if model is not None:
        check_name(model, "model", allow_org=True)
    for value, option in ((device, "device"), (impl, "impl")):
        if value is not None:
            check_name(value, option)
    if engine is not None:
        canonical_engine(engine)
    check_volume_root(volume_root)


def list_models(specs: Mapping[str, Any], device: str | None = None, model: str | None = None) -> list[JSON]:
    """Every spec servable on ``device`` (all devices when None), optionally for one model."""
    validate_inputs(model=model or None, device=device or None)
    catalog = ensure_catalog(specs)
    device_key = canonical_device(catalog, device) if device else None
    rows: list[JSON] = []
    for spec in iter_specs(catalog):
        if device_key and str(spec["device_type"]).upper() != device_key:
            continue
        if model and not _model_matches(spec, model):
            continue
        engine = spec.get("inference_engine") or "vLLM"
        version = spec.get("version")
        rows.append(
            {
                "model_name": spec["model_name"],
                "hf_model_repo": spec["hf_model_repo"],
                "device": str(spec["device_type"]).lower(),
                "impl_id": spec["impl"]["impl_id"],
                "impl_name": spec["impl"].get("impl_name"),
                "inference_engine": engine,
                "default_impl": bool((spec.get("device_model_spec") or {}).get("default_impl")),
                "version": version,
                "docker_image": spec.get("docker_image"),
                "status": spec.get("status"),
                "model_type": spec.get("model_type"),
                "legacy_interface": is_legacy_interface(engine, version),
                "volume_name": volume_name(spec["impl"]["impl_id"], spec["model_name"], version) if version else None,
            }
        )
    rows.sort(
        key=lambda row: (
            row["model_name"].lower(),
            row["device"],
            not row["default_impl"],
            row["inference_engine"],
            row["impl_id"],
        )
    )
    return rows
