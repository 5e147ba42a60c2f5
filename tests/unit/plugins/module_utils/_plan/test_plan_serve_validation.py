"""Validation at the boundary for serving (issue 13, Broke 9 and 10): role arguments that reach unit files, and the
serve env file (a small UTF-8 regular file in a root-only directory, never overwritten when it cannot be read)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import serve as _serve
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve import ServeError
from ansible_collections.ttfleet.inference.plugins.modules import serve_env as serve_env_module

# tests/unit/plugins/module_utils/_plan/<this file>: six levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        serve_env_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


# --- the env file ---------------------------------------------------------------------------------------------------


def test_non_utf8_env_file_names_file_and_offset_and_is_kept(tmp_path, capsys):
    path = tmp_path / "qwen.env"
    content = b"# header\nVLLM_API_KEY=abc\xffdef\n"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    code, result = run_module(capsys, {"path": str(path), "engine": "vLLM"})
    assert code == 1
    assert str(path) in result["msg"] and "offset 25" in result["msg"] and "0xff" in result["msg"]
    assert "left untouched" in result["msg"]
    assert path.read_bytes() == content


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_env_file_that_is_not_a_regular_file_is_refused_and_kept(tmp_path, capsys, kind):
    path = tmp_path / "x.env"
    victim = tmp_path / "victim"
    victim.write_text("root secret\n")
    os.chmod(victim, 0o600)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        os.symlink(victim, path)
    else:
        path.mkdir()
    outcome = {}

    def run():
        outcome["result"] = run_module(capsys, {"path": str(path), "engine": "vLLM"})

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "serve_env blocked"
    code, result = outcome["result"]
    assert code == 1 and str(path) in result["msg"]
    assert victim.read_text() == "root secret\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert os.path.lexists(path) and {"fifo": stat.S_ISFIFO, "symlink": stat.S_ISLNK, "directory": stat.S_ISDIR}[kind](
        os.lstat(path).st_mode
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the directory check applies to root")
def test_env_file_directory_must_be_root_only(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    code, result = run_module(capsys, {"path": str(shared / "x.env"), "engine": "vLLM"})
    assert code == 1 and str(shared) in result["msg"] and "chmod go-w" in result["msg"]
    assert not (shared / "x.env").exists()


def test_env_file_is_written_through_a_random_temporary_name(tmp_path, capsys):
    # A name planted where the old code put its temporary file changes nothing.
    planted = tmp_path / ".serve-env.planted"
    planted.write_text("planted\n")
    code, result = run_module(capsys, {"path": str(tmp_path / "x.env"), "engine": "media"})
    assert code == 0 and result["changed"]
    assert sorted(os.listdir(tmp_path)) == [".serve-env.planted", "x.env"]
    assert stat.S_IMODE((tmp_path / "x.env").stat().st_mode) == 0o600
    assert planted.read_text() == "planted\n"


@pytest.mark.parametrize("value", ["key\n", "a\nB=c", "with space"])
def test_env_values_with_line_breaks_are_refused(value):
    with pytest.raises(ServeError):
        _serve.render_env({"API_KEY": value})


def test_instance_names_with_a_trailing_newline_are_refused():
    with pytest.raises(ServeError):
        _serve.instance_name({"name": "x", "instance": "qwen\n"})


# --- role arguments that reach the unit files -------------------------------------------------------------------------

# Each host of one local run gets its own value; the role's assert.yml must accept or refuse it.
UNIT_VALUES = {
    "good_default": None,
    "good_plain": "dev-hugepages.mount",
    "bad_newline": "dev-hugepages\\x2d1G.mount\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'",
    "bad_trailing_newline": "dev-hugepages.mount\n",
    "bad_space": "dev-hugepages.mount other.service",
    "bad_specifier": "dev-%i.mount",
    "bad_suffix": "dev-hugepages",
}


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible-playbook")
def test_role_refuses_unit_names_that_would_add_directives(tmp_path):
    hosts = {}
    for host, value in UNIT_VALUES.items():
        hosts[host] = {} if value is None else {"serve_hugepages_mount_unit": value}
    inventory = {
        "all": {
            "hosts": hosts,
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "tt_models": [],
                "tt_device": "p150",
            },
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(
        textwrap.dedent(
            """\
            - hosts: all
              gather_facts: false
              tasks:
                - ansible.builtin.include_role:
                    name: ttfleet.inference.serve
                    tasks_from: assert
            """
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(ROOT, ".ansible", "collections"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    report = json.loads(proc.stdout)
    failures = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed"):
                    failures[host] = result["msg"]
    assert sorted(failures) == sorted(host for host in UNIT_VALUES if host.startswith("bad_")), proc.stdout[-3000:]
    for host, message in failures.items():
        assert "serve_hugepages_mount_unit" in message and json.dumps(UNIT_VALUES[host]) in message
        assert "Fix it in the inventory" in message
