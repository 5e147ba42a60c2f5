# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""One home per rule (STYLE.md rule 23): the naming rules live in _ttis/names.py and the device table in
_ttis/devices.py; nothing else in plugins/ writes them again.

The scan reads the syntax tree of every Python file under plugins/ (docstrings and the modules' DOCUMENTATION,
EXAMPLES and RETURN are prose and do not count) and reports:
- a function named like one of the rules (volume_name, container_name, mesh_name, ...);
- any other string holding ``volume_id_``, ``tt_metal_cache/``, ``tt-serve@`` or the container's
  ``/home/container_app_user``;
- an f-string that builds ``tt_metal_cache/cache_<model>``, ``weights/<model>`` or ``tt-<model>...``;
- an ``os.path.join``/``posixpath.join`` that builds a path below ``weights`` or ``tt_metal_cache``;
- a dict, set, list or tuple literal naming three or more devices or board types: a device table.
"""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import BOARDS, DEVICES

# tests/unit/plugins/module_utils/_ttis/<this file>: six levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
NAMES_HOME = "plugins/module_utils/_ttis/names.py"
DEVICES_HOME = "plugins/module_utils/_ttis/devices.py"
RULE_FUNCTIONS = frozenset(
    {
        "volume_name",
        "named_volume",
        "parse_volume_name",
        "match_volume_name",
        "split_suffix",
        "moved_aside_name",
        "weights_subdir",
        "tensor_cache_parent",
        "tt_metal_cache_subdir",
        "container_path",
        "container_tt_cache_path",
        "sanitise_name",
        "container_name",
        "default_name",
        "mesh_name",
        "serve_unit",
    }
)
NAME_MARKERS = ("volume_id_", "/home/container_app_user", "tt_metal_cache/", "tt-serve@")
DEVICE_WORDS = frozenset(name.lower() for name in DEVICES) | frozenset(BOARDS)
DOC_ASSIGNMENTS = ("DOCUMENTATION", "EXAMPLES", "RETURN")
JOINS = ("os.path.join", "posixpath.join")
LAYOUT_DIRS = ("weights", "tt_metal_cache")


def _prose(tree: ast.Module) -> set[int]:
    """ids of the string nodes that are documentation."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id in DOC_ASSIGNMENTS for target in node.targets
        ):
            ids.add(id(node.value))
    return ids


def _strings(node: ast.AST) -> list[str]:
    return [sub.value for sub in ast.walk(node) if isinstance(sub, ast.Constant) and isinstance(sub.value, str)]


def _device_words(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        parts: list[ast.AST] = [key for key in node.keys if key is not None] + list(node.values)
    else:
        parts = list(getattr(node, "elts", ()))
    return {text.lower() for part in parts for text in _strings(part) if text.lower() in DEVICE_WORDS}


def _fstring_findings(node: ast.JoinedStr) -> list[str]:
    found = []
    values = node.values
    for index, part in enumerate(values):
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            continue
        followed = index + 1 < len(values) and isinstance(values[index + 1], ast.FormattedValue)
        if followed and part.value.endswith("cache_"):
            found.append("builds the tensor cache directory cache_<model>: use names.tensor_cache_parent")
        if followed and part.value.endswith("weights/"):
            found.append("builds weights/<model>: use names.weights_subdir")
        if followed and index == 0 and part.value == "tt-":
            found.append("builds a container name tt-<...>: use names.container_name")
    return found


def scan_file(path: str, rel: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), filename=rel)
    prose = _prose(tree)
    found: list[tuple[int, str]] = []
    in_names, in_devices = rel == NAMES_HOME, rel == DEVICES_HOME
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in RULE_FUNCTIONS:
            if not (in_names or in_devices):
                found.append((line, f"defines {node.name}(): import it from _ttis instead"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            for marker in NAME_MARKERS:
                if marker in node.value and not in_names:
                    found.append((line, f"writes {marker!r}: use _ttis/names.py"))
        elif isinstance(node, ast.JoinedStr) and not in_names:
            found.extend((line, what) for what in _fstring_findings(node))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in JOINS and not in_names:
            for arg in node.args[:-1]:
                if isinstance(arg, ast.Constant) and arg.value in LAYOUT_DIRS:
                    found.append((line, f"joins a path below {arg.value}/: use _ttis/names.py"))
        elif isinstance(node, (ast.Dict, ast.Set, ast.List, ast.Tuple)) and not in_devices:
            words = _device_words(node)
            if len(words) >= 3:
                found.append((line, f"lists devices or boards ({', '.join(sorted(words))}): use _ttis/devices.py"))
    return [f"{rel}:{line}: {what}" for line, what in sorted(set(found))]


def scan_tree(root: str) -> tuple[int, list[str]]:
    """``(files read, findings)`` for the Python files under ``root``/plugins."""
    findings, count = [], 0
    for directory, dirs, files in os.walk(os.path.join(root, "plugins")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                findings += scan_file(path, os.path.relpath(path, root).replace(os.sep, "/"))
                count += 1
    return count, findings


def test_every_rule_has_one_home():
    count, findings = scan_tree(ROOT)
    assert count > 50, f"read only {count} files under {ROOT}/plugins"
    assert findings == []


def test_the_homes_exist_and_define_the_rules():
    defined = set()
    for rel in (NAMES_HOME, DEVICES_HOME):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        defined |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert RULE_FUNCTIONS - {"default_name"} <= defined


# The scan itself, on stray definitions of each kind: each must be reported.
STRAYS = {
    "function": """
        def volume_name(impl_id, model_name, version):
            return impl_id + model_name + version
    """,
    "prefix": """
        PREFIX = "volume_id_"
    """,
    "fstring": """
        def name(impl_id, model, version):
            return f"volume_id_{impl_id}-{model}-v{version}"
    """,
    "format": """
        NAME = "volume_id_{}-{}".format("tt_transformers", "Qwen3-32B")
    """,
    "cache": """
        import os
        def cache(volume, model):
            return os.path.join(volume, "tt_metal_cache", f"cache_{model}")
    """,
    "cache_text": """
        def cache(model, mesh):
            return "tt_metal_cache/cache_" + model + "/" + mesh
    """,
    "weights": """
        def weights(model):
            return f"weights/{model}"
    """,
    "weights_join": """
        import posixpath
        def weights(volume, model):
            return posixpath.join(volume, "weights", model)
    """,
    "container": """
        def name(model, device):
            return f"tt-{model}-{device}".lower()
    """,
    "container_home": """
        HOME = "/home/container_app_user/cache_root"
    """,
    "mesh_table": """
        MESH = {"N150": "N150", "N300": "N300", "T3K": "T3K"}
    """,
    "device_set": """
        def eth(device):
            return device in ("N300", "T3K", "GALAXY_T3K")
    """,
    "board_table": """
        BOARDS = {(("n300", 1),): "n300", (("n150", 4),): "n150x4", (("p150", 1),): "p150"}
    """,
}
CLEAN = '''
    """Docstrings may say volume_id_<impl_id>-<model_name>-v<version> and tt_metal_cache/cache_<model>/<mesh>."""
    import os

    DOCUMENTATION = "volume_id_x and /home/container_app_user, n150, n300, t3k"

    def layout(volume):
        return os.path.join(volume, "weights"), ("tt_metal_cache", "logs"), ["n150", "n300"]
'''


def _write(tmp_path, text):
    target = tmp_path / "plugins" / "module_utils" / "_stray.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text), encoding="utf-8")


@pytest.mark.parametrize("kind", sorted(STRAYS))
def test_the_scan_reports_a_stray_definition(tmp_path, kind):
    _write(tmp_path, STRAYS[kind])
    _count, findings = scan_tree(str(tmp_path))
    assert findings, f"the scan missed a stray {kind}"
    assert all(finding.startswith("plugins/module_utils/_stray.py:") for finding in findings)


def test_the_scan_leaves_prose_and_layout_alone(tmp_path):
    _write(tmp_path, CLEAN)
    assert scan_tree(str(tmp_path)) == (1, [])
