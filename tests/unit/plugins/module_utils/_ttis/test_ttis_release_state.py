# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_ttis/release_state.py and the release_state module: the release layout inference_server reads in one call."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.filter.releases import release_links
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import release_state
from ansible_collections.ttfleet.inference.plugins.modules import release_state as release_state_module

MARKER = ".ttfleet-release.json"


def _install(root, tag, commit="abc123", mtime=None, pyyaml="6.0.3"):
    release = root / "releases" / tag
    release.mkdir(parents=True)
    (release / MARKER).write_text(json.dumps({"tag": tag, "commit": commit}))
    if mtime is not None:
        os.utime(release / MARKER, (mtime, mtime))
    site = root / "venvs" / tag / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / f"PyYAML-{pyyaml}.dist-info").mkdir()
    (root / "venvs" / tag / "bin").mkdir()
    os.symlink(sys.executable, root / "venvs" / tag / "bin" / "python")


def test_a_converged_layout(tmp_path):
    _install(tmp_path, "v0.18.0", mtime=1000)
    _install(tmp_path, "v0.20.0", commit="def456", mtime=2000)
    os.symlink("releases/v0.20.0", tmp_path / "current")
    os.symlink("releases/v0.18.0", tmp_path / "previous")
    state = release_state.read(str(tmp_path), "v0.20.0", MARKER, "6.0.3")
    assert state["release"]["exists"] and state["release"]["isdir"]
    assert state["release"]["marker"] == {"tag": "v0.20.0", "commit": "def456"}
    assert state["release"]["marker_error"] is None
    assert state["venv"] == {"python": True, "pyyaml": True}
    assert [link["stat"]["lnk_target"] for link in state["links"]] == ["releases/v0.20.0", "releases/v0.18.0"]
    assert state["root"]["isdir"] is True
    # What tasks/links.yml plans from it, through the same filter as before (find files and stat results).
    plan = release_links(state["markers"], "v0.20.0", 2, True, state["links"])
    assert plan["installed"] == ["v0.18.0", "v0.20.0"]
    assert plan["pruned"] == []
    assert plan["link_previous"] is False and plan["previous"] == "v0.18.0"


def test_a_bare_host(tmp_path):
    state = release_state.read(str(tmp_path / "absent"), "v0.20.0", MARKER, "6.0.3")
    assert state["root"]["exists"] is False
    assert state["release"] == {
        "exists": False, "isdir": False, "uid": None, "gid": None, "mode": None, "marker": None, "marker_error": None,
    }  # fmt: skip
    assert state["venv"] == {"python": False, "pyyaml": False}
    assert [link["stat"]["exists"] for link in state["links"]] == [False, False]
    assert state["markers"] == []


def test_the_wrong_pyyaml_and_no_interpreter_are_not_installed(tmp_path):
    _install(tmp_path, "v0.20.0", pyyaml="6.0.2")
    os.unlink(tmp_path / "venvs" / "v0.20.0" / "bin" / "python")
    assert release_state.read(str(tmp_path), "v0.20.0", MARKER, "6.0.3")["venv"] == {"python": False, "pyyaml": False}


def test_markers_count_only_real_directories_with_a_regular_marker(tmp_path):
    _install(tmp_path, "v0.20.0")
    (tmp_path / "releases" / "v0.19.0").mkdir()  # an interrupted install: no marker
    os.symlink(tmp_path / "releases" / "v0.20.0", tmp_path / "releases" / "v0.21.0")  # a linked directory
    (tmp_path / "releases" / "v0.17.0").mkdir()
    os.symlink(tmp_path / "releases" / "v0.20.0" / MARKER, tmp_path / "releases" / "v0.17.0" / MARKER)
    found = release_state.markers(str(tmp_path / "releases"), MARKER)
    assert [os.path.basename(os.path.dirname(item["path"])) for item in found] == ["v0.20.0"]


@pytest.mark.parametrize(
    ("content", "error"),
    [(b"[1, 2]", "not a JSON object"), (b"{not json", "not JSON"), (b"\xff\xfe", "not JSON")],
)
def test_a_marker_that_is_not_an_install_s_is_reported_never_loaded(tmp_path, content, error):
    (tmp_path / "releases" / "v0.20.0").mkdir(parents=True)
    (tmp_path / "releases" / "v0.20.0" / MARKER).write_bytes(content)
    release = release_state.read(str(tmp_path), "v0.20.0", MARKER)["release"]
    assert release["marker"] is None
    assert error in release["marker_error"] and "move it away" in release["marker_error"]


def test_a_linked_marker_or_release_directory_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / MARKER).write_text('{"commit": "abc"}')
    (tmp_path / "releases" / "v0.20.0").mkdir(parents=True)
    os.symlink(elsewhere / MARKER, tmp_path / "releases" / "v0.20.0" / MARKER)
    release = release_state.read(str(tmp_path), "v0.20.0", MARKER)["release"]
    assert release["marker"] is None and "cannot be read" in release["marker_error"]
    os.symlink(elsewhere, tmp_path / "releases" / "v0.21.0")
    release = release_state.read(str(tmp_path), "v0.21.0", MARKER)["release"]
    assert release["exists"] is True and release["isdir"] is False and release["marker"] is None


def _run(args, capsys):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        release_state_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_reads_packages_and_the_interpreter(tmp_path, capsys):
    _install(tmp_path, "v0.20.0")
    args = {"root": str(tmp_path), "version": "v0.20.0", "packages": ["ttfleet-no-such-package"]}
    code, result = _run(dict(args, python=sys.executable), capsys)
    assert code == 0 and result["changed"] is False
    assert result["packages"] == {"ttfleet-no-such-package": None}
    assert result["python_version"] == "%d.%d" % sys.version_info[:2]
    assert result["release"]["marker"]["commit"] == "abc123"


def test_module_refuses_an_old_or_missing_interpreter(tmp_path, capsys):
    code, result = _run({"root": str(tmp_path), "version": "v0.20.0", "python": sys.executable, "python_min": "9.0"},
                        capsys)  # fmt: skip
    assert code == 1 and "run.py needs 9.0 or later" in result["msg"]
    assert "inference_server_python_interpreter" in result["msg"]
    code, result = _run({"root": str(tmp_path), "version": "v0.20.0", "python": str(tmp_path / "no-python")}, capsys)
    assert code == 1 and "cannot run" in result["msg"]


@pytest.mark.parametrize(("name", "value"), [("version", "../etc"), ("marker", "a/b"), ("root", "relative")])
def test_module_refuses_paths_outside_the_layout(tmp_path, capsys, name, value):
    args = {"root": str(tmp_path), "version": "v0.20.0", name: value}
    code, result = _run(args, capsys)
    assert code == 1 and name in result["msg"]
