# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What ``registry_auth`` does: a registry's credentials in root's Docker config.json (mode 0600, its directory 0700
and root's) and its CA in ``<certs_dir>/<registry>/ca.crt``, through the safe-file layer.

The password never reaches the diff: it shows the registry, the username, whether the password changes and the CA's
fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import unlink, write_atomic
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth, read_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError, registry_host

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

PEM_LIMIT = 256 * 1024
# The config directory holds every registry's password: root's alone, whatever made it before.
CONFIG_DIR_MODE = 0o700


def _dir_to_fix(directory: str) -> str | None:
    """``mode 0755, owner 1000:1000`` when root's Docker config directory exists with another mode or owner than
    0700 root:root, else None."""
    try:
        with opened_dir(directory) as fd:
            st = os.fstat(fd)
    except FileNotFoundError:
        return None
    wrong_owner = os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0)
    if st.st_mode & 0o7777 == CONFIG_DIR_MODE and not wrong_owner:
        return None
    return f"mode {st.st_mode & 0o7777:04o}, owner {st.st_uid}:{st.st_gid}"


def _config(params: Mapping[str, Any]) -> tuple[int, str, JSON]:
    directory, name = os.path.split(params["docker_config"])
    dirfd = make_path(directory, CONFIG_DIR_MODE, (0, 0))
    try:
        set_attrs(dirfd, CONFIG_DIR_MODE, (0, 0))
        raw = read_bytes(dirfd, name, 4 * 1024 * 1024)
    except (SafeFileError, OSError):
        os.close(dirfd)
        raise
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        os.close(dirfd)
        raise ImageError(f"{params['docker_config']} is not JSON: fix or remove it") from None
    if not isinstance(data, dict):
        os.close(dirfd)
        raise ImageError(f"{params['docker_config']} is not a JSON object: fix or remove it")
    return dirfd, name, data


def _show(registry: str, auth: tuple[str, str] | None, ca: bytes | None) -> str:
    who = f"{registry}: {'user ' + repr(auth[0]) if auth else 'no credentials'}"
    fingerprint = hashlib.sha256(ca).hexdigest()[:16] if ca else "none"
    return f"{who}\nca.crt sha256 {fingerprint}\n"


def store_login(params: Mapping[str, Any], check_mode: bool, with_diff: bool) -> JSON:
    """The whole of ``registry_auth``: its result (``changed``, ``registry``, ``diff``). Raises ImageError,
    SafeFileError or OSError, which the module reports naming the registry."""
    registry = params["registry"]
    registry_host(registry, "registry")
    before = read_auth(params["docker_config"], registry) if os.path.exists(params["docker_config"]) else None
    after = (params["username"], params["password"]) if params["state"] == "present" else None
    changed_auth = before != after
    config_dir = os.path.dirname(params["docker_config"])
    dir_before = _dir_to_fix(config_dir)
    changed_dir = dir_before is not None
    ca_path = os.path.join(params["certs_dir"], registry, "ca.crt")
    ca_before = None
    if os.path.isfile(ca_path):
        with open(ca_path, "rb") as handle:
            ca_before = handle.read(PEM_LIMIT)
    ca_after = None
    if params["state"] == "present" and params["ca_cert"]:
        ca_after = params["ca_cert"].strip().encode() + b"\n"
        if b"-----BEGIN CERTIFICATE-----" not in ca_after:
            raise ImageError(f"ca_cert of {registry} is not a PEM certificate (-----BEGIN CERTIFICATE-----)")
    changed_ca = (ca_after is not None and ca_before != ca_after) or (
        params["state"] == "absent" and ca_before is not None
    )
    if not check_mode and (changed_auth or changed_dir):
        dirfd, name, data = _config(params)
        try:
            auths = data.setdefault("auths", {})
            if not isinstance(auths, dict):
                raise ImageError(f"{params['docker_config']}: auths is not an object: fix or remove it")
            for key in (registry, f"https://{registry}", f"http://{registry}"):
                auths.pop(key, None)
            if after is not None:
                auths[registry] = {"auth": encode_auth(*after)}
            if changed_auth:
                write_atomic(dirfd, name, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), 0o600, (0, 0))
        finally:
            os.close(dirfd)
    if not check_mode and changed_ca:
        dirfd = make_path(os.path.dirname(ca_path), 0o755)
        try:
            if ca_after is not None:
                write_atomic(dirfd, "ca.crt", ca_after, 0o644, (0, 0))
            else:
                unlink(dirfd, "ca.crt")
        finally:
            os.close(dirfd)
    result: JSON = {"changed": changed_auth or changed_ca or changed_dir, "registry": registry}
    if with_diff:
        directory = (
            (f"{config_dir}: {dir_before}\n", f"{config_dir}: mode 0700, owner 0:0\n") if changed_dir else ("", "")
        )
        result["diff"] = {
            "before": _show(registry, before, ca_before) + directory[0],
            "after": _show(
                registry,
                after,
                ca_after
                if params["state"] == "present" and ca_after
                else (None if params["state"] == "absent" else ca_before),
            )
            + ("password: changed\n" if before and after and before[1] != after[1] else "")
            + directory[1],
        }
    return result
