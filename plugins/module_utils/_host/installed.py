# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What tt_host's installation would change, read without changing anything (issue 34).

A converged host skips the installation's tasks when these say there is nothing to do: the Debian packages installed
(dpkg's status file), the systemd units enabled and active (``systemctl show``), the Python distributions of a venv (its
``*.dist-info`` metadata, read as text; the venv's interpreter is never run) and a path with where its link points.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError

if TYPE_CHECKING:
    from collections.abc import Iterable

DPKG_STATUS = "/var/lib/dpkg/status"
_STATUS_LIMIT = 64 << 20
_METADATA_LIMIT = 64 << 10
_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)\.dist-info$")


def _normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (tt_smi, tt-smi and TT.SMI are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dpkg_packages(names: Iterable[str], status_path: str = DPKG_STATUS) -> dict[str, str | None]:
    """name -> installed version (status ``... installed``), None when absent or only half there.

    A name may carry an architecture (``docker.io:amd64``); without one any architecture counts.
    """
    wanted = {name: name.split(":", 1) for name in names}
    found: dict[str, str | None] = dict.fromkeys(wanted)
    if not wanted:
        return found
    try:
        with open(status_path, "rb") as handle:
            text = handle.read(_STATUS_LIMIT).decode("utf-8", "replace")
    except OSError:
        return found
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _sep, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("status", "").split()[-1:] != ["installed"]:
            continue
        for name, parts in wanted.items():
            if fields.get("package") != parts[0]:
                continue
            if len(parts) == 2 and fields.get("architecture") not in (parts[1], "all"):
                continue
            found[name] = fields.get("version")
    return found


def unit_states(units: Iterable[str], timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """unit -> {active, enabled} as systemd says (ActiveState, UnitFileState); None each when systemctl cannot tell."""
    states: dict[str, dict[str, Any]] = {}
    for unit in units:
        state: dict[str, Any] = {"active": None, "enabled": None}
        try:
            # Accepted B603/B607: a fixed argv, no shell; systemctl is found on root's PATH as Ansible's
            # systemd_service module finds it, and the unit name is an argument after "--".
            proc = subprocess.run(  # nosec B603 B607
                ["systemctl", "show", "--property=ActiveState,UnitFileState", "--", unit],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            states[unit] = state
            continue
        if proc.returncode == 0:
            values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
            state = {"active": values.get("ActiveState") or None, "enabled": values.get("UnitFileState") or None}
        states[unit] = state
    return states


def _metadata(directory: str) -> tuple[str | None, str | None]:
    """(Name, Version) of ``directory``/METADATA, read without following a link; (None, None) when unreadable."""
    try:
        with opened_dir(directory) as dirfd:
            data = read_bytes(dirfd, "METADATA", _METADATA_LIMIT, where=directory)
    except (OSError, SafeFileError):
        return None, None
    head = (data or b"").decode("utf-8", "replace").split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line and line[:1] not in (" ", "\t"))
    name, version = fields.get("Name"), fields.get("Version")
    return (name.strip() if name else None), (version.strip() if version else None)


def venv_distributions(venv: str, names: Iterable[str]) -> dict[str, str | None]:
    """name -> version installed in the venv's site-packages (by its METADATA), None when not installed.

    What ``importlib.metadata.version`` in the venv's interpreter would say for a distribution pip installed, read as
    text: nothing in the venv runs.
    """
    found: dict[str, str | None] = dict.fromkeys(names)
    wanted = {_normalise(name): name for name in found}
    lib = os.path.join(venv, "lib")
    try:
        pythons = sorted(entry for entry in os.listdir(lib) if entry.startswith("python3"))
    except OSError:
        return found
    for python in pythons:
        site = os.path.join(lib, python, "site-packages")
        try:
            entries = sorted(os.listdir(site))
        except OSError:
            continue
        for entry in entries:
            match = _DIST_INFO.match(entry)
            if not match or _normalise(match.group("name")) not in wanted:
                continue
            name, version = _metadata(os.path.join(site, entry))
            key = wanted.get(_normalise(name or ""))
            if key is not None and version and found[key] is None:
                found[key] = version
    return found


def path_link(path: str) -> dict[str, Any]:
    """{path, exists, link_target}: whether the path exists as anything (a dangling link too), and the real path a link
    resolves to (None for a non-link)."""
    exists = os.path.lexists(path)
    return {
        "path": path,
        "exists": exists,
        "link_target": os.path.realpath(path) if exists and os.path.islink(path) else None,
    }
