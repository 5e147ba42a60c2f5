"""Fleet contract rules (plugins/module_utils/_plan/fleet.py)."""

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fleet import model_conflicts


@pytest.mark.parametrize(
    "models",
    [
        [],
        [{"name": "Qwen3-32B"}],
        [{"name": "Qwen3-32B", "port": 8000}, {"name": "whisper-large-v3", "port": 8001}],
        # Data parallel: one model, disjoint devices, own ports.
        [{"name": "Llama-3.1-8B-Instruct", "device_ids": [0], "port": 8000},
         {"name": "Llama-3.1-8B-Instruct", "device_ids": [1], "port": 8001}],
        # An absent entry does not clash with its replacement.
        [{"name": "Qwen3-32B", "state": "absent"}, {"name": "Qwen/Qwen3-32B"}],
        # Without ports, entries serve on 8000 + their position.
        [{"name": "a", "device_ids": [0]}, {"name": "b", "device_ids": [1]}],
    ],
)
def test_no_conflict(models):
    assert model_conflicts(models) == []


@pytest.mark.parametrize(
    ("models", "needle"),
    [
        ([{"name": "Qwen3-32B", "port": 8000}, {"name": "Qwen/Qwen3-32B", "port": 8001}],
         "listed twice on every device"),
        ([{"name": "m", "device_ids": [0, 1], "port": 1}, {"name": "m", "device_ids": [1], "port": 2}],
         "device ids [1]"),
        ([{"name": "a", "port": 8000}, {"name": "b", "port": 8000}], "port 8000 is given to a, b"),
        ([{"name": "a", "port": 70000}], "outside 1-65535"),
    ],
)
def test_conflict_messages(models, needle):
    problems = model_conflicts(models)
    assert any(needle in p for p in problems), problems
