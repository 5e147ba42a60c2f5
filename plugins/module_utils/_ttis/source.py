# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The spec source of a module (doc fragment spec_source): a checkout (by default the current release) or a file."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import load_spec_file
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.checkout import (
    DEFAULT_MODEL_SPECS_ENV,
    MODEL_SPECS_ENVS,
    load_checkout,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

# The release the ttfleet.inference.inference_server role made current: <root>/current links to
# <root>/releases/<tag>, whose venv (Python >= 3.10 with PyYAML) is <root>/venvs/<tag>. The root is the default of
# tt_release_root (roles/fleet_defaults); the modules' defaults follow it from here.
DEFAULT_RELEASE_ROOT = "/opt/tt-inference-server"
DEFAULT_CHECKOUT = DEFAULT_RELEASE_ROOT + "/current"


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
