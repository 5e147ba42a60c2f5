# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The _ttis package's place in the layers: it imports only the layers below it, and the checkout-import program
(export_program.py) is a real file that needs nothing but the standard library of any Python 3."""

from __future__ import annotations

import ast
import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import checkout, export_program

# tests/unit/plugins/module_utils/_ttis/<this file>: six levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
PACKAGE = os.path.join(ROOT, "plugins", "module_utils", "_ttis")
PREFIX = "ansible_collections.ttfleet.inference.plugins.module_utils."
# Layers below _ttis (docs/architecture.md): the base errors, the safe-file layer, the network layer; and itself.
ALLOWED = frozenset({"_base", "_fs", "_net", "_ttis"})
FILES = sorted(name for name in os.listdir(PACKAGE) if name.endswith(".py"))


def _imports(name: str) -> list[str]:
    with open(os.path.join(PACKAGE, name), encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), name)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("name", FILES)
def test_ttis_imports_only_lower_layers(name):
    upward = sorted(
        {
            module
            for module in _imports(name)
            if module.startswith(PREFIX) and module[len(PREFIX) :].split(".")[0] not in ALLOWED
        }
    )
    assert upward == [], f"_ttis/{name} imports {upward}: _ttis may import only {sorted(ALLOWED)}"


def test_the_export_program_is_the_file_and_needs_only_the_standard_library():
    path = os.path.join(PACKAGE, "export_program.py")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    # What runs in the checkout's interpreter is exactly this file (through its loader, as from a module payload).
    assert source == checkout._EXPORT_PROGRAM
    tree = ast.parse(source)
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)], "no f-strings: any Python 3"
    assert not [m for m in _imports("export_program.py") if m.startswith("ansible") or m == "__future__"]
    # Importing it runs nothing: the program starts only as __main__.
    assert callable(export_program.main)
