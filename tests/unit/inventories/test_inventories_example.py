"""inventories/example: every host parses, and every model it serves is in the real v0.20.0 catalog."""

import json
import os
import shutil
import subprocess

import pytest
from conftest import ROOT

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import load_spec_file
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.tags import is_legacy_interface

INVENTORY = os.path.join(ROOT, "inventories", "example")
SPEC = os.path.join(ROOT, "tests", "fixtures", "specs", "release_model_spec-v0.20.0.json.gz")
DEVICE_TYPES = ["n150", "n300", "t3k", "galaxy", "p150", "p150x4", "p150x8", "p300", "p300x2"]
# Pairs whose v0.20.0 image predates the v0.11 container interface: the example says so in a comment.
LEGACY_PAIRS = {("p150x4", "Llama-3.1-8B-Instruct"), ("p150x8", "Llama-3.3-70B-Instruct")}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    program = shutil.which("ansible-inventory") or os.path.join(ROOT, ".venv", "bin", "ansible-inventory")
    password = tmp_path_factory.mktemp("vault") / "password"
    password.write_text("example-only-do-not-use\n")
    out = subprocess.run(
        [program, "-i", INVENTORY, "--list", "--vault-password-file", str(password)],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections")),
    ).stdout
    return json.loads(out)


def _groups(data, host):
    return [name for name, group in data.items() if isinstance(group, dict) and host in group.get("hosts", [])]


def test_every_device_type_has_a_host_and_a_site(inventory):
    hosts = inventory["_meta"]["hostvars"]
    for device in DEVICE_TYPES:
        assert inventory[device]["hosts"], device
    for host in hosts:
        groups = _groups(inventory, host)
        assert len([g for g in groups if g in DEVICE_TYPES]) == 1, (host, groups)
        assert len([g for g in groups if g.startswith("site_")]) == 1, (host, groups)


def test_every_model_resolves_in_the_v0_20_0_catalog(inventory):
    catalog = load_spec_file(SPEC)
    hostvars = inventory["_meta"]["hostvars"]
    seen = set()
    for host, hv in hostvars.items():
        device = next(g for g in _groups(inventory, host) if g in DEVICE_TYPES)
        assert hv["tt_models"], host
        for entry in hv["tt_models"]:
            derived = resolve(catalog, entry["name"], device, impl=entry.get("impl"), volume_root="/data/tt-cache")
            legacy = is_legacy_interface(derived["inference_engine"], derived["version"])
            assert legacy == ((device, entry["name"]) in LEGACY_PAIRS), (host, entry["name"], derived["version"])
            assert "{{" in entry["revision"] and "site_weights_revisions" in entry["revision"]
            seen.add(device)
    assert seen == set(DEVICE_TYPES)


def test_vault_holds_the_secrets_and_main_refers_to_them(inventory):
    hv = inventory["_meta"]["hostvars"]["qb2-01"]
    assert hv["model_cache_hf_token"] == "{{ vault_hf_token }}"
    assert hv["vault_hf_token"] == "example-hf-token-replace-me"
    with open(os.path.join(INVENTORY, "group_vars", "all", "vault.yml")) as handle:
        assert handle.readline().startswith("$ANSIBLE_VAULT;1.1;AES256")
