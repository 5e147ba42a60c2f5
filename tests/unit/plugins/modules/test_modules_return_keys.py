"""No module returns a key that Ansible reads as the task's own status.

A module result with a true ``skipped`` shows the task as skipped (tt_preflight's list of checks set to skip made a
passing preflight print "skipping"), ``failed`` and ``unreachable`` decide the outcome, and ``warnings`` and
``deprecations`` must be strings that Ansible prints itself. Lists under those names go under names of their own.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import yaml

MODULES = pathlib.Path(__file__).resolve().parents[4] / "plugins" / "modules"
RESERVED = {"skipped", "failed", "unreachable", "warnings", "deprecations", "exception", "invocation"}


def documented_return(path: pathlib.Path) -> dict:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RETURN" for t in node.targets):
            return yaml.safe_load(node.value.value) or {}
    return {}


@pytest.mark.parametrize("path", sorted(MODULES.glob("*.py")), ids=lambda p: p.stem)
def test_no_reserved_return_key(path):
    clash = sorted(RESERVED & set(documented_return(path)))
    assert not clash, f"{path.name} documents the return value(s) {clash}, which Ansible reads as the task's status"


def test_the_check_finds_a_reserved_key(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('RETURN = r"""\nskipped:\n  description: x\n  returned: always\n  type: list\n"""\n')
    assert set(documented_return(planted)) & RESERVED == {"skipped"}
