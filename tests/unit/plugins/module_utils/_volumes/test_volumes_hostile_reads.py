"""Reads inside volumes (issue 13, Broke 6 for volume_facts and fleet_status): a FIFO, a link or a device where an
index, the manifest, the weights or a state file belongs is never opened, so nothing blocks; the volume reports the
problem instead of crashing, and nothing outside the volume is read through a link placed inside it."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import status as _status
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME, SHARD_INDEXES
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import scan_root
from ansible_collections.ttfleet.inference.plugins.modules import volume_facts

MODEL = "Qwen3-32B"
NAME = "volume_id_tt_transformers-Qwen3-32B-v0.14.0"


def make_volume(root, name=NAME):
    weights = os.path.join(str(root), name, "weights", MODEL)
    os.makedirs(weights)
    for file in ("model-00001-of-00001.safetensors", "tokenizer.json", "config.json"):
        with open(os.path.join(weights, file), "wb") as handle:
            handle.write(b"x")
    mesh = os.path.join(str(root), name, "tt_metal_cache", f"cache_{MODEL}", "P300x2")
    os.makedirs(mesh)
    with open(os.path.join(mesh, "k.bin"), "wb") as handle:
        handle.write(b"k")
    return os.path.join(str(root), name), weights


def within(seconds, func, *args, **kwargs):
    """func's result, failing the test when it takes longer than ``seconds`` (a blocked open of a FIFO)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = func(*args, **kwargs)
        except BaseException as exc:  # re-raised in the test thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{func.__name__} blocked for {seconds}s"
    assert time.monotonic() - started < seconds
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.mark.parametrize("index", SHARD_INDEXES)
def test_fifo_index_is_reported_and_makes_the_weights_unusable(tmp_path, index):
    _path, weights = make_volume(tmp_path)
    os.mkfifo(os.path.join(weights, index))
    volumes, warnings = within(5, scan_root, str(tmp_path))
    assert warnings == []
    (volume,) = volumes
    assert volume["weights"]["complete"] and not volume["weights"]["usable"]
    assert any(index in problem and "fifo" in problem for problem in volume["problems"]), volume["problems"]
    assert volume["tensor_cache_meshes"] == ["P300x2"]


def test_fifo_manifest_is_reported(tmp_path):
    _path, weights = make_volume(tmp_path)
    os.mkfifo(os.path.join(weights, MANIFEST_NAME))
    (volume,) = within(5, scan_root, str(tmp_path))[0]
    assert volume["manifest"]["present"] and volume["manifest"]["data"] is None
    assert "fifo" in volume["manifest"]["error"]
    assert any(MANIFEST_NAME in problem for problem in volume["problems"])
    assert volume["weights"]["usable"]


def test_links_inside_a_volume_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.json"
    secret.write_text(json.dumps({"weight_map": {"a": "root-only-name.safetensors"}, "repo_id": "secret"}))
    os.chmod(secret, 0o600)
    root = tmp_path / "root"
    _path, weights = make_volume(root)
    os.symlink(secret, os.path.join(weights, "model.safetensors.index.json"))
    os.symlink(secret, os.path.join(weights, MANIFEST_NAME))
    (volume,) = scan_root(str(root))[0]
    assert "root-only-name.safetensors" not in json.dumps(volume)
    assert "secret" not in json.dumps(volume["manifest"]["data"])
    assert not volume["weights"]["usable"]
    assert any("symbolic link" in problem for problem in volume["problems"])


def test_weights_directory_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _other_path, other_weights = make_volume(elsewhere)
    root = tmp_path / "root"
    _path, weights = make_volume(root)
    os.rename(weights, weights + ".real")
    os.symlink(other_weights, weights)
    (volume,) = scan_root(str(root))[0]
    assert not volume["weights"]["complete"]
    assert any("weights not inspected" in problem for problem in volume["problems"])


def test_alias_of_a_volume_is_still_resolved(tmp_path):
    path, _weights = make_volume(tmp_path)
    alias = tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    os.symlink(os.path.basename(path), alias)
    by_name = {v["name"]: v for v in scan_root(str(tmp_path))[0]}
    assert by_name[alias.name]["weights"]["usable"] and by_name[alias.name]["problems"] == []


def test_volume_facts_with_a_fifo_index_returns_quickly(tmp_path, capsys):
    _path, weights = make_volume(tmp_path)
    os.mkfifo(os.path.join(weights, "model.safetensors.index.json"))

    def run():
        with patch_module_args({"root": str(tmp_path), "sizes": True}), pytest.raises(SystemExit) as exc:
            volume_facts.main()
        return exc.value.code

    assert within(10, run) == 0
    result = json.loads(capsys.readouterr().out)
    (volume,) = result["volumes"]
    assert any("fifo" in problem for problem in volume["problems"])


def test_fleet_status_reads_no_fifo_state_file_and_no_fifo_index(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "a.json")
    path, weights = make_volume(tmp_path / "vols")
    os.mkfifo(os.path.join(weights, "model.safetensors.index.json"))
    (state / "b.json").write_text(json.dumps({"model": MODEL, "volume": path}))
    found = within(5, _status.read_state_files, str(state))
    assert [entry["instance"] for entry in found] == ["a", "b"]
    assert "fifo" in found[0]["error"] and found[1]["error"] is None
    info = within(5, _status.describe_expected, path, MODEL)
    assert info["weights"]["complete"] and not info["weights"]["usable"]
    assert any("fifo" in problem for problem in info["problems"])
