# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Action plugin of ttfleet.inference.disk_prune: progress lines while the trash is emptied.

Removing a 62 GB volume of tens of thousands of files can take minutes on a slow disk; this runs the module as an async
job and prints its status file (bytes freed, rate, ETA) like the model_weights action plugin does
(plugins/plugin_utils/progress_action.py, ``ttfleet_progress_interval``). A report-only run (``kinds: []``) removes
nothing and runs as usual.
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.plugin_utils.progress_action import ProgressAction


class ActionModule(ProgressAction):
    PROGRESS_NAME = "disk_prune"

    def _runs_sync(self, args: dict[str, object]) -> bool:
        return args.get("kinds") == []
