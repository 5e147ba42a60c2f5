# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The adapter between a module and the collection's errors: ``fail_on`` turns a FleetError into ``fail_json``.

A module runs its work inside the block and exits after it::

    with fail_on(module, os_error="cannot inspect volumes"):
        result = plan(module.params)
    module.exit_json(**result)

Inside the block:

- an OSError fails the task with ``"<os_error>: <error>"`` when ``os_error`` is given. It is checked first, so an
  error that is both an OSError and a FleetError (``ProxyError``) reads as any failed connection does;
- a FleetError fails the task with ``msg=str(error)``, the message unchanged (``context`` and ``": "`` before it
  when given);
- any other Exception fails the task with ``"<any_error>: <type>: <error>"`` when ``any_error`` is given, for a
  module whose failures must never show a traceback (one would carry request details);
- anything else (a bug, KeyboardInterrupt, the SystemExit of ``fail_json`` itself) propagates untouched.

``extra`` goes to ``fail_json`` beside ``msg``. The message is ``str()`` of the error, never a traceback, and before it
leaves every value in ``module.no_log_values`` and ``secrets`` is replaced by ``********`` (the longest first, so
that no part of a longer secret is left behind); ``redact``, when given, runs last, for what only the caller
recognises (user info in a URL a server sent back, for instance). If ``fail_json`` returns (a test double), the
error propagates: the code after the block never runs on a failure.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

    from ansible.module_utils.basic import AnsibleModule

MASK = "********"


def message_of(
    exc: BaseException, *, context: str = "", os_error: str | None = None, any_error: str | None = None
) -> str | None:
    """The ``msg`` that ``fail_on`` reports for ``exc`` (before masking), or None when it must propagate."""
    if os_error is not None and isinstance(exc, OSError):
        return f"{os_error}: {exc}"
    if isinstance(exc, FleetError):
        return f"{context}: {exc}" if context else str(exc)
    if any_error is not None and isinstance(exc, Exception):
        return f"{any_error}: {type(exc).__name__}: {exc}"
    return None


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every non-empty value of ``secrets`` replaced by ``********``, the longest first."""
    for value in sorted({value for value in secrets if value}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


@contextlib.contextmanager
def fail_on(
    module: AnsibleModule,
    *,
    context: str = "",
    os_error: str | None = None,
    any_error: str | None = None,
    secrets: Iterable[str | None] = (),
    redact: Callable[[str], str] | None = None,
    **extra: Any,
) -> Iterator[None]:
    """Run the block; turn a FleetError (and, when asked, an OSError or any Exception) into ``fail_json``."""
    try:
        yield
    except Exception as exc:
        msg = message_of(exc, context=context, os_error=os_error, any_error=any_error)
        if msg is None:
            raise
        msg = mask(msg, [*module.no_log_values, *secrets])
        if redact is not None:
            msg = redact(msg)
        module.fail_json(msg=msg, **extra)
        raise
