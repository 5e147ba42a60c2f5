"""Benchmark aid (bench/fleet_scale.py), never shipped: the controller's clock at the start of every task.

Written as JSON to $TTFLEET_MARKS_FILE when the play ends: ``[[time, task path, task name], ...]`` and a last
``[time, "", "end"]``, the marks bench/fanout_round_cost.py takes its rounds from (a round runs from the start of
the first task of its weights_round.yml to the start of the next round's).
"""

from __future__ import annotations

import json
import os
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

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.marks.append([time.time(), task.get_path() or "", task.get_name()])

    def v2_playbook_on_stats(self, stats):
        self.marks.append([time.time(), "", "end"])
        path = os.environ.get("TTFLEET_MARKS_FILE")
        if path:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.marks, handle)
