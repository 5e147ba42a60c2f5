# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The serve_unit module against a recording systemctl (a test stand-in on PATH) and a stand-in wrapper."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.modules import serve_unit

SYSTEMCTL = """#!{python}
import json, os, sys
log = os.environ["FAKE_SYSTEMCTL_LOG"]
with open(log, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\\n")
states = json.loads(os.environ.get("FAKE_SYSTEMCTL_STATES", "{{}}"))
if sys.argv[1] == "show":
    state = states.get(sys.argv[-1], {{}})
    print("ActiveState=" + state.get("active", "active"))
    print("UnitFileState=" + state.get("enabled", "enabled"))
    print("LoadState=" + state.get("load", "loaded"))
elif sys.argv[1] in os.environ.get("FAKE_SYSTEMCTL_FAIL", "").split(","):
    print("Job for unit failed", file=sys.stderr)
    sys.exit(1)
"""

WRAPPER = """import json, os, sys
assert sys.argv[1] == "ready"
if os.environ.get("FAKE_NOT_READY"):
    print("http://127.0.0.1:8000/health answered 503, not 200, within 5 s", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"health": 200, "models": ["m/" + sys.argv[2]]}))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(SYSTEMCTL.format(python=sys.executable))
    systemctl.chmod(stat.S_IRWXU)
    wrapper = tmp_path / "ttfleet-serve"
    wrapper.write_text(WRAPPER)
    log = tmp_path / "calls"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(log))

    def run(states=None, check=False, **args):
        monkeypatch.setenv("FAKE_SYSTEMCTL_STATES", json.dumps(states or {}))
        args = {"instance": "qwen3-32b", "python": sys.executable, "wrapper": str(wrapper), **args}
        if check:
            args["_ansible_check_mode"] = True
        log.write_text("")
        with patch_module_args(args), pytest.raises(SystemExit) as exc:
            serve_unit.main()
        return exc.value.code, [line for line in log.read_text().splitlines() if not line.startswith("show")]

    return run


SERVICE, TIMER = "tt-serve@qwen3-32b.service", "tt-serve-health@qwen3-32b.timer"


def test_a_running_instance_is_only_waited_for(fake, capsys):
    code, calls = fake()
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["changed"] is False and calls == []
    assert result["ready"] == {"health": 200, "models": ["m/qwen3-32b"]}


def test_a_stopped_disabled_instance_is_enabled_started_and_waited_for(fake, capsys):
    code, calls = fake({SERVICE: {"active": "inactive", "enabled": "disabled"}, TIMER: {"active": "failed"}},
                       daemon_reload=True)  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["changed"] is True
    assert calls == ["daemon-reload", f"enable -- {SERVICE}", f"start -- {SERVICE}", f"start -- {TIMER}"]
    assert result["ready"]["health"] == 200


def test_restarted_restarts_even_an_active_instance(fake, capsys):
    code, calls = fake(state="restarted")
    assert code == 0 and json.loads(capsys.readouterr().out)["changed"] is True
    assert calls == [f"restart -- {SERVICE}"]


def test_check_mode_changes_nothing_and_waits_only_for_an_instance_that_stays(fake, capsys, monkeypatch):
    code, calls = fake({SERVICE: {"active": "inactive"}}, check=True)
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and calls == [] and result["changed"] is True and result["ready"] is None
    code, calls = fake(check=True, state="restarted")
    result = json.loads(capsys.readouterr().out)
    assert calls == [] and result["changed"] is True and result["ready"] is None
    monkeypatch.setenv("FAKE_NOT_READY", "1")
    code, _calls = fake(check=True)
    assert code == 1 and "did not become ready" in json.loads(capsys.readouterr().out)["msg"]


def test_a_failed_start_or_wait_fails_with_the_reason(fake, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "start")
    code, _calls = fake({SERVICE: {"active": "failed"}})
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and f"systemctl start -- {SERVICE} failed" in result["msg"]
    assert "Job for unit failed" in result["msg"]
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "")
    monkeypatch.setenv("FAKE_NOT_READY", "1")
    code, _calls = fake()
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and "answered 503" in result["msg"] and f"journalctl -u {SERVICE}" in result["msg"]


@pytest.mark.parametrize("instance", ["../x", "Qwen", "a b", "-x", ""])
def test_refuses_what_is_not_an_instance_name(fake, capsys, instance):
    code, calls = fake(instance=instance)
    assert code == 1 and calls == [] and "instance name" in json.loads(capsys.readouterr().out)["msg"]
