"""The progress machinery of the action plugins (plugins/plugin_utils/progress_action.py): progress lines, polling and
clean-up, through the model_weights plugin.
"""

import itertools
import json
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.ttfleet.inference.plugins.action import model_weights
from ansible_collections.ttfleet.inference.plugins.plugin_utils import progress_action as act


@pytest.mark.parametrize(
    "value,expected", [(None, 25.0), ("", 25.0), (5, 5.0), ("0.5", 0.5), ("2", 2.0)]
)
def test_interval(value, expected):
    assert act.parse_interval(value) == expected


@pytest.mark.parametrize("value", [0, -1, "soon", 7200])
def test_bad_interval_names_the_variable(value):
    with pytest.raises(AnsibleActionFail, match="ttfleet_progress_interval must be a number of seconds"):
        act.parse_interval(value)


def test_progress_line_has_bytes_rate_and_eta():
    status = {"state": "running", "done_bytes": 3 << 30, "total_bytes": 12 << 30, "rate": 100 << 20, "eta": 92.2,
              "file": "model-00001-of-00004.safetensors"}
    assert act.progress_line("qb2", status, 40) == (
        "qb2: model_weights 3.0 GiB of 12.0 GiB (25.0%) at 100.0 MiB/s, ETA 1m32s [model-00001-of-00004.safetensors]"
    )
    assert act.progress_line("qb2", status, 40, show_file=False).endswith("ETA 1m32s")
    assert act.progress_line("qb2", {**status, "eta": None, "state": "stopped"}, 1).endswith(
        "ETA unknown, stopped [model-00001-of-00004.safetensors]"
    )
    assert act.progress_line("qb2", None, 3725) == (
        "qb2: model_weights running for 1h02m05s, no bytes moving yet (listing and checking files)"
    )


@pytest.mark.parametrize("text", ["", "{", "[]", '{"state": "running"}', None])
def test_unusable_status_files_read_as_none(text):
    assert act.parse_status(text) is None


def test_job_result_drops_job_bookkeeping():
    data = {"ansible_job_id": "j1", "finished": True, "started": True, "results_file": "/x", "changed": True,
            "diff": {"before": "a", "after": "b"}, "stdout": "", "stdout_lines": []}
    assert act.job_result(data) == {"changed": True, "diff": {"before": "a", "after": "b"}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _plugin(no_log=False):
    plugin = model_weights.ActionModule.__new__(model_weights.ActionModule)
    plugin._task = mock.Mock(no_log=no_log, async_val=0)
    return plugin


def test_follow_reports_at_the_interval_until_the_job_finishes(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(act.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(act.time, "sleep", clock.sleep)
    lines = []
    monkeypatch.setattr(act.display, "display", lines.append)
    plugin = _plugin()
    polls = []

    def job(jid, task_vars, mode="status"):
        polls.append(clock.now)
        if clock.now >= 95:
            return {"ansible_job_id": jid, "finished": True, "changed": True, "fetched_bytes": 10}
        return {"ansible_job_id": jid, "started": True, "finished": False}

    statuses = iter([None, {"done_bytes": 5, "total_bytes": 10, "rate": 1, "eta": 5, "file": "a"}] * 5)
    plugin._job = job
    plugin._read_status = lambda path: next(statuses)
    result = plugin._follow("j42", "/tmp/x/progress.json", 30, "h1", {})
    assert result == {"changed": True, "fetched_bytes": 10}
    assert max(b - a for a, b in itertools.pairwise(polls)) <= act.MAX_POLL
    # A line at least every 30 s: at 30, 60 and 90 s of a 95 s job.
    assert len(lines) == 3
    assert lines[0].startswith("h1: model_weights running for 30s")
    assert lines[1] == "h1: model_weights 5 B of 10 B (50.0%) at 1 B/s, ETA 5s [a]"


def test_reports_stay_on_schedule_when_polls_are_slow(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(act.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(act.time, "sleep", clock.sleep)
    reported = []
    monkeypatch.setattr(act.display, "display", lambda line: reported.append(clock.now))
    plugin = _plugin()

    def slow_job(jid, task_vars, mode="status"):
        clock.now += 3.5  # a poll over a slow connection
        return {"finished": clock.now > 300}

    plugin._job = slow_job
    plugin._read_status = lambda path: None
    plugin._follow("j", "/s", 25, "h", {})
    gaps = [b - a for a, b in itertools.pairwise([0.0, *reported])]
    assert len(reported) >= 11 and max(gaps) <= 30


def test_follow_returns_a_failed_job(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(act.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(act.time, "sleep", clock.sleep)
    plugin = _plugin()
    plugin._job = lambda jid, tv, mode="status": {"failed": True, "msg": "could not find job", "finished": True}
    plugin._read_status = lambda path: pytest.fail("no report for a finished job")
    assert plugin._follow("j1", "/s", 30, "h", {}) == {"failed": True, "msg": "could not find job"}


def test_run_cleans_up_the_job_and_its_status_dir(monkeypatch):
    plugin = _plugin()
    plugin._task.args = {"dest": "/v/weights/m", "repo_id": "o/m", "hf_token": "hf_x"}
    plugin._task.check_mode = False
    plugin._play_context = mock.Mock(check_mode=False)
    plugin._templar = mock.Mock(template=lambda value: value)
    plugin._connection = mock.Mock(has_native_async=False)
    plugin._connection._shell.tmpdir = None
    commands, modules = [], []

    def low_level(cmd, sudoable=True):
        commands.append(cmd)
        return {"rc": 0, "stdout": "/tmp/ttfleet-progress.abc\n" if "mktemp" in cmd else ""}

    def execute(module_name=None, module_args=None, task_vars=None, wrap_async=False):
        modules.append((module_name, dict(module_args or {}), wrap_async, plugin._task.async_val))
        if wrap_async:
            return {"ansible_job_id": "j7", "started": True, "finished": False, "changed": True}
        if module_args.get("mode") == "cleanup":
            return {"ansible_job_id": "j7", "erased": "/root/.ansible_async/j7"}
        return {"ansible_job_id": "j7", "finished": True, "changed": False, "hashed": []}

    plugin._low_level_execute_command = low_level
    plugin._execute_module = execute
    plugin._remote_expand_user = lambda path: path.replace("~", "/root")
    plugin.get_shell_option = lambda name, default=None: default
    plugin._remove_tmp_path = lambda path: None
    clock = Clock()
    monkeypatch.setattr(act.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(act.time, "sleep", clock.sleep)
    with mock.patch.object(act.ActionBase, "run", return_value={}):
        result = plugin.run(task_vars={"inventory_hostname": "h", "ttfleet_progress_interval": 1})
    assert result == {"changed": False, "hashed": []}
    launch = modules[0]
    assert launch[0] is None and launch[2] is True and launch[3] == act.JOB_LIMIT
    assert launch[1]["status_file"] == "/tmp/ttfleet-progress.abc/progress.json"
    assert plugin._task.async_val == 0
    assert modules[-1][1] == {"jid": "j7", "mode": "cleanup", "_async_dir": "/root/.ansible_async"}
    assert commands[-1] == "rm -rf -- /tmp/ttfleet-progress.abc"
    assert not any("hf_x" in c for c in commands)
    json.dumps(result)


def test_a_quick_job_is_seen_at_once(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(act.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(act.time, "sleep", clock.sleep)
    plugin = _plugin()
    plugin._job = lambda jid, tv, mode="status": {"finished": clock.now >= 0.25, "changed": False}
    plugin._read_status = lambda path: pytest.fail("no report for a quick job")
    assert plugin._follow("j", "/s", 25, "h", {}) == {"changed": False}
    assert clock.now == 0.25


def test_an_interrupted_run_stops_its_job(monkeypatch):
    plugin = _plugin()
    plugin._task.args = {"dest": "/v/weights/m", "repo_id": "o/m"}
    plugin._play_context = mock.Mock(check_mode=False)
    plugin._templar = mock.Mock(template=lambda value: value)
    plugin._connection = mock.Mock(has_native_async=False)
    commands = []
    plugin._low_level_execute_command = lambda cmd, sudoable=True: (
        commands.append(cmd) or {"rc": 0, "stdout": "/tmp/ttfleet-progress.x\n" if "mktemp" in cmd else ""}
    )
    plugin._launch = lambda args, task_vars: ("j99", {})
    plugin._job = lambda jid, tv, mode="status": {}

    def interrupted(*args):
        raise KeyboardInterrupt

    plugin._follow = interrupted
    plugin._remove_tmp_path = lambda path: None
    with mock.patch.object(act.ActionBase, "run", return_value={}), pytest.raises(KeyboardInterrupt):
        plugin.run(task_vars={"inventory_hostname": "h"})
    assert any("pgrep -f -- 'async_wrapper.*[ ]j99 '" in c and "kill -TERM -- -$p $p" in c for c in commands)
    assert commands[-1] == "rm -rf -- /tmp/ttfleet-progress.x"


def test_a_connection_with_native_async_runs_the_module_as_a_plain_task():
    """mitogen's connection runs async jobs itself: no async wrapper to poll, so the module runs once, in place."""
    plugin = _plugin()
    plugin._task.args = {"dest": "/v/weights/m", "repo_id": "o/m"}
    plugin._play_context = mock.Mock(check_mode=False)
    plugin._connection = mock.Mock(has_native_async=True)
    plugin._connection._shell.tmpdir = "/tmp/ansible-tmp-1"
    calls, removed = [], []
    plugin._execute_module = lambda task_vars=None, wrap_async=False: calls.append(wrap_async) or {"changed": False}
    plugin._remove_tmp_path = removed.append
    plugin._launch = lambda args, task_vars: pytest.fail("no async job under a native-async connection")
    with mock.patch.object(act.ActionBase, "run", return_value={}):
        assert plugin.run(task_vars={"inventory_hostname": "h"}) == {"changed": False}
    assert calls == [False] and removed == ["/tmp/ansible-tmp-1"]


@pytest.mark.parametrize(
    ("value", "plain"), [(False, True), ("False", True), ("no", True), (True, False), ("true", False)]
)
def test_ttfleet_progress_false_runs_the_module_as_a_plain_task(value, plain):
    """A task the plan says moves no bytes sets ttfleet_progress false: one module run, no job to launch and poll."""
    plugin = _plugin()
    plugin._task.args = {"dest": "/v/weights/m", "repo_id": "o/m"}
    plugin._play_context = mock.Mock(check_mode=False)
    plugin._templar = mock.Mock(template=lambda value: value)
    plugin._connection = mock.Mock(has_native_async=False)
    plugin._connection._shell.tmpdir = "/tmp/ansible-tmp-2"
    calls = []
    plugin._execute_module = lambda task_vars=None, wrap_async=False: calls.append(wrap_async) or {"changed": False}
    plugin._remove_tmp_path = lambda path: None
    plugin._launch = lambda args, task_vars: (calls.append("job"), (None, {"failed": True, "msg": "launched"}))[1]
    plugin._make_status_dir = lambda: "/tmp/ttfleet-progress.q"
    plugin._cleanup = lambda jid, status_dir, task_vars: None
    with mock.patch.object(act.ActionBase, "run", return_value={}):
        plugin.run(task_vars={"inventory_hostname": "h", "ttfleet_progress": value})
    assert calls == ([False] if plain else ["job"])


def test_model_weights_source_none_moves_no_bytes_and_runs_as_usual():
    from ansible_collections.ttfleet.inference.plugins.action import model_weights

    plugin = model_weights.ActionModule.__new__(model_weights.ActionModule)
    assert plugin._runs_sync({"source": "none"}) and not plugin._runs_sync({"source": "hf"})
    assert not plugin._runs_sync({})


def test_credentials_in_the_s3_endpoint_are_refused_on_the_controller():
    act.refuse_url_credentials({"s3_endpoint": "https://s3.lab:9000"})
    act.refuse_url_credentials({})
    with pytest.raises(AnsibleActionFail) as err:
        act.refuse_url_credentials({"s3_endpoint": "http://AKID:sec@ret@s3.lab:9000"})
    assert "sec@ret" not in str(err.value) and "AKID" not in str(err.value)
    assert "'http://********@s3.lab:9000'" in str(err.value)
    assert "set s3_access_key and s3_secret_key instead" in str(err.value)
