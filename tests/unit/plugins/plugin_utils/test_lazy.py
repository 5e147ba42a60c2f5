"""plugin_utils/lazy.py, and the promise the filter files make with it: loading them imports no module_utils.

ansible-core's Jinja2Loader loads every filter file of the collection in every task worker that names one of its
filters (bench/filter_load_cost.py); a module_utils import at the top of a filter file costs every such task again.
"""

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import LazyModule, module_utils

PACKAGE = "ansible_collections.ttfleet.inference.plugins.module_utils."


def test_module_utils_imports_on_first_attribute():
    lazy = module_utils("_plan.serve")
    assert "(imported)" not in repr(lazy)
    assert callable(lazy.plan_instances)
    assert "(imported)" in repr(lazy)
    assert lazy.plan_instances is sys.modules[PACKAGE + "_plan.serve"].plan_instances


def test_missing_name_and_missing_module_raise():
    with pytest.raises(AttributeError):
        module_utils("_plan.serve").no_such_function  # noqa: B018
    with pytest.raises(ImportError):
        LazyModule(PACKAGE + "_plan.no_such_module").anything  # noqa: B018


def test_loading_every_filter_file_imports_no_module_utils():
    """In a fresh interpreter, as a task worker does: load each filter file from its path, call filters() on its
    FilterModule, then list the collection's module_utils that got imported."""
    files = sorted(glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py")))
    assert len(files) >= 10
    script = textwrap.dedent(
        """
        import importlib.util, json, sys
        sys.path.insert(0, sys.argv[1])
        import conftest  # makes ansible_collections.ttfleet.inference importable, as in the unit tests
        names = {}
        for path in sys.argv[2:]:
            name = "ansible_collections.ttfleet.inference.plugins.filter." + path.rsplit("/", 1)[1][:-3]
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            names[name] = sorted(module.FilterModule().filters())
        loaded = sorted(m for m in sys.modules if m.startswith(%r))
        print(json.dumps({"filters": sum(len(v) for v in names.values()), "module_utils": loaded}))
        """
        % PACKAGE
    )
    out = subprocess.run(
        [sys.executable, "-c", script, os.path.join(ROOT, "tests", "unit"), *files],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["filters"] >= 40
    assert result["module_utils"] == [], (
        "a filter file imports module_utils at its top; bind them with plugin_utils.lazy.module_utils instead: "
        f"{result['module_utils']}"
    )
