# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Registry credentials: root's Docker config.json, the engine's X-Registry-Auth header, one login per registry."""

from __future__ import annotations

import base64
import json

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import (
    check_logins,
    encode_auth,
    engine_auth_header,
    read_auth,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError


def test_docker_config_auth_is_read_per_registry(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "auths": {
                    "reg.example:5000": {"auth": encode_auth("fleet", "pa:ss")},
                    "https://index.docker.io/v1/": {"auth": encode_auth("hub", "x")},
                }
            }
        )
    )
    assert read_auth(str(config), "reg.example:5000") == ("fleet", "pa:ss")
    assert read_auth(str(config), "docker.io") == ("hub", "x")
    assert read_auth(str(config), "other.example") is None
    assert read_auth(str(tmp_path / "missing.json"), "reg.example:5000") is None
    header = engine_auth_header("reg.example:5000", ("fleet", "pa:ss"))["X-Registry-Auth"]
    assert json.loads(base64.urlsafe_b64decode(header)) == {
        "username": "fleet",
        "password": "pa:ss",
        "serveraddress": "reg.example:5000",
    }
    assert engine_auth_header("reg.example:5000", None) == {}


def test_logins_are_one_per_registry():
    logins = check_logins(
        [
            {"registry": "reg-a.example:5000", "username": "a", "password": "pa"},
            {"registry": "index.docker.io", "username": "hub", "password": "ph", "ca_cert": None},
        ]
    )
    assert logins["reg-a.example:5000"].auth == ("a", "pa")
    assert logins["docker.io"].auth == ("hub", "ph")
    assert "pa" not in repr(logins)
    with pytest.raises(ImageError, match=r"registry_credentials\[1\] and registry_credentials\[0\] both name"):
        check_logins([{"registry": "r.example", "username": "a", "password": "x"}] * 2)
    with pytest.raises(ImageError, match="without a scheme or a path"):
        check_logins([{"registry": "https://r.example", "username": "a", "password": "x"}])
