"""The weights fan-out runs its rounds in order: each round is its own include task (roles/model_cache).

A looped include with a per-host condition (an item a round, each host including only its own rounds) lets the
linear strategy queue the included rounds in the order the hosts' results come back: a round-2 pull then ran before
the round-1 pull of the holder it names (seen in CI and in the pristine check: tests/faults, holder killed mid-round,
found no URL of the round-1 holder and fell back to the origin). These tests keep the rounds as separate tasks, one a
round up to the limit the weights_fanout_rounds filter enforces.
"""

import os

import yaml
from conftest import ROOT

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import fanout

TASKS = os.path.join(ROOT, "roles", "model_cache", "tasks")


def _tasks(name):
    with open(os.path.join(TASKS, name), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _walk(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _walk(task.get(key) or [])


def _includes(name, needle):
    return [t for t in _walk(_tasks(name)) if needle in str(t.get("ansible.builtin.include_tasks", ""))]


def test_weights_includes_the_rounds_without_a_loop():
    """weights.yml includes weights_peers.yml (serve, the rounds, stop) and that includes the rounds, neither looped:
    every host includes the same file, so the linear strategy queues it once for all of them."""
    peers = _includes("weights.yml", "weights_")
    assert [t["ansible.builtin.include_tasks"]["file"] for t in peers] == ["weights_peers.yml"]
    includes = _includes("weights_peers.yml", "weights_round")
    assert [t["ansible.builtin.include_tasks"]["file"] for t in includes] == ["weights_rounds.yml"]
    for task in peers + includes:
        assert "loop" not in task and "with_items" not in task


def test_every_round_is_its_own_task_in_order_up_to_the_limit():
    rounds = []
    for name in ("weights_rounds.yml", "weights_rounds_more.yml"):
        for task in _tasks(name):
            include = task["ansible.builtin.include_tasks"]
            if include["file"] != "weights_round.yml":
                continue
            assert "loop" not in task, f"{name}: {task['name']} loops"
            number = task["vars"]["__model_cache_round"]
            assert f"weights_round({number})" in task["when"], f"{name}: round {number} tests another round"
            rounds.append(number)
    assert rounds == list(range(1, fanout.MAX_ROUNDS + 1))


def test_the_later_rounds_are_included_only_after_round_4():
    more = [
        t for t in _tasks("weights_rounds.yml") if t["ansible.builtin.include_tasks"]["file"] != "weights_round.yml"
    ]
    assert [t["ansible.builtin.include_tasks"]["file"] for t in more] == ["weights_rounds_more.yml"]
    assert more[0]["when"] == "__model_cache_rounds | int > 4"
    assert _tasks("weights_rounds_more.yml")[0]["vars"]["__model_cache_round"] == 5
