# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_fs/root_files.py and the root_files module: root's directories and small files, many in one call."""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.root_files import RootFilesError, keep
from ansible_collections.ttfleet.inference.plugins.modules import root_files as root_files_module


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_creates_then_leaves_directories_and_files_alone(tmp_path):
    os.chmod(tmp_path, 0o755)
    dirs = [{"path": str(tmp_path / "etc" / "serve")}, {"path": str(tmp_path / "state"), "mode": "0750"}]
    files = [{"path": str(tmp_path / "etc" / "serve" / "a.conf"), "content": "a\n"},
             {"path": str(tmp_path / "state" / "a.json"), "content": "{}\n", "mode": "0600"}]  # fmt: skip
    first = keep(dirs, files)
    assert first["changed"] is True
    assert all(r["changed"] for r in first["files"].values())
    assert all(r["changed"] for r in first["directories"].values())
    assert (tmp_path / "etc" / "serve" / "a.conf").read_text() == "a\n"
    assert _mode(tmp_path / "state") == 0o750 and _mode(tmp_path / "state" / "a.json") == 0o600
    again = keep(dirs, files)
    assert again["changed"] is False and again["diff"] == []


def test_fixes_content_and_mode_and_removes_absent_files(tmp_path):
    os.chmod(tmp_path, 0o755)
    conf = tmp_path / "a.conf"
    conf.write_text("old\n")
    os.chmod(conf, 0o600)
    gone = tmp_path / "spec.json"
    gone.write_text("{}")
    result = keep([], [{"path": str(conf), "content": "new\n"}, {"path": str(gone), "content": None}])
    assert result["files"] == {
        str(conf): {"changed": True, "state": "present"},
        str(gone): {"changed": True, "state": "absent"},
    }
    assert conf.read_text() == "new\n" and _mode(conf) == 0o644 and not gone.exists()
    assert [d["before"] for d in result["diff"]] == ["old\n", "{}"]
    os.chmod(conf, 0o640)
    assert keep([], [{"path": str(conf), "content": "new\n"}])["changed"] is True
    assert _mode(conf) == 0o644
    assert keep([], [{"path": str(gone), "content": None}])["changed"] is False


def test_check_mode_changes_nothing_and_plans_files_in_missing_directories(tmp_path):
    os.chmod(tmp_path, 0o755)
    conf = tmp_path / "a.conf"
    conf.write_text("old\n")
    result = keep([{"path": str(tmp_path / "new")}],
                  [{"path": str(conf), "content": "new\n"}, {"path": str(tmp_path / "new" / "b"), "content": "b"}],
                  check_mode=True)  # fmt: skip
    assert result["changed"] is True and result["files"][str(tmp_path / "new" / "b")]["changed"] is True
    assert conf.read_text() == "old\n" and not (tmp_path / "new").exists()


def test_refuses_links_special_files_and_bad_input_naming_them(tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "target").write_text("keep\n")
    os.symlink(tmp_path / "target", tmp_path / "link.conf")
    with pytest.raises(RootFilesError, match=r"symbolic link.*left untouched"):
        keep([], [{"path": str(tmp_path / "link.conf"), "content": "x"}])
    assert (tmp_path / "target").read_text() == "keep\n"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RootFilesError, match=r"fifo|FIFO|not a regular file"):
        keep([], [{"path": str(tmp_path / "fifo"), "content": "x"}])
    with pytest.raises(RootFilesError, match="not a directory"):
        keep([{"path": str(tmp_path / "target")}], [])
    with pytest.raises(RootFilesError, match="absolute, normalised"):
        keep([], [{"path": "relative/x", "content": "x"}])
    with pytest.raises(RootFilesError, match="not an octal mode"):
        keep([], [{"path": str(tmp_path / "m"), "content": "x", "mode": "rw-r--r--"}])
    with pytest.raises(RootFilesError, match="does not exist"):
        keep([], [{"path": str(tmp_path / "missing" / "x"), "content": "x"}])


def test_module_reports_per_path_and_a_diff_only_when_asked(tmp_path, capsys):
    os.chmod(tmp_path, 0o755)
    args = {"files": [{"path": str(tmp_path / "a.conf"), "content": "a\n"}], "_ansible_diff": True}
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        root_files_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0 and result["changed"] is True
    assert result["files"][str(tmp_path / "a.conf")]["changed"] is True
    assert result["diff"][0]["after"] == "a\n"
    with patch_module_args(dict(args, _ansible_diff=False)), pytest.raises(SystemExit):
        root_files_module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is False and "diff" not in result


def test_lists_matching_entries_of_a_kept_directory_without_following_them(tmp_path):
    os.chmod(tmp_path, 0o755)
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "a.json").write_text("{}")
    (state / ".hidden.json").write_text("{}")
    (state / "notes.txt").write_text("")
    os.symlink("/etc/passwd", state / "b.json")
    result = keep([{"path": str(state), "list": "*.json"}], [])
    assert result["directories"][str(state)]["entries"] == [
        {"path": str(state / "a.json"), "isreg": True},
        {"path": str(state / "b.json"), "isreg": False},
    ]
    assert "entries" not in keep([{"path": str(state)}], [])["directories"][str(state)]
    planned = keep([{"path": str(tmp_path / "new"), "list": "*.json"}], [], check_mode=True)
    assert planned["directories"][str(tmp_path / "new")] == {"changed": True, "entries": []}


def test_a_directory_link_in_root_s_own_directory_is_followed_as_the_file_module_does(tmp_path):
    """tt_volume_root may be an operator's link to a bigger disk: in a root-only directory it is followed."""
    os.chmod(tmp_path, 0o755)
    (tmp_path / "disk").mkdir(mode=0o700)
    os.symlink(tmp_path / "disk", tmp_path / "tt-cache")
    result = keep([{"path": str(tmp_path / "tt-cache")}], [])
    assert result["changed"] is True and _mode(tmp_path / "disk") == 0o755 and os.path.islink(tmp_path / "tt-cache")
