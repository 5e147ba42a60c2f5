# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The options of a weights source that modules share (argument spec entries of model_weights and model_cache_plan;
doc fragment ttfleet.inference.weights_source)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ansible.module_utils.basic import env_fallback

from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.options import S3_OPTIONS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_ENDPOINT,
    DEFAULT_IGNORE_PATTERNS,
)

if TYPE_CHECKING:
    from typing import Any

# How weights are listed and checked at their source (doc fragment ttfleet.inference.weights_source).
WEIGHTS_SOURCE_OPTIONS: dict[str, dict[str, Any]] = dict(
    allow_floating_revision=dict(type="bool", default=False),
    hf_endpoint=dict(type="str", default=DEFAULT_ENDPOINT, fallback=(env_fallback, ["HF_ENDPOINT"])),
    hf_token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
    ignore_patterns=dict(type="list", elements="str", default=list(DEFAULT_IGNORE_PATTERNS)),
    verify=dict(type="str", choices=["auto", "sha256", "size"], default="auto"),
    disk_margin_gb=dict(type="float", default=10),
    container_owner=dict(type="int"),
    container_group=dict(type="int"),
    host=dict(type="str"),
    timeout=dict(type="int", default=60),
    **S3_OPTIONS,
)
