# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Registry credentials: one login per registry, root's Docker config.json, the engine's X-Registry-Auth header and
the CAs Docker trusts for a registry (certs.d)."""

from __future__ import annotations

import base64
import json
import os
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    DOCKER_HUB,
    ImageError,
    registry_host,
)

if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]

DOCKER_CONFIG = "/root/.docker/config.json"
CERTS_DIR = "/etc/docker/certs.d"


@dataclass(frozen=True)
class Login:
    """The credentials, and the CA, set for one registry; nothing here is ever sent to another host."""

    username: str
    password: str = field(repr=False)
    ca_cert: str | None = field(default=None, repr=False)

    @property
    def auth(self) -> tuple[str, str]:
        return self.username, self.password


def check_logins(entries: object, what: str = "registry_credentials") -> dict[str, Login]:
    """``{registry: Login}`` from ``[{registry, username, password, ca_cert}]``, one entry per registry.

    A credential is looked up by the host[:port] a request actually goes to (after every mirror or upstream
    mapping), so an entry belongs to exactly one registry; two entries for one registry are refused."""
    logins: dict[str, Login] = {}
    if entries is None:
        return logins
    if not isinstance(entries, list):
        raise ImageError(f"{what} must be a list of {{registry, username, password}}, not {type(entries).__name__}")
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{what}[{index}]"
        if not isinstance(entry, dict):
            raise ImageError(f"{where} must be a mapping with registry, username and password")
        registry = registry_host(entry.get("registry"), f"{where}.registry")
        if registry in seen:
            raise ImageError(
                f"{where} and {what}[{seen[registry]}] both name registry {registry}: keep one entry per registry"
            )
        seen[registry] = index
        username, password = entry.get("username"), entry.get("password")
        if not isinstance(username, str) or not username or not isinstance(password, str):
            raise ImageError(f"{where} ({registry}): give username and password as strings")
        ca_cert = entry.get("ca_cert")
        if ca_cert is not None and not isinstance(ca_cert, str):
            raise ImageError(f"{where} ({registry}): ca_cert must be PEM text")
        logins[registry] = Login(username, password, ca_cert or None)
    return logins


def read_auth(config_path: str, registry: str) -> tuple[str, str] | None:
    """(username, password) stored for ``registry`` in Docker's config.json (``auths.<registry>.auth``), or None."""
    from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json_path

    data = read_json_path(config_path, missing=None)
    if not isinstance(data, dict):
        return None
    found = data.get("auths")
    auths: JSON = found if isinstance(found, dict) else {}
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys += ["https://index.docker.io/v1/", "index.docker.io"]
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, sep, secret = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise ImageError(
                    f"{config_path}: the auth entry of {registry} is not base64 of user:password; "
                    "log in again (tt_registry_credentials)"
                ) from None
            if sep:
                return user, secret
    return None


def encode_auth(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def engine_auth_header(registry: str, auth: tuple[str, str] | None) -> dict[str, str]:
    """The X-Registry-Auth header the Docker Engine API takes for a pull (base64url JSON)."""
    if auth is None:
        return {}
    payload = json.dumps({"username": auth[0], "password": auth[1], "serveraddress": registry}).encode()
    return {"X-Registry-Auth": base64.urlsafe_b64encode(payload).decode()}


def ssl_context(registry: str, certs_dir: str = CERTS_DIR) -> ssl.SSLContext:
    """The system CAs plus the registry's own CA from Docker's certs.d (``<certs_dir>/<registry>/ca.crt``)."""
    context = ssl.create_default_context()
    ca_file = os.path.join(certs_dir, registry, "ca.crt")
    if os.path.isfile(ca_file):
        context.load_verify_locations(cafile=ca_file)
    return context
