# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The S3 options modules share (argument spec entries), kept apart from the client so that it stays stdlib-only;
``client.S3Client.from_options`` reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ansible.module_utils.basic import env_fallback

if TYPE_CHECKING:
    from typing import Any

S3_OPTIONS: dict[str, dict[str, Any]] = dict(
    s3_endpoint=dict(type="str"),
    s3_bucket=dict(type="str"),
    s3_prefix=dict(type="str", default=""),
    s3_region=dict(type="str", default="us-east-1"),
    s3_access_key=dict(type="str", no_log=True, fallback=(env_fallback, ["AWS_ACCESS_KEY_ID"])),
    s3_secret_key=dict(type="str", no_log=True, fallback=(env_fallback, ["AWS_SECRET_ACCESS_KEY"])),
    s3_session_token=dict(type="str", no_log=True, fallback=(env_fallback, ["AWS_SESSION_TOKEN"])),
    s3_ca_bundle=dict(type="path"),
    s3_verify=dict(type="bool", default=True),
)
