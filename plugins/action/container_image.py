# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Action plugin of ttfleet.inference.container_image: progress lines while images are pulled or loaded.

A TTIS image is 14 to 22 GB; this runs the module as an async job and prints its status file (bytes done and total,
rate, ETA) like the model_weights action plugin does (plugins/plugin_utils/progress_action.py,
``ttfleet_progress_interval``). The serve role sets ``ttfleet_progress: false`` when every image is present.
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.plugin_utils.progress_action import ProgressAction


class ActionModule(ProgressAction):
    PROGRESS_NAME = "container_image"
