# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_host/pep440.py: PEP 440 versions and specifiers, and every requirement of the real v0.20.0 specs."""

from __future__ import annotations

import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._host import pep440 as pf
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import load_spec_file

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")


@pytest.fixture(scope="module")
def catalog():
    return load_spec_file(V20)


@pytest.mark.parametrize(
    ("version", "specifier", "ok"),
    [
        ("19.6.0.0", ">=19.2.0", True),
        ("19.2.0.0", ">=19.2.0", True),
        ("19.1.9.9", ">=19.2.0", False),
        ("80.17.0.0", ">=18.6.0", True),
        ("18.12.0", ">=18.6.0", True),
        ("18.5.0", ">=18.6.0", False),
        ("2.4.1", ">=2.5.0", False),
        ("2.5.0", ">=2.5.0", True),
        ("2.6.0", ">=2.5.0", True),
        ("1.27.1", ">=2.1.0", False),
        ("2.4.1", "<=2.4.1", True),
        ("2.4.2", "<=2.4.1", False),
        ("2.4.1", "<2.4.1", False),
        ("2.4.0", "<2.4.1", True),
        ("2.4.1", ">2.4.1", False),
        ("2.4.1.1", ">2.4.1", True),
        ("2.4", "==2.4.0", True),
        ("2.4.0.0", "==2.4", True),
        ("2.4.1", "==2.4.0", False),
        ("2.4.1", "!=2.4.1", False),
        ("2.4.1", "!=2.4.0", True),
        ("2.4.7", "==2.4.*", True),
        ("2.5.0", "==2.4.*", False),
        ("2", "==2.0.*", True),
        ("2.4.7", "!=2.4.*", False),
        ("2.5.0", "!=2.4.*", True),
        ("2.4.5", "~=2.4.1", True),
        ("2.5.0", "~=2.4.1", False),
        ("2.4.0", "~=2.4.1", False),
        ("2.9", "~=2.4", True),
        ("3.0", "~=2.4", False),
        ("2.4.5", ">=2.4.0, <2.5", True),
        ("2.5.0", ">=2.4.0, <2.5", False),
        ("2.4.5", ">=2.4.0,!=2.4.5", False),
        ("2.4.5", "", True),
        ("2.4.5", None, True),
        ("v2.4.5", ">=2.4", True),
        ("2.5.0rc1", ">=2.4.0", False),
        ("2.5.0-rc1", ">=2.4.0", False),
        ("2.5.0rc1", ">=2.5.0rc1", True),
        ("2.5.0rc2", ">=2.5.0rc1", True),
        ("2.5.0", ">=2.5.0rc1", True),
        ("2.5.0.dev1", ">=2.5.0a1", False),
        ("2.5.0.post1", ">2.5.0", True),
        ("2.5.0+local", "==2.5.0", True),
        ("2.5.0", "===2.5.0", True),
        ("2.5", "===2.5.0", False),
        ("not-a-version", ">=1.0", False),
    ],
)
def test_specifier(version, specifier, ok):
    assert pf.satisfies(version, specifier) is ok


def test_specifier_reasons():
    assert pf.check_specifier("19.1.0.0", ">=19.2.0") == (False, "19.1.0.0 is not >=19.2.0")
    assert pf.check_specifier("2.4.7", ">=2.0,!=2.4.*")[1] == "2.4.7 is not !=2.4.*"
    assert "pre-release" in pf.check_specifier("2.5.0rc1", ">=2.0")[1]
    assert pf.check_specifier("2.5.0", ">=2.0") == (True, None)


@pytest.mark.parametrize("specifier", ["=>2.4", "2.4", "~=2", ">=2.4.*", ">=", "==abc", ">=2.4;", 5])
def test_specifier_malformed(specifier):
    with pytest.raises(pf.SpecifierError):
        pf.parse_specifier(specifier)


def test_version_order():
    texts = ["1.0.dev0", "1.0a1", "1.0a2", "1.0b1", "1.0rc1", "1.0", "1.0.post1", "1.0.1", "1.1"]
    keys = [pf.version_key(pf.parse_version(text)) for text in texts]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)
    assert pf.version_key(pf.parse_version("1.0")) == pf.version_key(pf.parse_version("1.0.0.0"))


def test_every_v020_requirement_parses(catalog):
    seen = set()
    for devices in catalog["model_specs"].values():
        for engines in devices.values():
            for impls in engines.values():
                for spec in impls.values():
                    for requirement in (spec.get("system_requirements") or {}).values():
                        if requirement:
                            pf.parse_specifier(requirement["specifier"])
                            seen.add(requirement["specifier"])
    assert ">=19.2.0" in seen and ">=2.5.0" in seen
