"""Benchmark aid (bench/fleet_scale.py), never shipped: the controller's clock at the start of every task.

Written as JSON to $TTFLEET_MARKS_FILE when the play ends: ``[[time, task path, task name], ...]`` and a last
``[time, "", "end"]``, the marks bench/fanout_round_cost.py takes its rounds from (a round runs from the start of
the first task of its weights_round.yml to the start of the next round's). Beside it, ``<file>.cpu`` holds the
controller's CPU seconds at each mark (ansible-playbook's own and its reaped task workers', RUSAGE_SELF +
RUSAGE_CHILDREN; a worker counts once reaped, at the latest by the next task's start), and a copy of both goes to
bench/results/fleet_marks/ (not committed).
"""

from __future__ import annotations

import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: ttfleet_marks
type: aggregate
short_description: the controller's clock at every task start (benchmark aid)
description: Writes [time, task path, task name] of every task start to $TTFLEET_MARKS_FILE when the play ends.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ttfleet_marks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks = []
        self.cpu = []

    def _mark(self, path, name):
        self.marks.append([time.time(), path, name])
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.append(round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 3))

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._mark(task.get_path() or "", task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._mark("", "end")
        path = os.environ.get("TTFLEET_MARKS_FILE")
        if not path:
            return
        keep = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                            "results", "fleet_marks")  # fmt: skip
        os.makedirs(keep, exist_ok=True)
        for target in (path, os.path.join(keep, os.path.basename(path))):
            with open(target, "w", encoding="utf-8") as handle:
                json.dump(self.marks, handle)
            with open(target + ".cpu", "w", encoding="utf-8") as handle:
                json.dump(self.cpu, handle)
