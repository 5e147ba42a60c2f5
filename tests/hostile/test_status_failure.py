"""Issue 29 case 9b: the status playbook's final failure message and summary, with a host whose state names its
instances with terminal control sequences.

A compromised or broken host answers ``fleet_status`` with any instance names and release it likes (the names are the
file names under its state directory). The table, the HTML and the JSON report were escaped; the failure message
(``[ERROR]: Task failed: ... Unhealthy instances: <host>/<instance>``) printed them raw, so an OSC sequence retitled
the operator's terminal and ``ESC [2J`` cleared it. Run by the real ansible-playbook with the default callback, the
host's module result standing in through an extra var (the highest precedence, as the registered result it replaces).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import status as _status

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
PLAYBOOK = os.path.join(ROOT, "playbooks", "status.yml")
TITLE, CLEAR = "\x1b]0;pwned\x07", "\x1b[2J"
# Every byte that acts on a terminal: C0 but newline and tab, DEL, C1 (0x9b is a one-byte CSI), line and bidi overrides.
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _collections_path():
    parts = ROOT.split(os.sep)
    paths = [os.sep.join(parts[:-3])] if parts[-3:-2] == ["ansible_collections"] else []
    return os.pathsep.join([*paths, os.path.join(ROOT, ".ansible", "collections")])


NAMES = [TITLE, CLEAR + "\r\nfatal: [db-1]: forged\u202e\x9b[31m"]


def _no_systemd(argv, **_kwargs):
    """systemctl as on a host without it: the unit cannot be asked."""
    raise FileNotFoundError(2, "No such file or directory", argv[0])


def _hostile_state(tmp_path):
    """What the real fleet_status code reports on a host whose state directory names two instances to act on a
    terminal (files ``<name>.json`` with no port: unhealthy)."""
    state = tmp_path / "state"
    state.mkdir()
    for name in NAMES:
        (state / f"{name}.json").write_text(json.dumps({"model": "Qwen3-32B"}))
    report = _status.host_report(str(state), str(tmp_path / "ttis"), timeout=1, runner=_no_systemd)
    assert sorted(report["unhealthy"]) == sorted(NAMES), report
    # The release link's name is the host's too.
    return dict(report, release="v0.20.0" + CLEAR)


def _run_status(tmp_path, state, *args):
    """The real status playbook on one local host whose fleet_status result is ``state``; returns (rc, output)."""
    (tmp_path / "ttis").mkdir(exist_ok=True)
    inventory = {
        "all": {
            "hosts": {
                "qb2-1": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "tt_release_root": str(tmp_path / "ttis"),
                    "tt_volume_root": str(tmp_path),
                }
            }
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "state.json").write_text(json.dumps({"status_host_report": state}))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=_collections_path(),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        ANSIBLE_SHOW_CUSTOM_STATS="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "local-tmp"),
        ANSIBLE_REMOTE_TMP=str(tmp_path / "remote-tmp"),
        ANSIBLE_NOCOLOR="1",
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
    )
    proc = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(tmp_path / "inventory.json"),
            PLAYBOOK,
            "-e",
            f"@{tmp_path / 'state.json'}",
            *args,
        ],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "replace")


@pytest.mark.broke29(9)
@pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason="ansible-playbook is not installed")
def test_status_failure_message_escapes_the_instance_names_of_a_host(tmp_path):
    rc, output = _run_status(tmp_path, _hostile_state(tmp_path), "-e", "status_report_write=false")
    # The play fails at its last task, for the two unhealthy instances.
    assert rc == 2, output[-3000:]
    assert "Unhealthy instances: qb2-1/" in output, output[-3000:]
    raw = sorted({repr(char) for char in UNSAFE.findall(output)})
    assert not raw, f"control characters of the host reached the terminal: {raw}\n{output[-3000:]}"
    assert "qb2-1/\\x1b[2J\\r\\nfatal: [db-1]: forged\\u202e\\x9b[31m, qb2-1/\\x1b]0;pwned\\x07." in output
    assert not re.search(r"^fatal: \[db-1\]", output, re.M), "the host forged a line of the play's output"


@pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason="ansible-playbook is not installed")
def test_status_report_is_written_for_a_host_whose_units_cannot_be_asked(tmp_path):
    state = _hostile_state(tmp_path)
    reports = tmp_path / "reports"
    rc, output = _run_status(tmp_path, state, "-e", f"status_report_dir={reports}")
    # The last task fails the play, not the HTML report (a unit without NRestarts, ansible-core 2.19's templating).
    assert rc == 2 and "Unhealthy instances: qb2-1/" in output, output[-3000:]
    assert not UNSAFE.search(output), output[-3000:]
    # The JSON keeps the host's data as data; the HTML has a row per instance.
    written = json.loads((reports / "fleet-status.json").read_text())
    assert [item["instance"] for item in written["hosts"][0]["instances"]] == state["unhealthy"]
    assert [item["unit"]["available"] for item in written["hosts"][0]["instances"]] == [False, False]
    html = (reports / "fleet-status.html").read_text()
    assert html.count("<td>Qwen3-32B</td>") == 2, html
