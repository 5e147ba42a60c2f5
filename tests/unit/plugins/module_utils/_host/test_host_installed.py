# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_host/installed.py: what tt_host's installation would change, read from dpkg, systemd and a venv's metadata."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import venv

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._host import installed

STATUS = """Package: docker.io
Status: install ok installed
Architecture: amd64
Version: 20.10.24+dfsg1-1+deb12u1
Description: Linux container runtime
 a continuation line: Status: deinstall ok config-files

Package: python3-venv
Status: deinstall ok config-files
Architecture: amd64
Version: 3.11.2-1+b1

Package: tenstorrent-tools
Status: hold ok installed
Architecture: all
Version: 1.2.0

Package: half
Status: install ok half-installed
Version: 1
"""


def test_dpkg_packages_reads_installed_versions_only(tmp_path):
    status = tmp_path / "status"
    status.write_text(STATUS)
    found = installed.dpkg_packages(
        ["docker.io", "python3-venv", "tenstorrent-tools", "half", "missing", "docker.io:arm64", "docker.io:amd64"],
        str(status),
    )
    assert found == {
        "docker.io": "20.10.24+dfsg1-1+deb12u1",
        "python3-venv": None,  # removed, its configuration kept: not installed
        "tenstorrent-tools": "1.2.0",  # held is still installed
        "half": None,
        "missing": None,
        "docker.io:arm64": None,
        "docker.io:amd64": "20.10.24+dfsg1-1+deb12u1",
    }


def test_dpkg_packages_without_a_status_file_finds_nothing(tmp_path):
    assert installed.dpkg_packages(["docker.io"], str(tmp_path / "absent")) == {"docker.io": None}
    assert installed.dpkg_packages([], str(tmp_path / "absent")) == {}


def _dist(site, dirname, name, version):
    path = site / dirname
    path.mkdir(parents=True)
    (path / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-this\n")


def test_venv_distributions_reads_metadata_by_normalised_name(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    _dist(site, "tt_smi-3.0.39.dist-info", "tt-smi", "3.0.39")
    _dist(site, "TT.Flash-3.4.12.dist-info", "TT.Flash", "3.4.12")
    _dist(site, "other-1.0.dist-info", "other", "1.0")
    found = installed.venv_distributions(str(tmp_path / "venv"), ["tt-smi", "tt-flash", "pyyaml"])
    assert found == {"tt-smi": "3.0.39", "tt-flash": "3.4.12", "pyyaml": None}
    assert installed.venv_distributions(str(tmp_path / "nothing"), ["tt-smi"]) == {"tt-smi": None}


def test_venv_distributions_refuses_a_linked_or_special_metadata(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "tt_smi-3.0.39.dist-info").mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("Name: tt-smi\nVersion: 3.0.39\n")
    os.symlink(target, site / "tt_smi-3.0.39.dist-info" / "METADATA")
    (site / "tt_flash-3.4.12.dist-info").mkdir()
    os.mkfifo(site / "tt_flash-3.4.12.dist-info" / "METADATA")
    assert installed.venv_distributions(str(tmp_path / "venv"), ["tt-smi", "tt-flash"]) == {
        "tt-smi": None,
        "tt-flash": None,
    }


def test_venv_distributions_agrees_with_importlib_metadata_in_a_real_venv(tmp_path):
    """What the tools venv's interpreter said before (importlib.metadata.version), for a distribution pip installed."""
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    _dist(tmp_path / "venv" / os.path.relpath(site, tmp_path / "venv"), "tt_smi-3.0.39.dist-info", "tt-smi", "3.0.39")
    said = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('tt-smi'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert installed.venv_distributions(str(tmp_path / "venv"), ["tt-smi"]) == {"tt-smi": said}


def test_path_link_reports_links_dangling_links_and_plain_paths(tmp_path):
    (tmp_path / "releases" / "v0.20.0").mkdir(parents=True)
    os.symlink("releases/v0.20.0", tmp_path / "current")
    os.symlink("releases/v9.9.9", tmp_path / "dangling")
    assert installed.path_link(str(tmp_path / "current")) == {
        "path": str(tmp_path / "current"),
        "exists": True,
        "link_target": str(tmp_path / "releases" / "v0.20.0"),
    }
    assert installed.path_link(str(tmp_path / "dangling"))["exists"] is True
    assert installed.path_link(str(tmp_path / "releases"))["link_target"] is None
    assert installed.path_link(str(tmp_path / "absent")) == {
        "path": str(tmp_path / "absent"),
        "exists": False,
        "link_target": None,
    }


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl")
def test_unit_states_never_raises(tmp_path):
    states = installed.unit_states(["ttfleet-no-such-unit.service"], timeout=10)
    assert set(states["ttfleet-no-such-unit.service"]) == {"active", "enabled"}


def test_unit_states_reads_systemctl_show(tmp_path, monkeypatch):
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!{sys.executable}\nprint('ActiveState=active'); print('UnitFileState=enabled')\n")
    fake.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert installed.unit_states(["docker.service"]) == {"docker.service": {"active": "active", "enabled": "enabled"}}
    fake.write_text("#!/bin/sh\nexit 1\n")
    assert installed.unit_states(["docker.service"]) == {"docker.service": {"active": None, "enabled": None}}
