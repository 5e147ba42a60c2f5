# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""plugins/module_utils is packages by subject whose imports point one way: a module imports only from its own package
and from lower layers, and no module sits flat beside the packages (issue 32, docs/architecture.md).

Every import is read from the source (ast), those inside functions and under ``TYPE_CHECKING`` too: a lazy import
that points up is the same cycle waiting to happen.
"""

from __future__ import annotations

import ast
import pathlib
import shutil

MODULE_UTILS = pathlib.Path(__file__).resolve().parents[4] / "plugins" / "module_utils"
PREFIX = "ansible_collections.ttfleet.inference.plugins.module_utils"

# Lowest first. Packages on one line are peers: neither imports the other. _host sits above _ttis: the tt-smi facts
# name the device by the device table, which is tt-inference-server's rule and has its one home in _ttis.
LAYERS = (
    ("_base",),
    ("_fs",),
    ("_net",),
    ("_ttis",),
    ("_host",),
    ("_volumes", "_images"),
    ("_kernels", "_weights"),
    ("_peer", "_plan"),
)
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def _imported_packages(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every module_utils import in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from <PREFIX> import _x`` names the packages themselves.
            names = [f"{node.module}.{alias.name}" for alias in node.names] if node.module == PREFIX else [node.module]
        else:
            continue
        for name in names:
            if name.startswith(PREFIX + "."):
                found.append((node.lineno, name[len(PREFIX) + 1 :].split(".")[0]))
    return found


def layering_problems(root: pathlib.Path) -> list[str]:
    """What breaks the layering under ``root`` (a module_utils tree), one line each; empty when nothing does."""
    problems = []
    for path in sorted(root.iterdir()):
        if path.is_file() and path.suffix == ".py" and path.name != "__init__.py":
            problems.append(f"{path.name} sits flat in module_utils: move it into the package of its subject")
        elif path.is_dir() and path.name not in RANK and any(path.rglob("*.py")):
            problems.append(f"{path.name}/ is in no layer: add it to LAYERS here and in docs/architecture.md")
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        own = relative.parts[0] if len(relative.parts) > 1 else None
        if own not in RANK:
            continue
        for line, package in _imported_packages(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if package == own:
                continue
            if package not in RANK:
                problems.append(f"{relative}:{line} imports {package}, which is in no layer")
            elif RANK[package] >= RANK[own]:
                where = f"a peer of {own} in its layer" if RANK[package] == RANK[own] else f"a layer above {own}"
                problems.append(f"{relative}:{line} imports {package}, {where}: move the shared piece down")
    return problems


def test_packages_import_only_their_own_and_lower_layers():
    assert layering_problems(MODULE_UTILS) == []


def test_every_package_has_a_layer_and_none_is_named_twice():
    names = [package for packages in LAYERS for package in packages]
    assert len(names) == len(set(names))
    on_disk = {path.name for path in MODULE_UTILS.iterdir() if path.is_dir() and any(path.rglob("*.py"))}
    assert on_disk <= set(names), f"packages without a layer: {sorted(on_disk - set(names))}"


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "module_utils"
    shutil.copytree(MODULE_UTILS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _planted(tmp_path: pathlib.Path, plant) -> set[str]:
    """The problems that ``plant(copy)`` adds to a copy of the tree."""
    copy = _copy(tmp_path)
    before = set(layering_problems(copy))
    plant(copy)
    return set(layering_problems(copy)) - before


def test_an_upward_import_is_found_even_inside_a_function(tmp_path):
    text = (MODULE_UTILS / "_base" / "errors.py").read_text()
    late = f"\n\ndef _late():\n    from {PREFIX}._plan.anything import thing\n"
    line = text.count("\n") + late.count("\n")

    def plant(copy):
        (copy / "_base" / "errors.py").write_text(text + late)

    assert _planted(tmp_path, plant) == {
        f"_base/errors.py:{line} imports _plan, a layer above _base: move the shared piece down"
    }


def test_a_peer_import_and_a_package_named_in_the_from_clause_are_found(tmp_path):
    def plant(copy):
        (copy / "_peer").mkdir(exist_ok=True)
        (copy / "_peer" / "planted.py").write_text(f"from {PREFIX} import _plan\nimport {PREFIX}._fs.anything\n")

    assert _planted(tmp_path, plant) == {
        "_peer/planted.py:1 imports _plan, a peer of _peer in its layer: move the shared piece down"
    }


def test_a_flat_module_and_a_package_without_a_layer_are_found(tmp_path):
    copy = _copy(tmp_path)
    (copy / "_flat.py").write_text("X = 1\n")
    (copy / "_new").mkdir()
    (copy / "_new" / "thing.py").write_text("X = 1\n")
    (copy / "__init__.py").write_text("")
    problems = layering_problems(copy)
    assert "_flat.py sits flat in module_utils: move it into the package of its subject" in problems
    assert "_new/ is in no layer: add it to LAYERS here and in docs/architecture.md" in problems
    assert not any(problem.startswith("__init__.py") for problem in problems)
