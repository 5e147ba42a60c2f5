"""plugins/callback/lean_workers.py in a real ansible-playbook run: what a forked worker inherits.

A probe action plugin (a test stand-in, beside this file) runs in the worker ansible-core forks for its task and
reports, before it templates anything, whether the worker's garbage collector has the inherited objects frozen and
whether the Jinja2 plugins and the module_utils of the collection's filters were already loaded when it was forked.
The same playbook without the callback is the control: without it, none of that holds.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

PROBE = textwrap.dedent(
    """
    import gc, sys
    from ansible.plugins.action import ActionBase
    from ansible.plugins.loader import filter_loader

    class ActionModule(ActionBase):
        def run(self, tmp=None, task_vars=None):
            return {
                "frozen": gc.get_freeze_count(),
                "collection_filters": "ansible_collections.ttfleet.inference.plugins.filter.serve" in sys.modules,
                "filter_module_utils": "ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve"
                in sys.modules,
                "core_filters": bool(filter_loader._cached_non_collection_wrappers),
            }
    """
)

PLAYBOOK = textwrap.dedent(
    """
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: Probe the worker
          lean_probe:
          register: probe
        - name: Use a collection filter in a later worker, as roles do
          ansible.builtin.set_fact:
            instances: "{{ [] | ttfleet.inference.serve_instances('n150') }}"
        - name: Report
          ansible.builtin.copy:
            content: "{{ {'probe': probe, 'instances': instances} | to_json }}"
            dest: "{{ out }}"
            mode: "0600"
    """
)


def _run(tmp_path, callbacks):
    (tmp_path / "action").mkdir(exist_ok=True)
    (tmp_path / "action" / "lean_probe.py").write_text(PROBE)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "ansible.cfg").write_text("[defaults]\n" + (f"callbacks_enabled = {callbacks}\n" if callbacks else ""))
    out = tmp_path / f"out-{bool(callbacks)}.json"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
        ANSIBLE_ACTION_PLUGINS=str(tmp_path / "action"),
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "collections"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
    )
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    extra = ["-e", f"out={out}", "-e", f"ansible_python_interpreter={sys.executable}"]
    proc = subprocess.run(
        [playbook, "-i", "localhost,", "-c", "local", *extra, str(tmp_path / "play.yml")],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {
        "lean": _run(tmp_path_factory.mktemp("lean"), "ttfleet.inference.lean_workers"),
        "control": _run(tmp_path_factory.mktemp("control"), ""),
    }


def test_workers_inherit_frozen_objects_and_loaded_plugins(runs):
    probe = runs["lean"]["probe"]
    assert probe["frozen"] > 1000, probe
    assert probe["collection_filters"] is True
    assert probe["filter_module_utils"] is True
    assert probe["core_filters"] is True


def test_without_the_callback_workers_start_cold(runs):
    probe = runs["control"]["probe"]
    assert probe["frozen"] == 0
    assert probe["collection_filters"] is False
    assert probe["filter_module_utils"] is False


def test_templates_render_the_same(runs):
    assert runs["lean"]["instances"] == runs["control"]["instances"]
    assert runs["lean"]["instances"] == {"instances": [], "problems": []}
