# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Action plugin of ttfleet.inference.image_mirror: progress lines while blobs are copied into the site registry.

A TTIS image is 14 to 22 GB; this runs the module as an async job and prints its status file (bytes done and total,
rate, ETA) like the model_weights action plugin does (plugins/plugin_utils/progress_action.py,
``ttfleet_progress_interval``). The serve role runs it only when the site registry lacks an image.
"""

from __future__ import annotations

from ansible_collections.ttfleet.inference.plugins.plugin_utils.progress_action import ProgressAction


class ActionModule(ProgressAction):
    PROGRESS_NAME = "image_mirror"
