# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Progress lines for the action plugins of modules that move bytes (model_weights, kernel_cache).

``ProgressAction`` runs the module and shows its progress while it runs; plugins/action/model_weights.py and
plugins/action/kernel_cache.py are thin subclasses of it (``PROGRESS_NAME``, ``_runs_sync``).

A weights transfer can take an hour. The module runs as an async job on the host; while it runs the plugin
polls the job (``ansible.legacy.async_status``) and, every ``ttfleet_progress_interval`` seconds (25 when the
variable is not set), reads the module's status file (module_utils._host.progress) and prints bytes done/total, rate and
ETA through Ansible's display. The result is the module's own, as if it had run synchronously; the job file and the
status file it created are removed at the end.

Check mode and tasks with their own ``async:`` run the module as usual (check mode moves no bytes; an
``async`` task is polled by Ansible itself), and so does a connection with native async such as mitogen's, whose
jobs this plugin cannot poll. So does a task whose ``ttfleet_progress`` variable is false: a role sets it on a task
its plan says moves no bytes (a converged volume), which then costs one module run instead of the job's launch,
polls and clean-up.

The job's time limit is ``ttfleet_job_limit`` seconds (24 hours when the variable is not set). The module ends on
its own well before a stalled or dripping origin could hold it that long: every request it makes has a stall limit
(its ``timeout``) and an overall limit (a file's is 300 s plus a second per MiB, three attempts; an answer's or a
listing's is fixed). The job limit is the backstop for a large model on a slow link: more than about 84 GiB at
1 MiB/s needs a higher value (a job cut short keeps its verified and partial files, and the next run resumes them).

File names and states in the progress lines come from the source (a Hub listing, a peer's manifest): control
characters in them are shown as escapes, never sent to the terminal.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import hide_userinfo, printable

display = Display()

INTERVAL_VAR = "ttfleet_progress_interval"
# Due every 25 s, a line is never more than 30 s after the previous one (a poll of the job can delay it).
DEFAULT_INTERVAL = 25.0
JOB_LIMIT_VAR = "ttfleet_job_limit"
# False: run the module as a plain task, without progress lines (nothing to report).
PROGRESS_VAR = "ttfleet_progress"
# The async wrapper kills its job after this many seconds (the default of ttfleet_job_limit). Every request of
# the module is bounded by its own deadline, so this only stops work that is legitimately slow: at 1 MiB/s, the
# slowest rate a file's deadline allows, 24 hours move about 84 GiB.
JOB_LIMIT = 24 * 3600
MIN_JOB_LIMIT = 60
MAX_JOB_LIMIT = 30 * 24 * 3600
MAX_POLL = 5.0
# A converged run finishes within a second: look early, then back off to MAX_POLL.
FIRST_POLL = 0.25
_JOB_KEYS = (
    "ansible_job_id",
    "finished",
    "started",
    "results_file",
    "stdout",
    "stderr",
    "stdout_lines",
    "stderr_lines",
)


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = round(max(float(seconds), 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def parse_interval(value: str | float | None) -> float:
    """The reporting interval in seconds from the variable's value (None: the default)."""
    if value is None or value == "":
        return DEFAULT_INTERVAL
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = -1
    if not 0 < interval <= 3600:
        raise AnsibleActionFail(
            f"{INTERVAL_VAR} must be a number of seconds between 0 and 3600 (got {value!r}); "
            f"set it in the inventory, for example {INTERVAL_VAR}: 30"
        )
    return interval


def parse_job_limit(value: str | int | None) -> int:
    """The async job's limit in seconds from ``ttfleet_job_limit`` (None: the default)."""
    if value is None or value == "":
        return JOB_LIMIT
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = -1
    if not MIN_JOB_LIMIT <= limit <= MAX_JOB_LIMIT:
        raise AnsibleActionFail(
            f"{JOB_LIMIT_VAR} must be a whole number of seconds between {MIN_JOB_LIMIT} and {MAX_JOB_LIMIT} (got "
            f"{printable(value, 60)!r}); set it in the inventory, for example {JOB_LIMIT_VAR}: 172800 for two days"
        )
    return limit


def _number(value: object) -> float:
    """A non-negative number from the status file, 0 for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        return 0
    return min(value, 1 << 62)


def parse_status(text: str) -> dict[str, Any] | None:
    """The status file's JSON object, or None when it is absent, partial or not an object."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) and "done_bytes" in data else None


def progress_line(
    host: str, status: dict[str, Any] | None, elapsed: float, show_file: bool = True, what: str = "model_weights"
) -> str:
    """One line of progress for the playbook output."""
    head = f"{host}: {what}"
    if status is None:
        return f"{head} running for {human_duration(elapsed)}, no bytes moving yet (listing and checking files)"
    done, total = int(_number(status.get("done_bytes"))), int(_number(status.get("total_bytes")))
    percent = f" ({100.0 * done / total:.1f}%)" if total else ""
    eta = status.get("eta")
    line = (
        f"{head} {human_bytes(done)} of {human_bytes(total)}{percent} at {human_bytes(_number(status.get('rate')))}/s, "
        f"ETA {human_duration(_number(eta) if eta is not None else None)}"
    )
    # The file name comes from the source's listing, the state from the host: shown, never interpreted.
    if status.get("state") not in (None, "running"):
        line += f", {printable(status['state'], 40)}"
    if show_file and status.get("file"):
        line += f" [{printable(status['file'], 200)}]"
    return line


def refuse_url_credentials(args: dict[str, Any]) -> None:
    """Fail on the controller, before the module runs (and its arguments reach the host's log), when the S3
    endpoint carries credentials."""
    endpoint = args.get("s3_endpoint")
    if isinstance(endpoint, str) and hide_userinfo(endpoint) != endpoint:
        raise AnsibleActionFail(
            f"s3_endpoint {hide_userinfo(endpoint)!r} carries credentials (user:password@ in the URL); set "
            "s3_access_key and s3_secret_key instead and keep them in a vault"
        )


def job_result(data: dict[str, Any]) -> dict[str, Any]:
    """The module's result from an async_status answer, without the job's bookkeeping keys."""
    return {key: value for key, value in data.items() if key not in _JOB_KEYS}


class ProgressAction(ActionBase):
    """Runs a module with a ``status_file`` option as an async job and prints its progress while it runs."""

    _supports_check_mode = True
    _supports_async = True
    # Name in the progress lines: the subclass's module.
    PROGRESS_NAME = "module"

    def _runs_sync(self, args: dict[str, Any]) -> bool:
        """Whether these arguments move no bytes, so the module runs as usual."""
        return False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        refuse_url_credentials(self._task.args)
        # A connection with native async (mitogen's) runs async jobs its own way: the job files and the async
        # wrapper this plugin polls do not exist there, so the module runs as a plain task, without progress lines.
        native = self._connection.has_native_async is True
        quiet = PROGRESS_VAR in task_vars and not boolean(self._templar.template(task_vars[PROGRESS_VAR]), strict=False)
        plain = self._play_context.check_mode or native or quiet or self._runs_sync(self._task.args)
        if self._task.async_val or plain:
            wrap = bool(self._task.async_val) and not native
            result.update(self._execute_module(task_vars=task_vars, wrap_async=wrap))
            if not wrap:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result

        interval = parse_interval(self._templar.template(task_vars.get(INTERVAL_VAR)))
        self._job_limit = parse_job_limit(self._templar.template(task_vars.get(JOB_LIMIT_VAR)))
        host = task_vars.get("inventory_hostname", "host")
        args = dict(self._task.args)
        status_dir = None
        if not args.get("status_file"):
            status_dir = self._make_status_dir()
            args["status_file"] = f"{status_dir}/progress.json"
        jid, done = None, False
        try:
            jid, launched = self._launch(args, task_vars)
            if jid is None:
                result.update(launched)
                return result
            result.update(self._follow(jid, args["status_file"], interval, host, task_vars))
            done = True
            return result
        finally:
            if jid is not None and not done:
                self._stop_job(jid)
            self._cleanup(jid, status_dir, task_vars)

    # -- steps --------------------------------------------------------------------------------------

    def _run_command(self, command: str) -> tuple[int | None, str]:
        res = self._low_level_execute_command(command, sudoable=True)
        return res.get("rc"), res.get("stdout", "")

    def _make_status_dir(self) -> str:
        rc, out = self._run_command('umask 077 && mktemp -d "${TMPDIR:-/tmp}/ttfleet-progress.XXXXXXXX"')
        path = out.strip().splitlines()[-1] if out.strip() else ""
        if rc != 0 or not path.startswith("/"):
            raise AnsibleActionFail(
                f"could not create a directory for the progress file on the host (mktemp -d answered {out!r})"
            )
        return path

    def _launch(self, args: dict[str, Any], task_vars: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        self._task.async_val = getattr(self, "_job_limit", JOB_LIMIT)
        try:
            launched = self._execute_module(module_args=args, task_vars=task_vars, wrap_async=True)
        finally:
            self._task.async_val = 0
        jid = launched.get("ansible_job_id")
        if launched.get("failed") or not jid:
            return None, launched
        return jid, launched

    def _async_dir(self) -> str:
        return self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))

    def _job(self, jid: str, task_vars: dict[str, Any], mode: str = "status") -> dict[str, Any]:
        return self._execute_module(
            module_name="ansible.legacy.async_status",
            module_args={"jid": jid, "mode": mode, "_async_dir": self._async_dir()},
            task_vars=task_vars,
        )

    def _read_status(self, path: str) -> dict[str, Any] | None:
        rc, out = self._run_command(f"cat -- {shlex.quote(path)} 2>/dev/null || true")
        return parse_status(out) if rc == 0 else None

    def _follow(
        self, jid: str, status_file: str, interval: float, host: str, task_vars: dict[str, Any]
    ) -> dict[str, Any]:
        # Reports are due on a fixed schedule (started + k * interval), whatever a poll costs.
        started = time.monotonic()
        poll, polls = min(interval, MAX_POLL), 0
        next_poll, next_report = started + min(FIRST_POLL, poll), started + interval
        show_file = not self._task.no_log
        while True:
            wake = min(next_poll, next_report) - time.monotonic()
            if wake > 0:
                time.sleep(wake)
            if time.monotonic() >= next_poll:
                data = self._job(jid, task_vars)
                if data.get("finished") or (data.get("failed") and not data.get("started")):
                    return job_result(data)
                polls += 1
                next_poll = time.monotonic() + min(FIRST_POLL * 2**polls, poll)
            now = time.monotonic()
            if now >= next_report:
                status = self._read_status(status_file)
                display.display(progress_line(host, status, now - started, show_file, self.PROGRESS_NAME))
                next_report = max(next_report + interval, now + poll)

    def _stop_job(self, jid: str) -> None:
        """Stop a job this run gave up on (interrupted, connection lost), so that no second writer is left behind.

        The async wrapper's watcher and its forked child carry the job id in their command line; the child leads
        the process group of the module. The ``[ ]`` keeps the pattern from matching this shell's own command line.
        """
        if not jid.isalnum():
            return
        command = f"for p in $(pgrep -f -- 'async_wrapper.*[ ]{jid} '); do kill -TERM -- -$p $p 2>/dev/null; done; true"
        try:
            self._run_command(command)
        except Exception as exc:  # the original error matters more
            display.warning(f"could not stop the async job {jid} on the host: {exc}")

    def _cleanup(self, jid: str | None, status_dir: str | None, task_vars: dict[str, Any]) -> None:
        if jid is not None:
            try:
                self._job(jid, task_vars, mode="cleanup")
            except Exception as exc:  # cleanup must not hide the task's own result or error
                display.warning(f"could not remove the async job file {jid}: {exc}")
        if status_dir is not None:
            self._run_command(f"rm -rf -- {shlex.quote(status_dir)}")
        self._remove_tmp_path(self._connection._shell.tmpdir)
