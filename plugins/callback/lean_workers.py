# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Callback plugin ttfleet.inference.lean_workers: cheaper worker processes for the controller.

ansible-core forks one worker process per task and host, skipped tasks included. Two costs of each fork are the
controller's own and do not depend on what the task does:

- Python's garbage collector in the worker walks the objects the worker inherited (the whole inventory, the
  variables, the loaded plays). Each object it touches is written to, so the kernel copies its page: a worker of a
  large play copies megabytes it never needed. Freezing the collector's generations in the child right after the fork
  (:func:`gc.freeze`) leaves the inherited objects out of every collection the worker runs; what the worker allocates
  itself is collected as before. The controller's own collector is not changed.
- Jinja2 plugins are loaded lazily, so a controller that has not templated yet forks workers without them: every
  worker that renders a template loads ansible-core's filter and test files again, and every worker that names one
  ``ttfleet.inference`` filter loads all of the collection's filter files (the loader walks them all) and the
  module_utils those filters use. Loading them once in the controller before the first fork lets every worker
  inherit them.

Nothing a task sees or returns changes: the same plugins are loaded from the same paths, only earlier and once.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: lean_workers
type: aggregate
short_description: Make each of the controller's worker processes cheaper
version_added: 0.3.0
description:
  - ansible-core forks a worker process for every task and host, skipped tasks included. This callback cuts two costs
    every worker pays on the controller, whatever its task does.
  - In each worker, right after the fork, the garbage collector's generations are frozen (Python's C(gc.freeze)), so
    the worker's collections leave the objects it inherited from the controller alone instead of walking, and
    thereby copying, the memory of the whole play. Objects the worker creates are collected as before; the main
    process's collector is not changed.
  - Before the first worker is forked, the main process loads ansible-core's Jinja2 filter and test plugins, the
    filter plugins of this collection and the module_utils they use, so that workers inherit them instead of loading
    them again one by one.
  - Tasks, their results and their output are unchanged. A plugin that fails to load here is left to the worker that
    needs it, which reports the error as it would without this callback.
  - Enable it in C(callbacks_enabled) under C([defaults]) of C(ansible.cfg), as this collection's checkout does. It
    prints nothing.
requirements:
  - enabled in C(callbacks_enabled) (C(ANSIBLE_CALLBACKS_ENABLED))
"""

import gc
import importlib
import os
import pkgutil
import sys
from typing import Any

from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

display = Display()

_COLLECTION = "ansible_collections.ttfleet.inference"
_FILTERS = _COLLECTION + ".plugins.filter"
_LAZY = _COLLECTION + ".plugins.plugin_utils.lazy"

# os.register_at_fork cannot be undone: register the freeze once per process, however many callback objects exist.
_FREEZE_REGISTERED = False


def _freeze_in_workers() -> None:
    global _FREEZE_REGISTERED
    if not _FREEZE_REGISTERED:
        os.register_at_fork(after_in_child=gc.freeze)
        _FREEZE_REGISTERED = True


def _collection_filter_name() -> str:
    """One filter name of this collection: asking the loader for any one of them loads every filter file."""
    package = importlib.import_module(_FILTERS)
    for info in pkgutil.iter_modules(package.__path__):
        filters = getattr(importlib.import_module(f"{_FILTERS}.{info.name}"), "FilterModule", None)
        for name in filters().filters() if filters is not None else ():
            return f"ttfleet.inference.{name}"
    raise LookupError(f"no filter plugin in {_FILTERS}")


def _import_lazy_module_utils() -> None:
    """Import the module_utils the loaded filter files bind lazily (plugins/plugin_utils/lazy.py)."""
    lazy = importlib.import_module(_LAZY)
    for name, module in list(sys.modules.items()):
        if not name.startswith(_FILTERS + ".") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, lazy.LazyModule):
                value.__name__  # noqa: B018 - LazyModule imports its module on the first attribute read


def warm_plugins() -> list[str]:
    """Load what every worker would otherwise load again; returns what could not be loaded (left to the workers)."""
    from ansible.plugins.loader import action_loader, filter_loader, test_loader

    builtin = "ansible_collections.ansible.builtin.plugins."
    steps = (
        ("ansible-core's filter plugins", lambda: list(filter_loader.all())),
        ("ansible-core's test plugins", lambda: list(test_loader.all())),
        ("ansible.builtin filters", lambda: importlib.import_module(builtin + "filter")),
        ("ansible.builtin tests", lambda: importlib.import_module(builtin + "test")),
        ("the action of plain modules", lambda: action_loader.get("ansible.legacy.normal", class_only=True)),
        ("ttfleet.inference filters", lambda: filter_loader.get(_collection_filter_name())),
        ("ttfleet.inference module_utils of the filters", _import_lazy_module_utils),
    )
    missed = []
    for label, step in steps:
        try:
            step()
        except Exception as exc:  # a worker that needs it loads it again and reports the error where it matters
            missed.append(f"{label}: {exc}")
    return missed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ttfleet.inference.lean_workers"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warmed = False
        _freeze_in_workers()

    def _warm(self) -> None:
        if self._warmed:
            return
        self._warmed = True
        for missed in warm_plugins():
            display.vvv(f"lean_workers: not preloaded, the workers load it themselves: {missed}")

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._warm()
