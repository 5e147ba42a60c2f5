# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Action plugin of ttfleet.inference.kernel_cache: progress lines while a cache is packed or deployed.

Packing or pulling a 30 GB kernel cache takes minutes; this runs the module as an async job and prints its
status file like the model_weights action plugin does (plugins/plugin_utils/progress_action.py,
``ttfleet_progress_interval``). Inspecting moves no bytes and runs as usual.
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.plugin_utils.progress_action import ProgressAction


class ActionModule(ProgressAction):
    PROGRESS_NAME = "kernel_cache"

    def _runs_sync(self, args: dict[str, object]) -> bool:
        return args.get("state") == "inspected"
