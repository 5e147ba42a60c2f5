# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""The collection's module_utils as the filter plugins see them: imported on first use, not when the file loads.

ansible-core forks a worker for each task and host. The first ``ttfleet.inference.<filter>`` a worker's templates
name makes its Jinja2Loader load every filter file of the collection (plugins/loader.py,
``Jinja2Loader.get_with_context``, walks them all), and a forked worker has none of them cached. What a filter file
imported at its top was therefore imported again for every task that uses any of the collection's filters: about
140 ms of controller CPU per task and host (bench/filter_load_cost.py). A filter file binds its modules with
:func:`module_utils` instead, and a worker imports only the modules of the filters it calls.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

_PACKAGE = "ansible_collections.ttfleet.inference.plugins.module_utils."


class LazyModule:
    """A module of the collection's module_utils, imported when one of its names is first read."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}{'' if self._module is None else ' (imported)'}>"


def module_utils(name: str) -> LazyModule:
    """``module_utils("_plan.serve")``: plugins/module_utils/_plan/serve.py, imported on first use."""
    return LazyModule(_PACKAGE + name)
