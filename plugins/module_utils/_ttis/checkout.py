# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The catalog of a tt-inference-server checkout: its own code imported by its interpreter, else its exports."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import export_program
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import (
    SOURCE_CHECKOUT_CODE,
    SOURCE_LEGACY_FILE,
    SOURCE_RELEASE_FILE,
    catalog_from_data,
    load_spec_file,
    read_version_file,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

_IMPORT_TIMEOUT = 120


# The program that imports the checkout's catalog (export_program.py), run as ``python -B -c SOURCE CHECKOUT ENV``.
# Its source comes through the module's loader, so it reaches a managed host inside an Ansible module's payload.
_EXPORT_PROGRAM = inspect.getsource(export_program)


# Catalogs of workflows/model_specs/<env>/ (TTIS v0.16.0 and later), as MODEL_SPECS_ENV names them. run.py --dev-mode
# sets MODEL_SPECS_ENV=dev before it imports workflows.model_spec; without it the catalog is prod.
MODEL_SPECS_ENVS = ("prod", "dev")
DEFAULT_MODEL_SPECS_ENV = "prod"


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


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _one_line(value: object, limit: int = 400) -> str:
    """``value`` as one line of at most ``limit`` characters, for messages built from another program's output."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_failure(info: Mapping[str, Any], interpreter: str, checkout: str) -> CodeImportError:
    """CodeImportError for the ``error`` document of export_program.py: the cause, in words, and its fix."""
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
    as if it had one, see export_program.py. Raises CodeImportError naming the cause (missing PyYAML, Python too old,
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
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise CodeImportError(
            f"{interpreter} did not finish importing workflows.model_spec within {timeout}s", CAUSE_TIMEOUT
        ) from exc
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


def _dev_catalog(checkout: str, has_code: bool, python: str | None, timeout: float) -> JSON:
    """The dev catalog of a checkout (TTIS v0.16.0 and later), from its code only: the exports hold the prod one."""
    release = read_version_file(checkout)
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
        ) from exc


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
    release_version = read_version_file(checkout)
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
