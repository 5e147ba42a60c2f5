# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""registry_auth's logic (_images.login): root's Docker config.json and the registry's CA, check mode, the diff (never
the password), a second run that changes nothing, removal."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth, read_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.login import store_login
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError

PEM = "-----BEGIN CERTIFICATE-----\nMIIBsite\n-----END CERTIFICATE-----\n"
REGISTRY = "reg.example:5000"


def _params(tmp_path, **changes):
    params = {
        "registry": REGISTRY,
        "username": "fleet",
        "password": "first-secret",
        "ca_cert": PEM,
        "state": "present",
        "docker_config": str(tmp_path / "docker" / "config.json"),
        "certs_dir": str(tmp_path / "certs"),
    }
    params.update(changes)
    return params


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_login_is_planned_written_once_and_then_unchanged(tmp_path):
    directory = tmp_path / "docker"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    config = directory / "config.json"
    kept = {"auths": {"other.example": {"auth": encode_auth("o", "p")}}, "credsStore": "pass"}
    config.write_text(json.dumps(kept))
    owner = f"{os.stat(directory).st_uid}:{os.stat(directory).st_gid}"
    params = _params(tmp_path)
    ca = tmp_path / "certs" / REGISTRY / "ca.crt"
    fingerprint = hashlib.sha256(PEM.encode()).hexdigest()[:16]

    planned = store_login(params, True, True)
    assert planned == {
        "changed": True,
        "registry": REGISTRY,
        "diff": {
            "before": f"{REGISTRY}: no credentials\nca.crt sha256 none\n{directory}: mode 0755, owner {owner}\n",
            "after": f"{REGISTRY}: user 'fleet'\nca.crt sha256 {fingerprint}\n{directory}: mode 0700, owner 0:0\n",
        },
    }
    assert json.loads(config.read_text()) == kept and not ca.exists() and _mode(directory) == 0o755

    assert store_login(params, False, False) == {"changed": True, "registry": REGISTRY}
    data = json.loads(config.read_text())
    assert data["credsStore"] == "pass" and data["auths"]["other.example"] == kept["auths"]["other.example"]
    assert read_auth(str(config), REGISTRY) == ("fleet", "first-secret")
    assert (_mode(config), _mode(directory), _mode(ca)) == (0o600, 0o700, 0o644)
    assert ca.read_text() == PEM

    for check_mode in (True, False):
        again = store_login(params, check_mode, True)
        assert not again["changed"] and again["diff"]["before"] == again["diff"]["after"]

    changed = store_login(_params(tmp_path, password="second-secret"), True, True)
    assert changed["changed"] and changed["diff"]["after"].endswith("password: changed\n")
    assert "secret" not in json.dumps(changed)


def test_absent_removes_the_login_and_the_ca(tmp_path):
    params = _params(tmp_path)
    store_login(params, False, False)
    gone = _params(tmp_path, state="absent", username=None, password=None, ca_cert=None)
    planned = store_login(gone, True, True)
    assert planned["changed"] and planned["diff"]["after"] == f"{REGISTRY}: no credentials\nca.crt sha256 none\n"
    assert store_login(gone, False, False)["changed"]
    assert read_auth(params["docker_config"], REGISTRY) is None
    assert not os.path.exists(os.path.join(params["certs_dir"], REGISTRY, "ca.crt"))
    assert not store_login(gone, False, False)["changed"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ca_cert": "not a certificate"}, rf"ca_cert of {REGISTRY} is not a PEM certificate"),
        ({"registry": "https://reg.example"}, "without a scheme or a path"),
    ],
)
def test_bad_input_is_named(tmp_path, changes, message):
    with pytest.raises(ImageError, match=message):
        store_login(_params(tmp_path, **changes), True, True)
    assert not os.path.exists(tmp_path / "docker")


def test_a_config_that_is_not_json_is_refused_naming_it(tmp_path):
    (tmp_path / "docker").mkdir(mode=0o700)
    (tmp_path / "docker" / "config.json").write_text("{auths")
    # The module reports it as "registry_auth of <registry>: <path>: is not valid JSON".
    with pytest.raises(SafeFileError, match=r"docker/config\.json: is not valid JSON"):
        store_login(_params(tmp_path, ca_cert=None), False, False)
