"""Issue 29 case 7: two repositories that would share one weights directory, against the real model_cache_plan.

Extra repositories (a draft model) land in ``<volume>/weights/<last component of the repository>``, and the entries of
one model share its volume. A package or an entry that names ``attacker/Draft-1B`` beside another instance's
``honest/Draft-1B``, or a draft named like the model, had the plan keep one work entry for the directory: the fetch
placed one repository's bytes and the other instance was served them, with no error. The plan must refuse, naming
both, before any origin is listed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MODEL

SPEC = Path(__file__).resolve().parents[1] / "fixtures" / "specs" / "release_model_spec-v0.20.0.json.gz"
SHA = "0e9e39f249a16976918f6564b8830bc894c89659"
HONEST, ATTACKER = "1" * 40, "2" * 40


def _copy(arena, name, body):
    """A root-owned path copy of a repository (the path source), whose shard says whose it is."""
    directory = arena.private / "copies" / name
    files = {"config.json": b"{}", "model-00001-of-00001.safetensors": body * 512}
    for rel, data in files.items():
        arena.write(directory / rel, data, owner=0)
    return str(directory)


def _entry(arena, instance, *extras):
    return {
        "name": MODEL,
        "instance": instance,
        "revision": SHA,
        "path": _copy(arena, f"{instance}-weights", b"W"),
        "sources": ["path"],
        "extra_repos": [
            {"repo": repo, "revision": revision, "path": _copy(arena, repo.replace("/", "--"), repo.encode())}
            for repo, revision in extras
        ],
    }


def _plan(arena, models):
    args = {
        "models": models,
        "device": "p300x2",
        "volume_root": str(arena.private / "volumes"),
        "spec_file": str(SPEC),
        "host": "victim-host",
        "disk_margin_gb": 0,
    }
    return arena.module("model_cache_plan", args, check_mode=True)


def _work_sources(result):
    """Per weights directory, the repository its one work entry fetches (what every entry sharing it is served)."""
    return {Path(item["dest"]).name: item["repo_id"] for item in result["work"]}


def test_case29_07_control_one_draft_shared_by_two_entries_is_planned_once(arena):
    draft = ("honest/Draft-1B", HONEST)
    result = _plan(arena, [_entry(arena, "qwen-a", draft), _entry(arena, "qwen-b", draft)])
    assert not result.failed, result
    assert _work_sources(result) == {MODEL: f"Qwen/{MODEL}", "Draft-1B": "honest/Draft-1B"}, result["work"]


@pytest.mark.broke29(7)
@pytest.mark.parametrize(
    ("instances", "named"),
    [
        # The other instance's draft: same last component, another repository.
        (
            [("qwen-a", [("honest/Draft-1B", HONEST)]), ("qwen-b", [("attacker/Draft-1B", ATTACKER)])],
            ["honest/Draft-1B@" + HONEST, "instance qwen-a", "attacker/Draft-1B@" + ATTACKER, "instance qwen-b"],
        ),
        # One repository at two revisions: the other revision's bytes.
        (
            [("qwen-a", [("honest/Draft-1B", HONEST)]), ("qwen-b", [("honest/Draft-1B", ATTACKER)])],
            ["honest/Draft-1B@" + HONEST, "honest/Draft-1B@" + ATTACKER, "pin one revision of honest/Draft-1B"],
        ),
        # A draft named like its model lands in the model's own weights directory.
        (
            [("qwen-a", [(f"attacker/{MODEL}", ATTACKER)])],
            [f"Qwen/{MODEL}@{SHA} (the weights of", f"attacker/{MODEL}@{ATTACKER} (extra_repos[0]"],
        ),
    ],
    ids=["other-repository", "other-revision", "named-like-the-model"],
)
def test_case29_07_two_repositories_in_one_directory(arena, instances, named):
    models = [_entry(arena, instance, *extras) for instance, extras in instances]
    result = _plan(arena, models)
    assert not result.timed_out, result
    assert result.failed, (
        "model_cache_plan planned one fetch for a directory that two repositories claim; every instance sharing it "
        f"is served {_work_sources(result)}"
    )
    message = result.get("msg", "")
    assert message.startswith("victim-host: ") and "would share one directory" in message, message
    assert "Nothing was fetched" in message and "Fix: " in message, message
    for text in named:
        assert text in message, (text, message)
