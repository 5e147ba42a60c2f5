# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The tt-inference-server release layout of a host, read in one pass (ttfleet.inference.release_state).

The role inference_server keeps, under its root: ``releases/<tag>`` (a checkout with the marker file the install
writes last), ``venvs/<tag>`` (the venv run.py runs in, with the pinned PyYAML) and the links ``current`` and
``previous``. Everything here only reads; a link is read, never followed, and the marker is opened without following
a link and only when it is a regular file of bounded size.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

MARKER_LIMIT = 1 << 20
LINKS = ("current", "previous")


class MarkerError(FleetError, ValueError):
    """The marker is there but not what an install writes."""


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def read_marker(release_dir: str, marker: str) -> dict[str, Any] | None:
    """The marker's JSON object; None when there is no marker. Raises MarkerError for anything else."""
    path = os.path.join(release_dir, marker)
    try:
        with opened_dir(release_dir) as dirfd:
            data = read_bytes(dirfd, marker, MARKER_LIMIT, where=release_dir)
    except FileNotFoundError:
        return None
    except (OSError, SafeFileError) as exc:
        raise MarkerError(f"{path} cannot be read ({exc}): move it away and run the role again") from None
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise MarkerError(f"{path} is not JSON: move it away and run the role again") from None
    if not isinstance(value, dict):
        raise MarkerError(f"{path} is not a JSON object: move it away and run the role again")
    return value


def link(path: str) -> dict[str, Any]:
    """``{item, stat: {exists, islnk, lnk_target}}`` as ansible.builtin.stat reports a path it does not follow."""
    info = _lstat(path)
    islnk = info is not None and stat.S_ISLNK(info.st_mode)
    return {
        "item": os.path.basename(path),
        "stat": {
            "exists": info is not None,
            "islnk": islnk,
            "isdir": info is not None and stat.S_ISDIR(info.st_mode),
            "lnk_target": os.readlink(path) if islnk else None,
        },
    }


def markers(releases_dir: str, marker: str) -> list[dict[str, Any]]:
    """``releases/<name>/<marker>`` of every real directory that holds one as a regular file: ``{path, mtime}``."""
    try:
        names = sorted(os.listdir(releases_dir))
    except OSError:
        return []
    found = []
    for name in names:
        directory = os.path.join(releases_dir, name)
        info = _lstat(directory)
        if info is None or not stat.S_ISDIR(info.st_mode):
            continue
        path = os.path.join(directory, marker)
        info = _lstat(path)
        if info is not None and stat.S_ISREG(info.st_mode):
            found.append({"path": path, "mtime": info.st_mtime})
    return found


def venv(venv_dir: str, pyyaml_version: str | None) -> dict[str, Any]:
    """Whether the venv has its interpreter (``bin/python``, a link counts) and the pinned PyYAML's dist-info."""
    result: dict[str, Any] = {"python": _lstat(os.path.join(venv_dir, "bin", "python")) is not None, "pyyaml": False}
    if not pyyaml_version:
        return result
    wanted = re.compile(rf"^pyyaml-{re.escape(pyyaml_version)}\.dist-info$", re.IGNORECASE)
    lib = os.path.join(venv_dir, "lib")
    try:
        pythons = [name for name in os.listdir(lib) if name.startswith("python3")]
    except OSError:
        return result
    for python in pythons:
        try:
            entries = os.listdir(os.path.join(lib, python, "site-packages"))
        except OSError:
            continue
        if any(wanted.match(entry) for entry in entries):
            result["pyyaml"] = True
            break
    return result


def directory(path: str) -> dict[str, Any]:
    """``{exists, isdir, uid, gid, mode}`` of a path, not followed (mode as an octal string like ``0755``)."""
    info = _lstat(path)
    if info is None:
        return {"exists": False, "isdir": False, "uid": None, "gid": None, "mode": None}
    return {
        "exists": True,
        "isdir": stat.S_ISDIR(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
    }


def read(root: str, version: str, marker: str, pyyaml_version: str | None = None) -> dict[str, Any]:
    """The whole layout as the role reads it before it installs or switches (see the module's RETURN)."""
    releases_dir = os.path.join(root, "releases")
    release_dir = os.path.join(releases_dir, version)
    release = directory(release_dir)
    try:
        release["marker"] = read_marker(release_dir, marker) if release["isdir"] else None
        release["marker_error"] = None
    except MarkerError as exc:
        release["marker"] = None
        release["marker_error"] = str(exc)
    return {
        "root": directory(root),
        "release": release,
        "venv": venv(os.path.join(root, "venvs", version), pyyaml_version),
        "links": [link(os.path.join(root, name)) for name in LINKS],
        "markers": markers(releases_dir, marker),
    }
