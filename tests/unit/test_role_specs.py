"""Every role's defaults, argument specs and README agree (STYLE rule 4)."""

import os
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))

import role_docs

ROLES = role_docs.roles()


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_main_spec(role):
    defaults = _load(os.path.join(ROOT, "roles", role, "defaults", "main.yml"))
    options = role_docs.load_specs(role)["main"].get("options", {})
    assert sorted(defaults) == sorted(k for k, v in options.items() if "default" in v), (
        f"roles/{role}: defaults/main.yml and meta/argument_specs.yml list different variables"
    )
    for name, value in defaults.items():
        assert options[name]["default"] == value, f"roles/{role}: default of {name} differs between defaults and spec"


@pytest.mark.parametrize("role", ROLES)
def test_public_names_carry_the_role_prefix(role):
    for entry, spec in role_docs.load_specs(role).items():
        for name in spec.get("options", {}):
            assert name.startswith(f"{role}_"), f"roles/{role} entry {entry}: {name} lacks the prefix {role}_"


@pytest.mark.parametrize("role", ROLES)
def test_vars_never_redefine_defaults(role):
    path = os.path.join(ROOT, "roles", role, "vars", "main.yml")
    if os.path.exists(path):
        defaults = _load(os.path.join(ROOT, "roles", role, "defaults", "main.yml"))
        assert not set(_load(path)) & set(defaults)


@pytest.mark.parametrize("role", ROLES)
def test_readme_is_generated_from_specs(role):
    assert role_docs.update(role, check=True), f"run python tests/tools/role_docs.py to refresh roles/{role}/README.md"
