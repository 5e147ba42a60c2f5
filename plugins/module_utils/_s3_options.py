# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The options modules share (argument spec entries): S3's, kept apart from _s3 so that it stays stdlib-only, and
those of a weights source (model_weights, model_cache_plan)."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from ansible.module_utils.basic import env_fallback

from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_ENDPOINT,
    DEFAULT_IGNORE_PATTERNS,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from ansible.module_utils.basic import AnsibleModule

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


def url_userinfo(url: str | None) -> str | None:
    """The ``user:password`` part of a URL (up to its last ``@``), or None."""
    try:
        netloc = urllib.parse.urlsplit(url or "").netloc
    except ValueError:
        return None
    return netloc.rpartition("@")[0] or None


def mask_url_credentials(module: AnsibleModule, keys: Iterable[str]) -> str | None:
    """Mask the credentials of every URL option (or list of URLs) in ``keys`` wherever Ansible shows the task
    (-vvv prints its arguments), and return the error for an ``s3_endpoint`` that carries them, or None."""
    urls: list[str] = []
    for key in keys:
        value = module.params.get(key)
        urls.extend(value if isinstance(value, list) else [value])
    for url in urls:
        userinfo = url_userinfo(url)
        if userinfo:
            module.no_log_values.add(userinfo)
            # The password alone too: older cores replace no_log values in set order, so a user name that is also
            # a no_log value (an access key) could be replaced first and leave "********:password" behind.
            password = userinfo.partition(":")[2]
            if password:
                module.no_log_values.add(password)
    if url_userinfo(module.params.get("s3_endpoint")):
        return (
            "s3_endpoint must not carry credentials (user:password@ in the URL); set s3_access_key and "
            "s3_secret_key instead and keep them in a vault"
        )
    return None
