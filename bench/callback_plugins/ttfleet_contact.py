"""Benchmark aid (bench/idempotence.py), never shipped: counts, per host, the task results that contacted the host.

A result contacted the host unless its task was skipped, ran a controller-only action (assert, debug, set_fact, meta,
include/import, ...) or was delegated to localhost. Written as JSON to $TTFLEET_CONTACT_FILE when the play ends;
with $TTFLEET_CONTACT_TASKS set, each host also lists the names of its tasks with host contact ("tasks"), its
controller-only ones ("controller_tasks") and its skipped ones ("skipped_tasks").
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: ttfleet_contact
type: aggregate
short_description: count the task results that contacted each host (benchmark aid)
description: Writes per-host counts of results with and without host contact to $TTFLEET_CONTACT_FILE.
"""

CONTROLLER_ONLY = {
    "assert", "debug", "set_fact", "meta", "include_tasks", "import_tasks", "include_role", "import_role",
    "include_vars", "set_stats", "fail", "add_host", "group_by", "pause", "validate_argument_spec",
}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ttfleet_contact"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counts: dict[str, dict[str, int]] = {}

    def _count(self, result, key):
        host = self.counts.setdefault(result._host.get_name(), {"contact": 0, "controller": 0, "skipped": 0})
        if key == "skipped":
            host["skipped"] += 1
            if os.environ.get("TTFLEET_CONTACT_TASKS"):
                host.setdefault("skipped_tasks", []).append(result._task.get_name())
            return
        task = result._task
        action = task.action.rsplit(".", 1)[-1]
        delegated = task.delegate_to in ("localhost", "127.0.0.1")
        kind = "controller" if action in CONTROLLER_ONLY or delegated else "contact"
        host[kind] += 1
        if os.environ.get("TTFLEET_CONTACT_TASKS"):
            host.setdefault("tasks" if kind == "contact" else "controller_tasks", []).append(task.get_name())

    def v2_runner_on_ok(self, result):
        self._count(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._count(result, "skipped")

    def v2_runner_item_on_ok(self, result):
        pass

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("TTFLEET_CONTACT_FILE")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.counts, handle)
