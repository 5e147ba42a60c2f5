# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Model specs of tenstorrent tt-inference-server (TTIS): loading, selection, derived names.

Pure functions, standard library only, so that modules, filters and unit tests share one
implementation of the rules that TTIS applies in ``run.py``, ``workflows/model_spec.py``,
``workflows/setup_host.py`` and ``workflows/run_docker_server.py``.

A *catalog* is the dict shape of TTIS's ``release_model_spec.json``::

    {"schema_version", "release_version",
     "model_specs": {hf_repo: {DEVICE: {engine: {impl_id: spec}}}}}

plus the keys this module adds when loading: ``source`` (which loader was used), ``path``,
``warnings``, ``legacy_layout``, ``model_specs_env`` (``prod``, ``dev``, or None for a spec file),
``import_error`` (the cause when the code could not be imported and an export was read) and, when the
checkout's own code was imported, ``checkout``, ``python``, ``git_marker_emulated`` and the
``device_mesh`` and ``devices`` taken from that code.
"""

from __future__ import annotations

import difflib
import gzip
import io
import json
import os
import posixpath
import re
import subprocess
import sys
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._overrides import (
    ENGINES,
    TuningError,
    apply_overrides,
    check_tuning,
    runtime_catalog,
    runtime_spec,
    strip_private,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import DEVICES, mesh_name
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

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]

# run.py refuses vLLM images older than this: their entrypoint (gosu, MODEL_WEIGHTS_PATH, no
# --model arguments) predates the interface change of TTIS v0.11.0.
MIN_CURRENT_INTERFACE_VERSION = (0, 11, 0)

SOURCE_CHECKOUT_CODE = "checkout_code"
SOURCE_RELEASE_FILE = "release_model_spec.json"
SOURCE_LEGACY_FILE = "model_specs_output.json"
SOURCE_SPEC_FILE = "spec_file"

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# Characters that change the meaning of a docker argument built from a spec value: ',' and '"' split or quote
# the CSV of --mount, '=' splits a mount option, ':' splits --volume NAME:PATH[:MODE].
_MOUNT_UNSAFE = re.compile(r'[,=:"]')
_DEVICE_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A release_model_spec.json is about 1 MB; far larger is not a spec export (compressed or not).
SPEC_FILE_LIMIT = 64 << 20
_VERSION_FILE_LIMIT = 4096
_SPEC_FIX = (
    "fix that entry, or use the release_model_spec.json of a tt-inference-server release tag "
    "(or re-export it with workflows.model_spec.export_model_specs_json)"
)
_VERSION_PREFIX = re.compile(r"^(\d+(?:\.\d+){1,2})")
_VLLM_RELEASE_REPO = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64"
_IMPORT_TIMEOUT = 120

# The release the ttfleet.inference.inference_server role made current: <root>/current links to
# <root>/releases/<tag>, whose venv (Python >= 3.10 with PyYAML) is <root>/venvs/<tag>. The root is the default of
# tt_release_root (roles/fleet_defaults); the modules' defaults follow it from here.
DEFAULT_RELEASE_ROOT = "/opt/tt-inference-server"
DEFAULT_CHECKOUT = DEFAULT_RELEASE_ROOT + "/current"

# Runs inside the TTIS checkout with the chosen interpreter: ``-c PROGRAM CHECKOUT MODEL_SPECS_ENV``. It imports the
# checkout's own catalog and prints it in the release_model_spec.json shape; stdout is kept for one JSON document, the
# catalog or {"error": {...}} (exit status 3), so the caller can name the cause of a failure. Written for any Python 3
# (no f-strings): an interpreter that is too old must still say which version it is.
#
# workflows.utils.get_repo_root_path() of every TTIS release (v0.10.1 to v0.20.0 and main) walks up from
# workflows/ for a '.git' and raises FileNotFoundError "Repository root not found" without one, and
# workflows/utils.py calls it at import time (default_dotenv_path). A release unpacked from an archive has no
# .git, so while the catalog is imported, and only in this process, <checkout>/.git counts as existing when it
# does not: the walk then stops at the checkout, as it does in a git clone. Nothing is written to the release.
_EXPORT_PROGRAM = r"""
import json, os, sys, traceback

checkout = sys.argv[1]
wanted_env = sys.argv[2]
out = sys.stdout
sys.stdout = sys.stderr


def fail(kind, exc=None, **extra):
    info = {"kind": kind, "python": list(sys.version_info[:3])}
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
    sys.exit(3)


try:
    import dataclasses, enum, pathlib

    root = pathlib.Path(checkout).resolve()
    marker = root / ".git"
    real_exists = pathlib.Path.exists
    emulated = not real_exists(marker)

    def exists(self, *args, **kwargs):
        if self == marker:
            return True
        return real_exists(self, *args, **kwargs)

    sys.path.insert(0, str(root))
    if emulated:
        pathlib.Path.exists = exists
    try:
        from workflows import model_spec as catalog_module
        from workflows.workflow_types import DeviceTypes
    finally:
        pathlib.Path.exists = real_exists
except KeyboardInterrupt:
    raise
except BaseException as exc:
    fail("import", exc)

where = pathlib.Path(catalog_module.__file__).resolve()
if root not in where.parents:
    fail("elsewhere", where=str(where))
# v0.16.0 and later load workflows/model_specs/<MODEL_SPECS_ENV>/; older releases have one catalog and no such name.
active_env = getattr(catalog_module, "_MODEL_SPECS_ENV", None)
if (active_env or "prod") != wanted_env:
    fail("env", active=active_env)


def plain(obj):
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


nested = {}
for spec in catalog_module.MODEL_SPECS.values():
    engine = getattr(spec, "inference_engine", None) or "vLLM"
    if isinstance(engine, enum.Enum):
        engine = engine.value
    data = plain(spec)
    data["inference_engine"] = engine
    device = spec.device_type.name.upper()
    nested.setdefault(spec.hf_model_repo, {}).setdefault(device, {}).setdefault(engine, {})[
        spec.impl.impl_id
    ] = data

meshes = {}
for member in DeviceTypes:
    try:
        meshes[member.name.upper()] = member.to_mesh_device_str()
    except Exception:
        pass

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
        "devices": sorted(member.name.upper() for member in DeviceTypes),
    },
    out,
)
"""


# Catalogs of workflows/model_specs/<env>/ (TTIS v0.16.0 and later), as MODEL_SPECS_ENV names them. run.py --dev-mode
# sets MODEL_SPECS_ENV=dev before it imports workflows.model_spec; without it the catalog is prod.
MODEL_SPECS_ENVS = ("prod", "dev")
DEFAULT_MODEL_SPECS_ENV = "prod"

# Module options of the doc fragment ttfleet.inference.spec_source, shared by every module that
# resolves a spec (model_spec, volume_facts, container_command); the fragment documents exactly these.
SPEC_SOURCE_OPTIONS = {
    "model": {"type": "str"},
    "device": {"type": "str"},
    "impl": {"type": "str"},
    "engine": {"type": "str", "choices": ["vllm", "media", "forge"]},
    "tt_inference_server_dir": {"type": "path"},
    "spec_file": {"type": "path"},
    "python": {"type": "path"},
    "model_specs_env": {"type": "str", "choices": list(MODEL_SPECS_ENVS), "default": DEFAULT_MODEL_SPECS_ENV},
}


class CodeImportError(SpecError):
    """The checkout's ``workflows.model_spec`` could not be imported.

    ``cause`` says why, one of ``CAUSE_*``; ``hint`` says what to change (empty when there is nothing to change
    on this side); ``str()`` is the reason alone, without the hint.
    """

    def __init__(self, message: str, cause: str, hint: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.hint = hint


# Why the code could not be imported. Another interpreter (option python) fixes the first four only.
CAUSE_INTERPRETER = "interpreter"  # the interpreter does not run
CAUSE_PYTHON = "python"  # it is older than TTIS needs
CAUSE_PYYAML = "pyyaml"  # it has no PyYAML (TTIS v0.16.0 and later read YAML catalogs)
CAUSE_MODULE = "module"  # it lacks another module the code imports
CAUSE_REPO_ROOT = "repo_root"  # workflows.utils.get_repo_root_path() found no repository root
CAUSE_CODE = "code"  # the code raised something else
CAUSE_ENV = "model_specs_env"  # the code did not load the catalog asked for
CAUSE_TIMEOUT = "timeout"
CAUSE_OUTPUT = "output"  # it ended without a readable answer
_PYTHON_HINT = (
    "Give an interpreter with Python >= 3.10 and PyYAML (option python), such as the release's venv that the "
    "ttfleet.inference.inference_server role makes."
)
_MIN_PYTHON = (3, 10)


# ---------------------------------------------------------------------------------------------
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
    if _CONTROL_CHARS.search(value):
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


def _spec_error(where: str, field: str, value: object, problem: str) -> SpecError:
    return SpecError(f"{where}: {field} {value!r} {problem}; {_SPEC_FIX}.")


def _check_component(value: object, field: str, where: str, mount: bool = False) -> str:
    """A spec value that becomes one path component (of a volume, weights or cache directory).

    With ``mount`` it also reaches ``docker run --mount``/``--volume`` values, which it must not split.
    """
    if not isinstance(value, str) or not value:
        raise _spec_error(where, field, value, "must be a non-empty string")
    if _CONTROL_CHARS.search(value):
        raise _spec_error(where, field, value, "contains a control character (newline, NUL, ...)")
    if value in (".", "..") or "/" in value or "\\" in value:
        raise _spec_error(where, field, value, "must be a single path component")
    unsafe = _MOUNT_UNSAFE.search(value) if mount else None
    if unsafe:
        raise _spec_error(
            where,
            field,
            value,
            f"contains {unsafe.group()!r}, which would change the docker --mount or --volume options",
        )
    return value


def _check_argument(value: object, field: str, where: str, allow_org: bool = False) -> str:
    """A spec value passed as one docker or container argument (an image, an HF repository, an impl name)."""
    if not isinstance(value, str) or not value:
        raise _spec_error(where, field, value, "must be a non-empty string")
    if _CONTROL_CHARS.search(value) or re.search(r"\s", value):
        raise _spec_error(where, field, value, "contains whitespace or a control character")
    if value.startswith("-"):
        raise _spec_error(where, field, value, "starts with '-' and would be read as an option")
    if allow_org and (value.count("/") > 1 or ".." in value or "\\" in value):
        raise _spec_error(where, field, value, "is not a Hugging Face repository id (org/name)")
    return value


def _check_env(env: object, field: str, where: str) -> None:
    """``env_vars`` of a spec: names docker -e accepts, single-line scalar values."""
    if env is None:
        return
    if not isinstance(env, dict):
        raise _spec_error(where, field, env, f"is a {type(env).__name__}, not a mapping of NAME: value")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise _spec_error(where, f"{field} name", key, "is not a variable name (letters, digits, '_')")
        if isinstance(value, (dict, list)) or value is None:
            raise _spec_error(where, f"{field}.{key}", value, "must be a string or a number")
        if _CONTROL_CHARS.search(str(value)):
            raise _spec_error(where, f"{field}.{key}", value, "contains a control character (newline, NUL, ...)")


# ---------------------------------------------------------------------------------------------
# Versions


def parse_version_tuple(value: object) -> tuple[int, ...] | None:
    """Leading ``X.Y[.Z]`` of ``value`` as a 3-tuple (short forms padded), or None (``dev``, ``latest``)."""
    if not isinstance(value, str) or not value:
        return None
    match = _VERSION_PREFIX.match(value)
    if not match:
        return None
    numbers = [int(part) for part in match.group(1).split(".")]
    numbers += [0] * (3 - len(numbers))
    return tuple(numbers)


def parse_image_version(image: object) -> tuple[int, ...] | None:
    """Version prefix of a docker image tag (text after the last ``:``), or None."""
    if not isinstance(image, str) or ":" not in image:
        return None
    return parse_version_tuple(image.rsplit(":", 1)[1])


def is_legacy_interface(inference_engine: object, version: object) -> bool:
    """True for vLLM specs whose image predates the v0.11.0 interface (run.py refuses them).

    Media and forge images are not affected; an unparseable version counts as current.
    """
    if str(inference_engine).lower() != "vllm":
        return False
    parsed = parse_version_tuple(version)
    return parsed is not None and parsed < MIN_CURRENT_INTERFACE_VERSION


# ---------------------------------------------------------------------------------------------
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
        ) from None


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


def _show(value: object) -> str:
    """``value`` as it is when printable, else its repr (a newline must not split an error message)."""
    return value if isinstance(value, str) and value.isprintable() else repr(value)


def _source_label(path: str | None, release_version: object) -> str:
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
        raise SpecError(f"{where} has no {field!r}; {_SPEC_FIX}.")
    if not isinstance(value, types) or value == "":
        # Annotated: mypy infers the keys of the literal as ABCMeta, which a ``type`` does not match.
        type_names: dict[type, str] = {dict: "a mapping", str: "a non-empty string"}
        wanted = " or ".join(type_names.get(t, t.__name__) for t in types)
        raise SpecError(f"{where}: {field} {value!r} is a {type(value).__name__}, not {wanted}; {_SPEC_FIX}.")
    return value


def _check_spec_shape(
    spec: Mapping[str, Any], source: str, model: str | None = None, device: str | None = None
) -> None:
    """The keys that selecting and deriving read, with their types, so a malformed spec fails with a message that
    names the source, the model, the device and the key instead of a bare KeyError."""
    if isinstance(spec.get("model_name"), str):
        model = spec["model_name"]
    if isinstance(spec.get("device_type"), str):
        device = spec["device_type"]
    where = f"{source}: the spec of {_show(model or '(unnamed model)')} on {_show(device or '(no device)')}"
    for key in ("model_name", "device_type", "hf_model_repo"):
        _require(spec, key, (str,), where, key)
    # Selection compares device names; one with a newline would never match and would split messages.
    if not _DEVICE_TYPE.fullmatch(spec["device_type"]):
        raise _spec_error(where, "device_type", spec["device_type"], "is not a device name (letters, digits, '_')")
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


def _current_release_image(spec: Mapping[str, Any], old_version: object, new_version: object) -> str | None:
    image = spec.get("docker_image")
    prefix = f"{_VLLM_RELEASE_REPO}:{old_version}-"
    if isinstance(image, str) and image.startswith(prefix):
        return f"{_VLLM_RELEASE_REPO}:{new_version}-{image[len(prefix) :]}"
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
        label = _source_label(path, catalog["release_version"])
        for repo, devices in catalog["model_specs"].items():
            for device, engines in devices.items():
                for impls in engines.values():
                    for spec in impls.values():
                        _check_spec_shape(spec, label, repo, device)
        released = parse_version_tuple(catalog["release_version"])
        catalog["legacy_layout"] = released is not None and released < MIN_CURRENT_INTERFACE_VERSION
    elif _is_flat(data):
        label = _source_label(path, release_version)
        for model_id, spec in data.items():
            _check_spec_shape(spec, label, model_id)
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


def _read_version_file(checkout: str) -> str | None:
    try:
        with opened_dir(checkout) as dirfd:
            raw = read_bytes(dirfd, "VERSION", _VERSION_FILE_LIMIT)
    except (OSError, SafeFileError):
        return None
    return (raw or b"").decode("utf-8", "replace").strip() or None


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _one_line(value: object, limit: int = 400) -> str:
    """``value`` as one line of at most ``limit`` characters, for messages built from another program's output."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_failure(info: Mapping[str, Any], interpreter: str, checkout: str) -> CodeImportError:
    """CodeImportError for the ``error`` document of _EXPORT_PROGRAM: the cause, in words, and its fix."""
    version = tuple(part for part in info.get("python") or () if isinstance(part, int))
    with_python = f"{interpreter} (Python {'.'.join(str(part) for part in version) or 'of unknown version'})"
    kind = info.get("kind")
    if kind == "elsewhere":
        return CodeImportError(
            f"{interpreter} imported workflows.model_spec from {_one_line(info.get('where'))}, not from {checkout}",
            CAUSE_CODE,
            "Remove the other 'workflows' package from that interpreter's path (PYTHONPATH, site-packages).",
        )
    if kind == "env":
        return CodeImportError(
            f"workflows.model_spec of {checkout} loaded the {_one_line(info.get('active') or 'only')} catalog, "
            "not the one MODEL_SPECS_ENV asked for",
            CAUSE_ENV,
        )
    name = _one_line(info.get("type") or "error")
    message = _one_line(info.get("message") or "")
    # The cast states what the isinstance test just checked (a call's result is not narrowed).
    module = cast(str, info.get("module")) if isinstance(info.get("module"), str) else ""
    error = f"{name}: {message}" if message else name
    where = f" at {_one_line(info['where'])}" if info.get("where") else ""
    if name in ("ModuleNotFoundError", "ImportError") and module.split(".")[0] == "yaml":
        return CodeImportError(
            f"{with_python} has no PyYAML, which workflows.model_spec imports ({error})", CAUSE_PYYAML, _PYTHON_HINT
        )
    if version and version < _MIN_PYTHON:
        return CodeImportError(
            f"workflows.model_spec does not import with {with_python}, older than the Python 3.10 that "
            f"tt-inference-server needs ({error}{where})",
            CAUSE_PYTHON,
            _PYTHON_HINT,
        )
    if "Repository root not found" in message:
        return CodeImportError(
            f"workflows.model_spec refused to import: {message} (no .git in {checkout} or above it){where}",
            CAUSE_REPO_ROOT,
            "This release's workflows.utils.get_repo_root_path() did not accept the .git marker that the loader "
            "stands in for in a release without one; install the release from git (inference_server_source git or "
            "bundle) so that it has its .git.",
        )
    if name == "ModuleNotFoundError" and module and module.split(".")[0] != "workflows":
        return CodeImportError(
            f"{with_python} lacks the module {module!r} that workflows.model_spec imports ({error})",
            CAUSE_MODULE,
            _PYTHON_HINT,
        )
    return CodeImportError(
        f"workflows.model_spec of {checkout} failed to import with {with_python}: {error}{where}", CAUSE_CODE
    )


def export_from_checkout(
    checkout: str,
    python: str | None = None,
    timeout: float = _IMPORT_TIMEOUT,
    model_specs_env: str = DEFAULT_MODEL_SPECS_ENV,
) -> JSON:
    """Import the checkout's ``workflows.model_spec`` with ``python`` and return its catalog.

    ``model_specs_env`` is passed as MODEL_SPECS_ENV, which TTIS v0.16.0 and later read at import time to load
    ``workflows/model_specs/<env>/``. A checkout without ``.git`` (a release unpacked from an archive) is imported
    as if it had one, see _EXPORT_PROGRAM. Raises CodeImportError naming the cause (missing PyYAML, Python too old,
    an error in the code, ...) so that the caller can fall back to the exported files and say why.
    """
    if model_specs_env not in MODEL_SPECS_ENVS:
        raise SpecError(f"model_specs_env must be one of {', '.join(MODEL_SPECS_ENVS)}, got {model_specs_env!r}.")
    interpreter = python or sys.executable
    env = dict(os.environ)
    env["MODEL_SPECS_ENV"] = model_specs_env
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("OVERRIDE_BENCHMARK_TARGETS", None)
    try:
        # Accepted bandit B603: a fixed program of ours on a root-owned release checkout.
        proc = subprocess.run(  # nosec B603
            [interpreter, "-B", "-c", _EXPORT_PROGRAM, checkout, model_specs_env],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise CodeImportError(
            f"cannot run {interpreter}: {exc.strerror or exc}", CAUSE_INTERPRETER, _PYTHON_HINT
        ) from None
    except subprocess.TimeoutExpired:
        raise CodeImportError(
            f"{interpreter} did not finish importing workflows.model_spec within {timeout}s", CAUSE_TIMEOUT
        ) from None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    if proc.returncode != 0:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raise _import_failure(data["error"], interpreter, checkout)
        raise CodeImportError(
            f"{interpreter} could not import workflows.model_spec (exit status {proc.returncode}): "
            f"{_one_line(_last_line(proc.stderr))}",
            CAUSE_OUTPUT,
            f"Check that {interpreter} is a Python 3 interpreter.",
        )
    if not isinstance(data, dict) or "model_specs" not in data:
        raise CodeImportError(
            f"{interpreter} printed no readable catalog: {_one_line(_last_line(proc.stdout))}", CAUSE_OUTPUT
        )
    catalog = catalog_from_data(data, SOURCE_CHECKOUT_CODE, path=os.path.join(checkout, "workflows", "model_spec.py"))
    catalog["python"] = interpreter
    catalog["checkout"] = checkout
    return catalog


def release_python(checkout: str) -> str | None:
    """Interpreter of the venv the inference_server role made for a release checkout, else None.

    The role installs ``<root>/releases/<tag>`` with its venv in ``<root>/venvs/<tag>``; the checkout
    is recognised by its real path (through ``<root>/current`` too).
    """
    real = os.path.realpath(checkout)
    releases = os.path.dirname(real)
    if os.path.basename(releases) != "releases":
        return None
    candidate = os.path.join(os.path.dirname(releases), "venvs", os.path.basename(real), "bin", "python")
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


def default_checkout(tt_inference_server_dir: str | None = None, spec_file: str | None = None) -> str | None:
    """The checkout to read: the one given, none with a spec file, else the role's current release."""
    if tt_inference_server_dir or spec_file:
        return tt_inference_server_dir
    default = DEFAULT_CHECKOUT
    if not os.path.isdir(default):
        raise SpecError(
            f"Neither tt_inference_server_dir nor spec_file is set, and {default} (the current release that the "
            "ttfleet.inference.inference_server role installs) does not exist. Install a release with that role, "
            "or set tt_inference_server_dir or spec_file."
        )
    return default


def _dev_catalog(checkout: str, has_code: bool, python: str | None, timeout: float) -> JSON:
    """The dev catalog of a checkout (TTIS v0.16.0 and later), from its code only: the exports hold the prod one."""
    release = _read_version_file(checkout)
    label = f"{checkout} (tt-inference-server {release})" if release else checkout
    if not has_code or not os.path.isdir(os.path.join(checkout, "workflows", "model_specs", "dev")):
        raise SpecError(
            f"model_specs_env is dev, but {label} has no dev catalog (no workflows/model_specs/dev/). "
            "tt-inference-server has one since v0.16.0, where run.py --dev-mode selects it with MODEL_SPECS_ENV=dev; "
            "before v0.16.0 --dev-mode kept the one catalog and only ran -dev- images. Set model_specs_env to prod, "
            "or use release v0.16.0 or later."
        )
    try:
        return export_from_checkout(checkout, python=python, timeout=timeout, model_specs_env="dev")
    except CodeImportError as exc:
        hint = f" {exc.hint}" if exc.hint else ""
        raise SpecError(
            f"model_specs_env is dev, but the code of {label} could not be imported: {exc}.{hint} There is no "
            "fallback: release_model_spec.json holds the prod catalog only."
        ) from None


def load_checkout(
    checkout: str,
    python: str | None = None,
    timeout: float = _IMPORT_TIMEOUT,
    model_specs_env: str = DEFAULT_MODEL_SPECS_ENV,
) -> JSON:
    """Catalog of a TTIS checkout: its own code first, then its exported JSON files.

    Order: import ``workflows.model_spec`` (needs Python >= 3.10 and PyYAML in ``python``, by default
    the release's own venv when the inference_server role made one, see ``release_python``), then
    ``release_model_spec.json`` (v0.11+), then the flat ``model_specs_output.json`` (< v0.11).
    The catalog's ``source`` names the one used and ``warnings`` say why earlier ones were skipped;
    ``import_error`` holds the cause and reason when the code could not be imported.

    ``model_specs_env`` dev reads upstream's dev catalog (``workflows/model_specs/dev/``, v0.16.0 and later) as
    ``run.py --dev-mode`` does; it comes from the code only and there is no fallback.
    """
    checkout = os.path.abspath(checkout)
    if not os.path.isdir(checkout):
        raise SpecError(
            f"tt_inference_server_dir {checkout} is not a directory. Clone a release tag of "
            "https://github.com/tenstorrent/tt-inference-server there, or pass spec_file instead."
        )
    if model_specs_env not in MODEL_SPECS_ENVS:
        raise SpecError(f"model_specs_env must be one of {', '.join(MODEL_SPECS_ENVS)}, got {model_specs_env!r}.")
    has_code = os.path.isfile(os.path.join(checkout, "workflows", "model_spec.py"))
    python = python or release_python(checkout)
    if model_specs_env == "dev":
        return _dev_catalog(checkout, has_code, python, timeout)
    reasons: list[str] = []
    failure: CodeImportError | None = None
    if has_code:
        try:
            return export_from_checkout(checkout, python=python, timeout=timeout)
        except CodeImportError as exc:
            failure = exc
            reasons.append(str(exc))
    else:
        reasons.append("it has no workflows/model_spec.py")
    release_version = _read_version_file(checkout)
    for name, source in ((SOURCE_RELEASE_FILE, SOURCE_RELEASE_FILE), (SOURCE_LEGACY_FILE, SOURCE_LEGACY_FILE)):
        path = os.path.join(checkout, name)
        if not os.path.isfile(path):
            reasons.append(f"no {name}")
            continue
        catalog = load_spec_file(path, source=source, release_version=release_version)
        catalog["model_specs_env"] = DEFAULT_MODEL_SPECS_ENV
        if failure is not None:
            catalog["import_error"] = {"cause": failure.cause, "reason": str(failure)}
        hint = f" {failure.hint}" if failure is not None and failure.hint else ""
        catalog["warnings"].append(
            f"Read {path} instead of the code of {checkout}: {'; '.join(reasons)}.{hint} That export disagrees with "
            "the code in some tt-inference-server releases (v0.10.1, v0.11.1 to v0.15.0: volume versions, images, env "
            "vars, missing models)."
        )
        return catalog
    raise SpecError(
        f"{checkout} does not look like a tt-inference-server checkout ({'; '.join(reasons)}). "
        "Point tt_inference_server_dir at the root of a clone of a release tag, or pass spec_file."
    )


def load_catalog(
    tt_inference_server_dir: str | None = None,
    spec_file: str | None = None,
    python: str | None = None,
    model_specs_env: str = DEFAULT_MODEL_SPECS_ENV,
) -> JSON:
    """Catalog from exactly one of a checkout directory or a spec file."""
    if bool(tt_inference_server_dir) == bool(spec_file):
        raise SpecError("Give exactly one of tt_inference_server_dir or spec_file.")
    if spec_file:
        if model_specs_env != DEFAULT_MODEL_SPECS_ENV:
            raise SpecError(
                f"model_specs_env is {model_specs_env}, which selects a catalog of a tt-inference-server checkout, but "
                f"spec_file {spec_file} is an export, one catalog already. Set tt_inference_server_dir instead, or "
                "leave model_specs_env at prod to read the file as it is (scripts/release/export_model_spec.py --env "
                "dev exports the dev catalog)."
            )
        catalog = load_spec_file(spec_file)
        catalog["model_specs_env"] = None
        return catalog
    # Exactly one of the two is set and spec_file is not: tt_inference_server_dir is the checkout's path.
    return load_checkout(cast(str, tt_inference_server_dir), python=python, model_specs_env=model_specs_env)


# ---------------------------------------------------------------------------------------------
# Selection


def load_params_catalog(params: Mapping[str, Any], checkout: str | None) -> JSON:
    """``load_catalog`` of a module's spec source options (SPEC_SOURCE_OPTIONS): ``checkout``, or their spec_file."""
    return load_catalog(
        tt_inference_server_dir=checkout,
        spec_file=params["spec_file"],
        python=params["python"],
        model_specs_env=params["model_specs_env"],
    )


def _ensure_catalog(specs: object) -> JSON:
    if isinstance(specs, dict) and "source" in specs and "model_specs" in specs:
        return specs
    return catalog_from_data(specs, SOURCE_SPEC_FILE)


def iter_specs(catalog: Mapping[str, Any]) -> Iterator[JSON]:
    """Every spec of a catalog, in export order."""
    for devices in catalog["model_specs"].values():
        for engines in devices.values():
            for impls in engines.values():
                yield from impls.values()


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
    catalog = _ensure_catalog(catalog)
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


def _volume_root(volume_root: object) -> str | None:
    if not volume_root:
        return None
    if not isinstance(volume_root, str) or _CONTROL_CHARS.search(volume_root):
        raise SpecError(f"volume_root {volume_root!r} must be an absolute path without control characters.")
    root = os.path.expanduser(volume_root)
    if not posixpath.isabs(root):
        raise SpecError(f"volume_root {volume_root!r} must be an absolute path (for example /opt/tt-cache).")
    return posixpath.normpath(root)


def spec_mesh(spec: Mapping[str, Any], catalog: Mapping[str, Any] | None = None) -> str:
    """Tensor cache leaf of a spec: the data-parallel subdevice's mesh first, else the device's."""
    device_mesh = (catalog or {}).get("device_mesh")
    return mesh_name(spec.get("subdevice_type") or spec["device_type"], device_mesh)


def derive(spec: Mapping[str, Any], catalog: Mapping[str, Any] | None = None, volume_root: str | None = None) -> JSON:
    """Everything a playbook needs about one spec: names, paths, image, requirements."""
    catalog = catalog or {}
    source = _source_label(catalog.get("path"), catalog.get("release_version"))
    _check_spec_shape(spec, source)
    where = f"{source}: the spec of {_show(spec['model_name'])} on {_show(spec['device_type'])}"
    # Every value below reaches a path, a docker argument or a --mount value (container_command).
    model_name = _check_component(spec["model_name"], "model_name", where, mount=True)
    impl_id = _check_component(spec["impl"]["impl_id"], "impl.impl_id", where, mount=True)
    version = spec.get("version")
    if version in (None, ""):
        raise SpecError(
            f"{where} pins no version, so its volume name is undefined. Dev specs of tt-inference-server v0.17.0 and "
            "later pin neither a version nor an image: as run.py --dev-mode needs --override-docker-image, give the "
            "image to run (option image, tt_models[].image); the version its tag starts with names the volume. "
            "Otherwise use the prod catalog."
        )
    version = _check_component(str(version), "version", where, mount=True)
    try:
        mesh = spec_mesh(spec, catalog)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    ours = spec.get("ttfleet") or {}
    if ours.get("cache_variant"):
        # A profile that compiles other programs keeps its kernel cache beside the spec's own.
        mesh = f"{mesh}-{ours['cache_variant']}"
    mesh = _check_component(mesh, "mesh", where)
    _check_argument(spec["hf_model_repo"], "hf_model_repo", where, allow_org=True)
    for key in ("hf_weights_repo", "docker_image"):
        if spec.get(key) is not None:
            _check_argument(spec[key], key, where, allow_org=key == "hf_weights_repo")
    if spec["impl"].get("impl_name") is not None:
        _check_argument(spec["impl"]["impl_name"], "impl.impl_name", where)
    _check_env(spec.get("env_vars"), "env_vars", where)
    _check_env((spec.get("device_model_spec") or {}).get("env_vars"), "device_model_spec.env_vars", where)
    dms = spec.get("device_model_spec") or {}
    engine = spec.get("inference_engine") or "vLLM"
    image_version = parse_image_version(spec.get("docker_image"))
    root = _volume_root(volume_root)
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


def check_image(value: object) -> str:
    """``value`` if it is one Docker image reference argument, else SpecError naming option image."""
    if not isinstance(value, str) or not value or value.startswith("-") or re.search(r"[\s\x00-\x1f\x7f]", value):
        raise SpecError(
            f"image {value!r} is not a Docker image reference; give repository:tag, for example "
            f"{_VLLM_RELEASE_REPO}:0.20.0-de59f8a-03fa3af."
        )
    return value


_CI_IMAGE_TAG = re.compile(r"^([0-9.]+)-([0-9a-fA-F]{40})-([0-9a-fA-F]{7})-(\d+)$")


def image_commits(image: object) -> tuple[str | None, str | None]:
    """``(tt_metal_commit, vllm_commit)`` named by an image tag, as TTIS's parse_commits_from_docker_image reads them.

    Only the CI tag ``<version>-<tt-metal commit, 40 hex>-<7 hex>-<timestamp>`` names them; the third part of a
    media server image is not a vLLM commit. Any other tag gives ``(None, None)``.
    """
    if not isinstance(image, str) or ":" not in image:
        return None, None
    name, tag = image.rsplit(":", 1)
    match = _CI_IMAGE_TAG.match(tag)
    if not match:
        return None, None
    return match.group(2), None if "tt-media-inference-server" in name else match.group(3)


def override_image(spec: Mapping[str, Any], image: str | None) -> Mapping[str, Any]:
    """The spec as ``run.py --override-docker-image IMAGE`` makes it (``ModelSpec.apply_overrides``).

    The image replaces the spec's, with the commits its tag names; the version its tag starts with replaces the
    spec's (it names the host volume), while ``:dev`` or ``:latest`` keep the spec's.
    """
    if image is None:
        return spec
    check_image(image)
    spec = dict(spec)
    spec["docker_image"] = image
    spec["tt_metal_commit"], spec["vllm_commit"] = image_commits(image)
    parsed = parse_image_version(image)
    if parsed is not None:
        spec["version"] = ".".join(str(part) for part in parsed)
    return spec


def resolve_params(specs: Mapping[str, Any], params: Mapping[str, Any], volume_root: str | None = None) -> JSON:
    """``resolve`` for a module's ``model``, ``device``, ``impl``, ``engine`` and ``image`` options."""
    entry = {"name": params["model"], "impl": params["impl"], "engine": params["engine"], "image": params.get("image")}
    return resolve_entry(specs, entry, params["device"], volume_root=volume_root)


def entry_tuning(entry: Mapping[str, Any]) -> JSON:
    """The checked tuning of a ``tt_models`` entry (see _overrides.check_tuning); SpecError when it is bad."""
    try:
        return check_tuning(f"tt_models entry {entry.get('name')}", entry)
    except TuningError as exc:
        raise SpecError(str(exc)) from None


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
            raise SpecError(str(exc)) from None
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
        catalog = _ensure_catalog(specs)
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


def resolve_entry(
    specs: Mapping[str, Any], entry: Mapping[str, Any], device: str, volume_root: str | None = None
) -> JSON:
    """``resolve`` for a ``tt_models`` entry on ``device``: select_entry, then derive."""
    _volume_root(volume_root)
    spec, catalog = select_entry(specs, entry, device)
    return derive(spec, catalog, volume_root=volume_root)


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
    _volume_root(volume_root)


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
    catalog = _ensure_catalog(specs)
    spec = select_spec(catalog, model, device, impl=impl, engine=engine)
    return derive(override_image(spec, image), catalog, volume_root=volume_root)


def list_models(specs: Mapping[str, Any], device: str | None = None, model: str | None = None) -> list[JSON]:
    """Every spec servable on ``device`` (all devices when None), optionally for one model."""
    validate_inputs(model=model or None, device=device or None)
    catalog = _ensure_catalog(specs)
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
