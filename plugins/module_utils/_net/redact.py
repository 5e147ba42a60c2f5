# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What may be shown of untrusted text and of URLs: the one home of URL redaction.

- ``printable``: untrusted text (file names, error bodies, states read from hosts) made safe for a terminal.
- ``hide_userinfo``: the ``user:password@`` of every URL in a text hidden (messages, logs, results).
- ``mask_proxy``: a proxy URL with its password hidden, its user kept (what proxy errors name).
- ``url_userinfo`` and ``mask_url_credentials``: the credentials of a module's URL options registered as no_log
  values, so Ansible masks them wherever it shows the task.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ansible.module_utils.basic import AnsibleModule

_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The user info of a URL runs to the last "@" before the path: a password may hold "@" itself.
_USERINFO_RE = re.compile(r"(://)[^/?#\s]*@")


def printable(text: object, limit: int = 512) -> str:
    """``text`` with control characters (ESC, OSC, CR, LF, C1, bidi overrides) shown as escapes, cut at ``limit``."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        text = text[:limit] + f"...({len(text) - limit} more characters)"
    return _UNSAFE_TEXT.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def hide_userinfo(text: object) -> str:
    """``text`` with the user info of every URL in it (``user:password@``) replaced by ``********@``."""
    return _USERINFO_RE.sub(r"\1********@", str(text))


def mask_proxy(value: str) -> str:
    """``value`` (a proxy URL) with its password replaced by ``***``: ``http://user:***@proxy:3128``."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        userinfo, _at, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}"
    return printable(f"{scheme}{sep}{netloc}{slash}{path}", 200)


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
