"""Issue 34: the two modules that replaced builtin file, copy, template, stat, find and slurp tasks, against uid 1000.

root_files writes root's units, wrapper and configuration; release_state reads the release layout, its marker and its
links. Both run as root on every host. A user who can write a directory on the way must not get root to write, chmod
or read anything outside it: links are refused or read as links, never followed, and a directory a user other than
root can write holds no file of root's.
"""

from __future__ import annotations

import json
import os

from conftest import attacker


def _root_owned(arena, name):
    directory = arena.private / name
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    return directory


def test_root_files_writes_nothing_into_a_directory_a_user_can_write(arena):
    result = arena.module("root_files", {"files": [{"path": str(arena.home / "unit.service"), "content": "x\n"}]})
    assert result.failed and "other than root" in result["msg"], result
    assert not os.path.lexists(arena.home / "unit.service")
    arena.assert_victims_intact()


def test_root_files_does_not_follow_a_link_planted_on_the_way(arena):
    """uid 1000 turns a directory of the path into a link to the root-only directory: nothing is written there."""
    attacker("ln", "-s", arena.victim_dir, arena.home / "etc")
    result = arena.module(
        "root_files",
        {"directories": [{"path": str(arena.home / "etc"), "mode": "0777"}],
         "files": [{"path": str(arena.home / "etc" / "config.json"), "content": "{}\n"}]},
    )  # fmt: skip
    assert result.failed and "not followed" in result["msg"], result
    planted = str(arena.home / "etc" / "config.json")
    result = arena.module("root_files", {"files": [{"path": planted, "content": "{}\n"}]})
    assert result.failed, result
    arena.assert_victims_intact()


def test_root_files_refuses_a_link_where_its_file_belongs(arena):
    """A link at the file's name in root's own directory (left by an earlier compromise) is refused, not replaced."""
    directory = _root_owned(arena, "units")
    os.symlink(arena.victim, directory / "tt-serve@.service")
    result = arena.module("root_files", {"files": [{"path": str(directory / "tt-serve@.service"), "content": "x\n"}]})
    assert result.failed and "symbolic link" in result["msg"], result
    assert os.path.islink(directory / "tt-serve@.service")
    arena.assert_victims_intact()


def test_root_files_keeps_root_s_files_and_removes_only_its_own(arena):
    directory = _root_owned(arena, "serve")
    unit = directory / "a.conf"
    args = {"files": [{"path": str(unit), "content": "one\n"}, {"path": str(directory / "gone.json"), "content": None}]}
    first = arena.module("root_files", args)
    again = arena.module("root_files", args)
    assert not first.failed and first["changed"] and not again["changed"], (first, again)
    assert unit.read_text() == "one\n" and os.stat(unit).st_uid == 0 and oct(os.stat(unit).st_mode & 0o777) == "0o644"
    arena.assert_victims_intact()


def test_release_state_reads_no_file_through_a_planted_link(arena):
    """uid 1000 owns the release root: its marker and its release directory are links to root's secrets. The result
    (which Ansible shows and registers) never holds them."""
    releases = arena.home / "releases"
    attacker("mkdir", "-p", releases / "v0.20.0")
    attacker("ln", "-s", arena.victim, releases / "v0.20.0" / ".ttfleet-release.json")
    attacker("ln", "-s", arena.victim_dir, releases / "v0.21.0")
    attacker("ln", "-s", arena.victim_dir, arena.home / "current")
    for version in ("v0.20.0", "v0.21.0"):
        result = arena.module("release_state", {"root": str(arena.home), "version": version})
        assert not result.failed, result
        assert result["release"]["marker"] is None, result
        assert arena.secret not in json.dumps(result), result
        assert result["links"][0]["stat"]["lnk_target"] == str(arena.victim_dir)
        assert result["markers"] == []
    arena.assert_victims_intact()
