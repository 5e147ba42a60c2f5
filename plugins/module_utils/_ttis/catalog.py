# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Catalogs of tt-inference-server (TTIS) model specs: reading spec exports of either shape, checking every spec.

The _ttis package holds the rules that TTIS applies in ``run.py``, ``workflows/model_spec.py``,
``workflows/setup_host.py`` and ``workflows/run_docker_server.py``, as pure functions shared by modules,
filters and unit tests: this module loads; checkout.py imports a checkout's own code; select.py, derive.py and
tags.py apply the catalog.

A *catalog* is the dict shape of TTIS's ``release_model_spec.json``::

    {"schema_version", "release_version",
     "model_specs": {hf_repo: {DEVICE: {engine: {impl_id: spec}}}}}

plus the keys the loaders add: ``source`` (which loader was used), ``path``,
``warnings``, ``legacy_layout``, ``model_specs_env`` (``prod``, ``dev``, or None for a spec file),
``import_error`` (the cause when the code could not be imported and an export was read) and, when the
checkout's own code was imported, ``checkout``, ``python``, ``git_marker_emulated`` and the
``device_mesh`` and ``devices`` taken from that code.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import (
    MIN_CURRENT_INTERFACE_VERSION,
    VLLM_RELEASE_REPO,
    parse_version_tuple,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.validate import check_spec_shape, source_label

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]

SOURCE_CHECKOUT_CODE = "checkout_code"
SOURCE_RELEASE_FILE = "release_model_spec.json"
SOURCE_LEGACY_FILE = "model_specs_output.json"
SOURCE_SPEC_FILE = "spec_file"


# A release_model_spec.json is about 1 MB; far larger is not a spec export (compressed or not).
SPEC_FILE_LIMIT = 64 << 20
_VERSION_FILE_LIMIT = 4096


# Loading


def _read_json(path: str) -> Any:
    """A spec export, plain or gzip, at most SPEC_FILE_LIMIT bytes either way: a regular file, not a link planted in a
    directory a non-root user can write, never a FIFO or device."""
    directory, name = os.path.split(os.path.abspath(path))
    reason = None
    try:
        with opened_dir(directory) as dirfd:
            raw = read_bytes(dirfd, name, SPEC_FILE_LIMIT, where=directory)
    except SafeFileError as exc:
        reason = exc.reason
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
    else:
        if raw is None:
            reason = "No such file or directory"
    if reason is not None:
        raise SpecError(
            f"Cannot read spec file {path}: {reason}. Give the path of a release_model_spec.json "
            "(or model_specs_output.json) export, or a tt-inference-server checkout instead."
        )
    # Every path that leaves raw None (or unset) set reason above, so here it holds the file's bytes.
    raw = cast(bytes, raw)
    try:
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as handle:
                raw = handle.read(SPEC_FILE_LIMIT + 1)
            if len(raw) > SPEC_FILE_LIMIT:
                raise ValueError(f"more than {SPEC_FILE_LIMIT} bytes uncompressed")
        return json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SpecError(
            f"Spec file {path} is not valid JSON ({exc}). Re-export it with tt-inference-server "
            "(workflows.model_spec.export_model_specs_json) or use the release_model_spec.json of a release tag."
        ) from exc


def _is_spec(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("impl"), dict)
        and "model_name" in value
        and "device_type" in value
    )


def _is_nested(data: object) -> bool:
    specs = data.get("model_specs") if isinstance(data, dict) else None
    if not isinstance(specs, dict):
        return False
    for devices in specs.values():
        if not isinstance(devices, dict):
            return False
        for engines in devices.values():
            if not isinstance(engines, dict):
                return False
            for impls in engines.values():
                if not isinstance(impls, dict) or not all(isinstance(spec, dict) and spec for spec in impls.values()):
                    return False
    return True


def _is_flat(data: object) -> bool:
    return isinstance(data, dict) and bool(data) and all(_is_spec(spec) for spec in data.values())


def _current_release_image(spec: Mapping[str, Any], old_version: object, new_version: object) -> str | None:
    image = spec.get("docker_image")
    prefix = f"{VLLM_RELEASE_REPO}:{old_version}-"
    if isinstance(image, str) and image.startswith(prefix):
        return f"{VLLM_RELEASE_REPO}:{new_version}-{image[len(prefix) :]}"
    return image


def _nest_flat(flat: Mapping[str, Any], release_version: str | None) -> JSON:
    """Legacy ``{model_id: spec}`` (TTIS < v0.11) in the nested shape.

    Before v0.11 every spec's version and default image tag came from the checkout's VERSION file
    at run time, so with a known release those replace the (possibly stale) exported values.
    """
    nested: JSON = {}
    for spec in flat.values():
        spec = dict(spec)
        spec.setdefault("inference_engine", "vLLM")
        if release_version and spec.get("version") != release_version:
            spec["docker_image"] = _current_release_image(spec, spec.get("version"), release_version)
            spec["version"] = release_version
        device = str(spec["device_type"]).upper()
        nested.setdefault(spec["hf_model_repo"], {}).setdefault(device, {}).setdefault(spec["inference_engine"], {})[
            spec["impl"]["impl_id"]
        ] = spec
    return nested


def catalog_from_data(data: Any, source: str, path: str | None = None, release_version: str | None = None) -> JSON:
    """Catalog from parsed JSON in either shape; raises SpecError for anything else.

    ``legacy_layout`` marks releases before v0.11, whose run.py always bind-mounted the versioned
    host volume and read weights from the HF cache instead of ``weights/<model_name>``.
    """
    if _is_nested(data):
        catalog: JSON = dict(data)
        if not catalog.get("release_version"):
            catalog["release_version"] = release_version
        label = source_label(path, catalog["release_version"])
        for repo, devices in catalog["model_specs"].items():
            for device, engines in devices.items():
                for impls in engines.values():
                    for spec in impls.values():
                        check_spec_shape(spec, label, repo, device)
        released = parse_version_tuple(catalog["release_version"])
        catalog["legacy_layout"] = released is not None and released < MIN_CURRENT_INTERFACE_VERSION
    elif _is_flat(data):
        label = source_label(path, release_version)
        for model_id, spec in data.items():
            check_spec_shape(spec, label, model_id)
        catalog = {
            "schema_version": None,
            "release_version": release_version,
            "model_specs": _nest_flat(data, release_version),
            "legacy_layout": True,
        }
    else:
        raise SpecError(
            f"Spec file {path or '(data)'} has an unknown shape: expected release_model_spec.json "
            '({"schema_version", "release_version", "model_specs": {hf_repo: {DEVICE: {engine: {impl_id: spec}}}}}) '
            "or the flat model_specs_output.json of TTIS < v0.11 ({model_id: spec}). "
            "Point spec_file at one of those exports."
        )
    catalog["source"] = source
    catalog["path"] = path
    catalog.setdefault("warnings", [])
    return catalog


def load_spec_file(path: str, source: str = SOURCE_SPEC_FILE, release_version: str | None = None) -> JSON:
    """Load a JSON (optionally gzip-compressed) spec export of either shape."""
    return catalog_from_data(_read_json(path), source, path=path, release_version=release_version)


def read_version_file(checkout: str) -> str | None:
    try:
        with opened_dir(checkout) as dirfd:
            raw = read_bytes(dirfd, "VERSION", _VERSION_FILE_LIMIT)
    except (OSError, SafeFileError):
        return None
    return (raw or b"").decode("utf-8", "replace").strip() or None


def ensure_catalog(specs: object) -> JSON:
    if isinstance(specs, dict) and "source" in specs and "model_specs" in specs:
        return specs
    return catalog_from_data(specs, SOURCE_SPEC_FILE)


def iter_specs(catalog: Mapping[str, Any]) -> Iterator[JSON]:
    """Every spec of a catalog, in export order."""
    for devices in catalog["model_specs"].values():
        for engines in devices.values():
            for impls in engines.values():
                yield from impls.values()
