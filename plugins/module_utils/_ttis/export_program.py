# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
# mypy: disable-error-code="method-assign"
"""The program that exports a tt-inference-server checkout's own catalog; checkout.py runs its source.

It runs inside the TTIS checkout with the chosen interpreter, ``python -B -c SOURCE CHECKOUT MODEL_SPECS_ENV``: the
source of this file (read through its loader, so it works from the zip of an Ansible module payload too). It imports
the checkout's own catalog and prints it in the release_model_spec.json shape; stdout is kept for one JSON document,
the catalog or {"error": {...}} (exit status 3), so the caller can name the cause of a failure. Written for any
Python 3 (type comments, no f-strings, the standard library imported where a failure is reported): an interpreter that
is too old must still say which version it is. Importing this module runs nothing.

workflows.utils.get_repo_root_path() of every TTIS release (v0.10.1 to v0.20.0 and main) walks up from workflows/ for
a '.git' and raises FileNotFoundError "Repository root not found" without one, and workflows/utils.py calls it at
import time (default_dotenv_path). A release unpacked from an archive has no .git, so while the catalog is imported,
and only in this process, <checkout>/.git counts as existing when it does not: the walk then stops at the checkout,
as it does in a git clone. Nothing is written to the release.
"""

import contextlib
import json
import os
import sys
import traceback
import typing

if typing.TYPE_CHECKING:
    # Read by mypy from the type comments, which ruff does not see.
    from typing import IO, Any, NoReturn, Optional  # noqa: F401


def fail(out, kind, exc=None, **extra):
    # type: (IO[str], str, Optional[BaseException], Any) -> NoReturn
    info = {"kind": kind, "python": list(sys.version_info[:3])}  # type: dict[str, Any]
    if exc is not None:
        info["type"] = type(exc).__name__
        info["message"] = str(exc)
        info["module"] = getattr(exc, "name", None)
        frames = traceback.extract_tb(sys.exc_info()[2])
        if frames:
            info["where"] = "%s:%s" % (frames[-1][0], frames[-1][1])
    info.update(extra)
    json.dump({"error": info}, out)
    out.flush()
    raise SystemExit(3)


def import_workflows(root, emulated):
    # type: (Any, bool) -> tuple[Any, Any]
    """``workflows.model_spec`` and ``DeviceTypes`` of the checkout at ``root``; its .git stands in when emulated."""
    import pathlib

    marker = root / ".git"
    real_exists = pathlib.Path.exists

    def exists(self, *args, **kwargs):
        # type: (pathlib.Path, Any, Any) -> bool
        if self == marker:
            return True
        return real_exists(self, *args, **kwargs)

    sys.path.insert(0, str(root))
    if emulated:
        pathlib.Path.exists = exists
    try:
        from workflows import model_spec as catalog_module  # type: ignore[import-not-found]
        from workflows.workflow_types import DeviceTypes  # type: ignore[import-not-found]
    finally:
        pathlib.Path.exists = real_exists
    return catalog_module, DeviceTypes


def import_catalog(out, checkout):
    # type: (IO[str], str) -> tuple[Any, Any, Any, bool]
    """``workflows.model_spec`` and ``DeviceTypes`` of the checkout, its resolved root and whether .git was emulated."""
    try:
        # The standard library too: an interpreter that lacks a module reports it and its version.
        import dataclasses  # noqa: F401
        import enum  # noqa: F401
        import pathlib

        root = pathlib.Path(checkout).resolve()
        emulated = not (root / ".git").exists()
        catalog_module, device_types = import_workflows(root, emulated)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        fail(out, "import", exc)
    return catalog_module, device_types, root, emulated


def main():
    # type: () -> None
    checkout = sys.argv[1]
    wanted_env = sys.argv[2]
    out = sys.stdout
    sys.stdout = sys.stderr
    catalog_module, device_types, root, emulated = import_catalog(out, checkout)
    import dataclasses
    import enum
    import pathlib

    where = pathlib.Path(catalog_module.__file__).resolve()
    if root not in where.parents:
        fail(out, "elsewhere", where=str(where))
    # v0.16.0 and later load workflows/model_specs/<MODEL_SPECS_ENV>/; older releases have one catalog and no such name.
    active_env = getattr(catalog_module, "_MODEL_SPECS_ENV", None)
    if (active_env or "prod") != wanted_env:
        fail(out, "env", active=active_env)

    def plain(obj):
        # type: (Any) -> Any
        if isinstance(obj, enum.Enum):
            return obj.name
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dict((f.name, plain(getattr(obj, f.name))) for f in dataclasses.fields(obj))
        if isinstance(obj, dict):
            return dict(((k.name if isinstance(k, enum.Enum) else str(k)), plain(v)) for k, v in obj.items())
        if isinstance(obj, (list, tuple, set, frozenset)):
            return [plain(v) for v in obj]
        if obj is None or isinstance(obj, (str, int, float, bool)):
            return obj
        return str(obj)

    nested = {}  # type: dict[str, Any]
    for spec in catalog_module.MODEL_SPECS.values():
        engine = getattr(spec, "inference_engine", None) or "vLLM"
        if isinstance(engine, enum.Enum):
            engine = engine.value
        data = plain(spec)
        data["inference_engine"] = engine
        device = spec.device_type.name.upper()
        nested.setdefault(spec.hf_model_repo, {}).setdefault(device, {}).setdefault(engine, {})[spec.impl.impl_id] = (
            data
        )

    meshes = {}
    for member in device_types:
        with contextlib.suppress(Exception):
            meshes[member.name.upper()] = member.to_mesh_device_str()

    release = getattr(catalog_module, "VERSION", None)
    if release is None and os.path.isfile(os.path.join(str(root), "VERSION")):
        with open(os.path.join(str(root), "VERSION"), encoding="utf-8") as handle:
            release = handle.read().strip()

    json.dump(
        {
            "schema_version": getattr(catalog_module, "MODEL_SPECS_SCHEMA_VERSION", None),
            "release_version": release,
            "model_specs": nested,
            "model_specs_env": active_env or "prod",
            "git_marker_emulated": emulated,
            "device_mesh": meshes,
            "devices": sorted(member.name.upper() for member in device_types),
        },
        out,
    )


if __name__ == "__main__":
    main()
