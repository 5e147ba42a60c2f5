# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""plugins/module_utils/_base/errors.py: every error class of module_utils derives from FleetError, so that one
adapter (``_base.module.fail_on``) reports each of them with its message (STYLE rule 24)."""

from __future__ import annotations

import importlib
import inspect
import pathlib

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

MODULE_UTILS = pathlib.Path(__file__).resolve().parents[5] / "plugins" / "module_utils"
PREFIX = "ansible_collections.ttfleet.inference.plugins.module_utils"
# Raised and caught inside one subject, never shown to an operator: a peer request answered with a bare status.
INTERNAL = {f"{PREFIX}._peer.errors.Refused"}
# Where callers catch the standard class too (``except ValueError``, ``except OSError``), the error keeps it as a base.
STANDARD_BASES = {
    "SpecifierError": ValueError,
    "ServeError": ValueError,
    "TuningError": ValueError,
    "ProfileError": ValueError,
}


def _error_classes() -> dict[str, type[BaseException]]:
    found = {}
    for path in sorted(MODULE_UTILS.rglob("*.py")):
        parts = path.relative_to(MODULE_UTILS).with_suffix("").parts
        name = ".".join((PREFIX, *(parts[:-1] if parts[-1] == "__init__" else parts)))
        module = importlib.import_module(name)
        for _attr, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_error_class_derives_from_fleet_error():
    classes = _error_classes()
    assert len(classes) >= 17, sorted(classes)
    stray = sorted(name for name, cls in classes.items() if not issubclass(cls, FleetError) and name not in INTERNAL)
    assert stray == []


def test_errors_that_callers_catch_as_standard_errors_still_are_those():
    by_name = {name.rsplit(".", 1)[-1]: cls for name, cls in _error_classes().items()}
    for name, base in STANDARD_BASES.items():
        assert issubclass(by_name[name], base), name
    assert issubclass(by_name["ProxyError"], OSError)


def test_the_message_is_the_text_given():
    assert str(FleetError("volume_root /x is a link; point it at a directory")) == (
        "volume_root /x is a link; point it at a directory"
    )
