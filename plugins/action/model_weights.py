# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Action plugin of ttfleet.inference.model_weights: run the module and show its progress while it runs.

A weights transfer can take an hour: the module runs as an async job and its status file is printed every
``ttfleet_progress_interval`` seconds (plugins/plugin_utils/progress_action.py, shared with kernel_cache).
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.plugin_utils.progress_action import ProgressAction


class ActionModule(ProgressAction):
    PROGRESS_NAME = "model_weights"

    def _runs_sync(self, args: dict[str, object]) -> bool:
        """source none moves no bytes: it only gives the weights in place their owners and modes."""
        return args.get("source") == "none"
