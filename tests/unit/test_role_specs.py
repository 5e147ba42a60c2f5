"""Every role's defaults, argument specs and README agree (STYLE rule 4)."""

import os
import re
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


# The contract role's variables are the inventory's fleet-wide names (tt_models, tt_release_root, ...).
PREFIXES = {"fleet_defaults": "tt"}


@pytest.mark.parametrize("role", ROLES)
def test_public_names_carry_the_role_prefix(role):
    prefix = PREFIXES.get(role, role)
    for entry, spec in role_docs.load_specs(role).items():
        for name in spec.get("options", {}):
            assert name.startswith(f"{prefix}_"), f"roles/{role} entry {entry}: {name} lacks the prefix {prefix}_"


def _files(tops, suffixes):
    """(path relative to the checkout, text) of every file below the directories ``tops`` ending in ``suffixes``."""
    for top in tops:
        for base, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(suffixes) and name != "README.md":
                    path = os.path.join(base, name)
                    with open(path, encoding="utf-8") as handle:
                        yield os.path.relpath(path, ROOT), handle.read()


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_or_sets_another_roles_private_variables(role):
    others = [other for other in ROLES if other != role]
    for path, text in _files([os.path.join("roles", role)], (".yml", ".yaml", ".j2")):
        for other in others:
            # tt_host's private names start with __tt_host_; none of the others' start with another role's name.
            hits = [m for m in re.findall(rf"\b__{other}_\w+", text) if not m.startswith(f"__{role}_")]
            assert not hits, f"{path} uses {sorted(set(hits))}, private to roles/{other}: use its entry points or facts"


def test_the_release_root_is_written_once():
    """/opt/tt-inference-server is tt_release_root's default (fleet_defaults) and nowhere else in roles and playbooks
    (the modules take theirs from _spec.DEFAULT_RELEASE_ROOT)."""
    hits = [
        f"{path}:{number}"
        for path, text in _files(["roles", "playbooks"], (".yml", ".j2", ".sh", ".py"))
        for number, line in enumerate(text.splitlines(), 1)
        if "/opt/tt-inference-server" in line and not line.lstrip().startswith("#")
    ]
    allowed = {"roles/fleet_defaults/defaults/main.yml", "roles/fleet_defaults/meta/argument_specs.yml"}
    assert [hit for hit in hits if hit.rsplit(":", 1)[0] not in allowed] == []


def test_the_device_list_exists_once():
    """tt_device_types is fleet_defaults' alone: the status playbook reads it, no other file lists the device names."""
    listing = re.compile(r"\bn150, n300, n150x4\b|^\s*- n150x4$", re.M)
    hits = [path for path, text in _files(["roles", "playbooks"], (".yml",)) if listing.search(text)]
    assert sorted(hits) == ["roles/fleet_defaults/defaults/main.yml", "roles/fleet_defaults/meta/argument_specs.yml"]


@pytest.mark.parametrize("role", ROLES)
def test_vars_never_redefine_defaults(role):
    path = os.path.join(ROOT, "roles", role, "vars", "main.yml")
    if os.path.exists(path):
        defaults = _load(os.path.join(ROOT, "roles", role, "defaults", "main.yml"))
        assert not set(_load(path)) & set(defaults)


@pytest.mark.parametrize("role", ROLES)
def test_readme_is_generated_from_specs(role):
    assert role_docs.update(role, check=True), f"run python tests/tools/role_docs.py to refresh roles/{role}/README.md"
