"""The status playbook run by the real ansible-playbook (issue 14, AWX): the set_stats summary that AWX keeps as the
job's artifacts, the report files in status_report_dir, a failed run for a host that does not answer, a --limit that
leaves localhost out, status_report_write=false and a relative status_report_dir."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

PLAYBOOK = os.path.join(ROOT, "playbooks", "status.yml")
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# Never in the summary, the report or the output, although every host has it.
SECRET = "hf_status_playbook_must_not_leak_0123456789"


def _collections_path():
    """The tree that holds ttfleet.inference (the checkout's .ansible/collections link, or the real
    ansible_collections/ttfleet/inference path ansible-test copies to) and the one that holds ansible.posix."""
    paths = []
    parts = ROOT.split(os.sep)
    if parts[-3:-2] == ["ansible_collections"]:
        paths.append(os.sep.join(parts[:-3]))
    paths.append(os.path.join(ROOT, ".ansible", "collections"))
    return os.pathsep.join(paths)


@pytest.fixture
def fleet(tmp_path):
    """A throwaway inventory: a host that does not answer, one with a release installed, one bare."""
    ttis = tmp_path / "ttis"
    for tag in ("v0.19.0", "v0.20.0"):
        (ttis / "releases" / tag).mkdir(parents=True)
    (ttis / "current").symlink_to("releases/v0.20.0")
    (ttis / "previous").symlink_to("releases/v0.19.0")
    (tmp_path / "bare").mkdir()
    local = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "tt_volume_root": str(tmp_path),
    }
    inventory = {
        "all": {
            "hosts": {
                "down": {
                    "ansible_connection": "ssh",
                    "ansible_host": "127.0.0.1",
                    "ansible_port": 1,
                    "ansible_ssh_common_args": "-o ConnectTimeout=5",
                },
                "here": {**local, "tt_release_root": str(ttis)},
                "bare": {**local, "tt_release_root": str(tmp_path / "bare")},
            },
            "vars": {"hf_token": SECRET, "status_health_timeout": 2},
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\nretry_files_enabled = False\n")
    return tmp_path


def run_status(tmp_path, cwd, *args):
    """ansible-playbook status.yml with the json callback; returns (rc, report, stdout)."""
    cwd.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(
        {
            "PWD": str(cwd),
            "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": _collections_path(),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_SHOW_CUSTOM_STATS": "1",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local-tmp"),
            "ANSIBLE_REMOTE_TMP": str(tmp_path / "remote-tmp"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp"),
            "ANSIBLE_NOCOLOR": "1",
        }
    )
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.json"), PLAYBOOK, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(
            f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.returncode, report, proc.stdout + proc.stderr


def failures(report):
    found = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed") and not result.get("ignore_errors"):
                    found.setdefault(task["task"]["name"], {})[host] = result.get("msg")
    return found


def test_status_publishes_summary_writes_report_and_fails_for_host_that_does_not_answer(fleet):
    reports = fleet / "reports"
    rc, report, output = run_status(fleet, fleet / "cwd", "-e", f"status_report_dir={reports}")

    assert rc == 2, output[-3000:]
    summary = report["global_custom_stats"]["ttfleet_status"]
    assert report["custom_stats"] == {}, "the summary is one custom stat for the run, not per host"
    generated_at = summary.pop("generated_at")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", generated_at), generated_at
    assert summary == {
        "healthy": False,
        "hosts": 3,
        "reachable": 2,
        "unreachable": ["down"],
        "unhealthy": [],
        "instances": 0,
        "healthy_instances": 0,
        "releases": {"v0.20.0": 1, "none": 1},
        "report_dir": str(reports),
    }
    # The play fails at its last task, once, naming the host; the summary was published before.
    failed = failures(report)
    assert list(failed) == ["Fail when an instance is unhealthy or a host did not answer"], failed
    (message,) = failed["Fail when an instance is unhealthy or a host did not answer"].values()
    assert "could not be read: down." in message and str(reports / "fleet-status.html") in message

    assert sorted(os.listdir(reports)) == ["fleet-status.html", "fleet-status.json"]
    written = json.loads((reports / "fleet-status.json").read_text())
    assert written["generated_at"] == generated_at
    rows = {row["host"]: row for row in written["hosts"]}
    assert [row["host"] for row in written["hosts"]] == ["down", "here", "bare"]
    assert rows["down"]["reachable"] is False
    assert rows["here"]["reachable"] is True and rows["bare"]["reachable"] is True
    assert (rows["here"]["release"], rows["here"]["previous_release"]) == ("v0.20.0", "v0.19.0")
    assert rows["bare"]["release"] is None
    html = (reports / "fleet-status.html").read_text()
    assert '<tr class="unreachable"><td>down</td>' in html and "v0.20.0" in html
    assert "1 hosts did not answer" in html
    assert not (fleet / "cwd" / "reports").exists()
    for text in (output, html, json.dumps(written)):
        assert SECRET not in text


def test_status_with_limit_and_without_files_still_reports(fleet):
    cwd = fleet / "cwd"
    rc, report, output = run_status(fleet, cwd, "--limit", "bare", "-e", "status_report_write=false")

    # --limit leaves localhost out of the play: the report still runs, on the limited hosts only.
    assert rc == 0, output[-3000:]
    summary = report["global_custom_stats"]["ttfleet_status"]
    assert {
        key: summary[key] for key in ("healthy", "hosts", "reachable", "unreachable", "releases", "report_dir")
    } == {
        "healthy": True,
        "hosts": 1,
        "reachable": 1,
        "unreachable": [],
        "releases": {"none": 1},
        "report_dir": None,
    }
    assert failures(report) == {}
    assert os.listdir(cwd) == [], "status_report_write=false wrote files"


def test_status_default_report_dir_is_pwd_reports(fleet):
    cwd = fleet / "cwd"
    rc, report, output = run_status(fleet, cwd, "--limit", "here")

    assert rc == 0, output[-3000:]
    assert report["global_custom_stats"]["ttfleet_status"]["report_dir"] == str(cwd / "reports")
    assert sorted(os.listdir(cwd / "reports")) == ["fleet-status.html", "fleet-status.json"]


def test_status_refuses_relative_report_dir_before_reading_hosts(fleet):
    rc, report, output = run_status(fleet, fleet / "cwd", "-e", "status_report_dir=reports")

    assert rc == 2, output[-3000:]
    failed = failures(report)
    assert list(failed) == ["Check status_report_dir"], failed
    (message,) = failed["Check status_report_dir"].values()
    assert "status_report_dir must be an absolute directory on the controller, not reports" in message
    assert "status_report_write=false" in message
    assert "global_custom_stats" not in report or not report["global_custom_stats"]
    assert not (fleet / "cwd" / "reports").exists()
