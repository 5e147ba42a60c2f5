"""Every role's defaults, argument specs and README agree (STYLE rule 4)."""

import os
import re
import sys

import pytest
import yaml
from conftest import ROOT

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
    (the modules take theirs from _ttis.source.DEFAULT_RELEASE_ROOT)."""
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


class _AnyTagLoader(yaml.SafeLoader):
    """safe_load that reads a tagged node (!vault, !unsafe) as None: only the structure of the tasks matters here."""


_AnyTagLoader.add_multi_constructor("!", lambda _loader, _suffix, _node: None)


def _yaml_files(tops):
    """(path, parsed YAML) of every YAML file below ``tops`` (roles' README files aside)."""
    for path, text in _files(tops, (".yml", ".yaml")):
        yield path, yaml.load(text, Loader=_AnyTagLoader)


def _dicts(node):
    """Every mapping in a parsed YAML document, at any depth (plays, blocks, tasks, their arguments)."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            yield from _dicts(child)


# The fleet-wide settings are the contract role's defaults: the inventory's names (tt_models, tt_spec_dir, ...).
CONTRACT = sorted(_load(os.path.join(ROOT, "roles", "fleet_defaults", "defaults", "main.yml")))
ROLE_DEFAULTS = {
    name: role for role in ROLES for name in _load(os.path.join(ROOT, "roles", role, "defaults", "main.yml"))
}
SET_FACT = ("ansible.builtin.set_fact", "ansible.legacy.set_fact", "set_fact")


def test_no_task_sets_a_contract_variable():
    """A fleet-wide setting is written in the inventory (or its default) and nowhere else: a set_fact would outrank the
    inventory for the rest of the run and make the setting mean "whatever the last role decided" (STYLE rule 19).
    A role publishes its own <role>_* fact instead, and the setting's default may follow it (tt_spec_dir)."""
    hits = []
    for path, document in _yaml_files(["roles", "playbooks"]):
        for task in _dicts(document):
            for module in SET_FACT:
                args = task.get(module)
                names = list(args) if isinstance(args, dict) else re.findall(r"(\w+)=", str(args or ""))
                hits += [f"{path}: {task.get('name', module)} sets {name}" for name in names if name in CONTRACT]
    assert hits == [], "contract variables of roles/fleet_defaults must not be set_fact'ed; publish a fact of the role"


# hostvars[h].name, hostvars[h]['name'], and map('extract', hostvars) | map(attribute='name...').
_HOSTVARS_READS = re.compile(
    r"hostvars\[[^\]]+\]\s*(?:\.\s*(?P<dot>\w+)|\[\s*['\"](?P<key>\w+)['\"]\s*\])"
    r"|map\(\s*['\"]extract['\"]\s*,\s*hostvars\s*\)\s*\|\s*map\(\s*attribute\s*=\s*['\"](?P<attr>\w+)"
)


_HOSTVARS_ALIAS = re.compile(r"set\s+(?P<alias>\w+)\s*=\s*hostvars\[[^\]]+\]\s*(?:-?%\}|\n)")


def _hostvars_reads(text):
    """(variable, line number, the text right after the read) of each variable read from another host's hostvars,
    directly or through a Jinja alias (``{% set hv = hostvars[host] %}`` then ``hv.name``)."""
    reads = list(_HOSTVARS_READS.finditer(text))
    for alias in {match.group("alias") for match in _HOSTVARS_ALIAS.finditer(text)}:
        reads += re.finditer(rf"\b{alias}\s*(?:\.\s*(?P<dot>\w+)|\[\s*['\"](?P<key>\w+)['\"]\s*\])", text)
    for match in reads:
        name = match.groupdict().get("dot") or match.groupdict().get("key") or match.groupdict().get("attr")
        yield name, text.count("\n", 0, match.start()) + 1, text[match.end() :].lstrip()


def test_hostvars_carry_only_published_facts_and_inventory_settings():
    """hostvars[host] holds the host's inventory variables, facts and registered results, not role defaults (a role
    default read there is undefined unless the inventory happens to set it: commit aae8ef0) nor role parameters. So
    across hosts a role reads only facts a role publishes under a contract name (model_cache_plan,
    model_cache_kernel_wants, ...), never another host's internal __ register, never a role default; a fleet-wide
    setting (an inventory name) only with a default for the hosts whose inventory does not set it."""
    hits = []
    for path, text in _files(["roles", "playbooks"], (".yml", ".yaml", ".j2")):
        for name, number, after in _hostvars_reads(text):
            where = f"{path}:{number}: hostvars[...].{name}"
            if name.startswith("__"):
                hits.append(f"{where} is internal to its role: publish it as a fact of a contract name")
            elif name in ROLE_DEFAULTS and not (name in CONTRACT and after.startswith("| default(")):
                hits.append(f"{where} is a default of roles/{ROLE_DEFAULTS[name]}, not in hostvars: publish a fact")
    assert hits == []


def _entry_point_uses():
    """(path, role, entry point) of every include_role/import_role with tasks_from in roles, playbooks and molecule."""
    for path, document in _yaml_files(["roles", "playbooks", "molecule"]):
        for task in _dicts(document):
            for module in ("include_role", "import_role"):
                for key in (f"ansible.builtin.{module}", module):
                    args = task.get(key)
                    if isinstance(args, dict) and args.get("tasks_from") and str(args.get("name", "")).strip():
                        role = str(args["name"]).rsplit(".", 1)[-1]
                        yield path, role, str(args["tasks_from"]).removesuffix(".yml")


def test_every_entry_point_in_use_has_an_argument_spec():
    """STYLE rule 4: an entry point that playbooks import (fleet_defaults settings, tt_host preflight, ...) has its
    own argument spec, so Ansible checks what it is given."""
    uses = sorted(set(_entry_point_uses()))
    assert uses, "no tasks_from found: the scan is broken"
    missing = [f"{path}: {role} {entry}" for path, role, entry in uses if entry not in role_docs.load_specs(role)]
    assert missing == [], "add these entry points to the role's meta/argument_specs.yml"
