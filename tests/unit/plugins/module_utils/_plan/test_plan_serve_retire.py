# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Retirement of the instances tt_models no longer lists (retired_instances in module_utils/_plan/serve.py and the
serve_retired filter), from the files a real find over a state directory returns."""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter.serve import serve_instances, serve_retired
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve import ServeError, retired_instances

MODELS = [
    {"name": "Llama-3.1-8B-Instruct", "device_ids": [0]},
    {"name": "Qwen3-32B", "instance": "qwen", "device_ids": [1]},
    {"name": "whisper-large-v3", "state": "absent"},
]


def _found(tmp_path, names):
    """What ansible.builtin.find returns for ``*.json`` in a state dir holding ``names`` (path and isreg)."""
    for name in names:
        (tmp_path / name).write_text("{}")
    return [
        {"path": str(tmp_path / name), "isreg": os.path.isfile(tmp_path / name) and not os.path.islink(tmp_path / name)}
        for name in sorted(os.listdir(tmp_path))
        if name.endswith(".json")
    ]


def test_an_instance_with_a_state_file_and_no_entry_retires(tmp_path):
    plan = serve_instances(MODELS, "p150")
    files = _found(tmp_path, ["llama-3-1-8b-instruct.json", "qwen.json", "whisper-large-v3.json", "old-model.json"])
    # The absent entry is removed by its own task; only the unlisted instance retires.
    assert serve_retired(files, plan) == ["old-model"]
    assert serve_retired([], plan) == []
    assert retired_instances(files, []) == ["llama-3-1-8b-instruct", "old-model", "qwen", "whisper-large-v3"]


@pytest.mark.parametrize("name", ["Bad Name.json", "x.json.json", "-lead.json", "UPPER.json", "a" * 64 + ".json"])
def test_a_state_file_that_is_not_an_instance_name_is_refused_naming_it(tmp_path, name):
    files = _found(tmp_path, ["qwen.json", name])
    with pytest.raises(ServeError, match=rf"^{tmp_path}/.* is not a state file of the serve role"):
        retired_instances(files, [])
    with pytest.raises(AnsibleFilterError, match=r"^serve_retired: .*set serve_retire_unlisted: false"):
        serve_retired(files, serve_instances(MODELS, "p150"))


def test_a_link_in_the_state_dir_is_refused(tmp_path):
    (tmp_path / "target").write_text("{}")
    os.symlink(tmp_path / "target", tmp_path / "planted.json")
    files = _found(tmp_path, [])
    assert files == [{"path": str(tmp_path / "planted.json"), "isreg": False}]
    with pytest.raises(ServeError, match=r"planted.json is not a state file"):
        retired_instances(files, [])


def test_the_filter_refuses_what_is_no_find_result():
    with pytest.raises(AnsibleFilterError, match=r"^serve_retired: the input must be"):
        serve_retired("qwen.json", {})
    with pytest.raises(AnsibleFilterError, match=r"^serve_retired: malformed find results"):
        serve_retired([{"isreg": True}], {})
