# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Unit tests for plugins/module_utils/_volumes/."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.alias import (
    apply_plan,
    plan_absent,
    plan_alias,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.candidates import (
    expected_volume,
    select_candidates,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import (
    tensor_cache_meshes,
    tree_size,
    weights_status,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import expand_roots, scan_root, scan_roots

QB2 = "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
EXPECTED = "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
QWEN = {
    "impl_id": "tt_transformers",
    "model_name": "Qwen3-32B",
    "version": "0.17.0",
    "mesh": "P300x2",
    "volume_name": EXPECTED,
}


def touch(path, data=b"x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


def make_weights(weights_dir, fmt="hf", shards=2, drop=None):
    files = {
        "hf": [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        + ["tokenizer.json", "config.json"],
        "meta": ["consolidated.00.pth", "tokenizer.model", "params.json"],
        "hf_bin": ["pytorch_model-00001-of-00001.bin", "tokenizer_config.json", "config.json"],
        "diffusers": ["unet/diffusion_pytorch_model.safetensors", "model_index.json"],
    }[fmt]
    for name in files:
        if name != drop:
            touch(os.path.join(weights_dir, name))


def make_volume(root, name, model="Qwen3-32B", fmt="hf", meshes=("P300x2",), mtime=None, drop=None):
    path = os.path.join(str(root), name)
    if fmt:
        make_weights(os.path.join(path, "weights", model), fmt=fmt, drop=drop)
    os.makedirs(path, exist_ok=True)
    for mesh in meshes:
        touch(os.path.join(path, "tt_metal_cache", f"cache_{model}", mesh, "kernel.bin"))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def snapshot(root):
    """Every entry under root: links with their text, files with their content."""
    result = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(current, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                result[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                result[rel] = ("dir",)
            else:
                with open(full, "rb") as handle:
                    result[rel] = ("file", handle.read())
    return result


# --------------------------------------------------------------------------- contents


@pytest.mark.parametrize("fmt", ["hf", "meta", "hf_bin", "diffusers"])
def test_weights_complete_for_every_upstream_format(tmp_path, fmt):
    make_weights(str(tmp_path), fmt=fmt)
    status = weights_status(str(tmp_path))
    assert status["complete"] and status["usable"]
    assert status["format"] == fmt
    assert status["missing_shards"] == []


@pytest.mark.parametrize(
    "drop",
    ["model-00001-of-00002.safetensors", "tokenizer.json", "config.json"],
)
def test_weights_incomplete_when_hf_part_missing(tmp_path, drop):
    files = ["model-00001-of-00002.safetensors", "tokenizer.json", "config.json"]
    for name in files:
        if name != drop:
            touch(str(tmp_path / name))
    if drop == "model-00001-of-00002.safetensors":
        # Weights under another name do not count for the hf format.
        touch(str(tmp_path / "weights.safetensors"))
    status = weights_status(str(tmp_path))
    assert not status["complete"] and not status["usable"]
    assert status["format"] is None


def test_weights_diffusers_needs_model_index(tmp_path):
    touch(str(tmp_path / "unet" / "diffusion_pytorch_model.safetensors"))
    assert not weights_status(str(tmp_path))["complete"]
    touch(str(tmp_path / "model_index.json"))
    assert weights_status(str(tmp_path))["format"] == "diffusers"


def test_weights_hf_bin_needs_tokenizer_config(tmp_path):
    touch(str(tmp_path / "pytorch_model.bin"))
    touch(str(tmp_path / "config.json"))
    touch(str(tmp_path / "tokenizer.json"))
    assert not weights_status(str(tmp_path))["complete"]
    touch(str(tmp_path / "tokenizer_config.json"))
    assert weights_status(str(tmp_path))["format"] == "hf_bin"


def test_weights_missing_dir(tmp_path):
    status = weights_status(str(tmp_path / "nope"))
    assert status == {
        "path": str(tmp_path / "nope"),
        "complete": False,
        "format": None,
        "missing_shards": [],
        "usable": False,
    }


def test_weights_index_reports_missing_shards(tmp_path):
    make_weights(str(tmp_path), shards=3, drop="model-00002-of-00003.safetensors")
    index = {"weight_map": {f"layer.{i}": f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)}}
    index["weight_map"]["evil"] = "../../etc/passwd"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    status = weights_status(str(tmp_path))
    assert status["complete"] is True
    assert status["missing_shards"] == ["model-00002-of-00003.safetensors"]
    assert status["usable"] is False


def test_weights_broken_index_is_ignored(tmp_path):
    make_weights(str(tmp_path))
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    assert weights_status(str(tmp_path))["usable"] is True


def test_tensor_cache_meshes_lists_non_empty_dirs_only(tmp_path):
    cache = tmp_path / "tt_metal_cache" / "cache_Qwen3-32B"
    touch(str(cache / "P300x2" / "a.bin"))
    touch(str(cache / "P150x4" / "deep" / "b.bin"))
    (cache / "P300").mkdir()
    touch(str(cache / "stray-file"))
    touch(str(tmp_path / "tt_metal_cache" / "cache_Other" / "N300" / "c.bin"))
    assert tensor_cache_meshes(str(tmp_path), "Qwen3-32B") == ["P150x4", "P300x2"]
    assert tensor_cache_meshes(str(tmp_path), "Missing") == []


def test_tree_size_counts_hardlinks_once_and_skips_symlinks(tmp_path):
    touch(str(tmp_path / "a"), b"1234")
    os.link(tmp_path / "a", tmp_path / "b")
    big = tmp_path / "outside"
    big.mkdir()
    touch(str(big / "huge"), b"0" * 100000)
    tree = tmp_path / "tree"
    tree.mkdir()
    touch(str(tree / "f"), b"12345")
    os.link(tree / "f", tree / "g")
    os.symlink(big, tree / "link")
    apparent, disk, complete = tree_size(str(tree))
    assert complete
    link_size = len(str(big))
    assert apparent == os.lstat(tree).st_size + 5 + link_size
    assert disk >= 0
    assert tree_size(str(tmp_path / "missing")) == (0, 0, False)


# --------------------------------------------------------------------------- scanning


def test_scan_root_reports_every_kind(tmp_path):
    root = tmp_path / "root"
    real = make_volume(root, QB2)
    (root / ".ttfleet-tmp-1").mkdir()
    (root / "unrelated").mkdir()
    os.symlink(QB2, root / EXPECTED)
    os.symlink("gone", root / "volume_id_tt_transformers-Qwen3-32B-v0.14.0")
    touch(str(root / "volume_id_tt_transformers-Qwen3-32B-v0.1.0"))
    touch(os.path.join(real, "weights", "Qwen3-32B", ".ttfleet-manifest.json"), b'{"complete": true}')
    volumes, warnings = scan_root(str(root))
    assert warnings == []
    by_name = {v["name"]: v for v in volumes}
    assert sorted(by_name) == sorted(
        [QB2, EXPECTED, "volume_id_tt_transformers-Qwen3-32B-v0.14.0", "volume_id_tt_transformers-Qwen3-32B-v0.1.0"]
    )

    qb2 = by_name[QB2]
    assert qb2["type"] == "directory" and not qb2["is_link"] and qb2["exists"]
    assert qb2["label"] == "qb2_launch" and qb2["version"] is None
    assert qb2["weights"]["complete"] and qb2["weights"]["format"] == "hf"
    assert qb2["tensor_cache_meshes"] == ["P300x2"]
    assert qb2["uid"] == os.getuid()
    assert qb2["manifest"]["present"] and qb2["manifest"]["data"] == {"complete": True}
    assert "size_bytes" not in qb2

    alias = by_name[EXPECTED]
    assert alias["type"] == "link" and alias["link_target"] == QB2 and alias["exists"]
    assert alias["realpath"] == os.path.realpath(real)
    assert alias["weights"]["complete"] and alias["tensor_cache_meshes"] == ["P300x2"]

    dangling = by_name["volume_id_tt_transformers-Qwen3-32B-v0.14.0"]
    assert dangling["type"] == "link" and not dangling["exists"]
    assert not dangling["weights"]["complete"] and dangling["tensor_cache_meshes"] == []

    stray = by_name["volume_id_tt_transformers-Qwen3-32B-v0.1.0"]
    assert stray["type"] == "file" and not stray["exists"]


def test_scan_root_sizes_on_request(tmp_path):
    make_volume(tmp_path, QB2)
    os.symlink(QB2, tmp_path / EXPECTED)
    volumes = scan_root(str(tmp_path), sizes=True)[0]
    by_name = {v["name"]: v for v in volumes}
    assert by_name[QB2]["size_bytes"] > 0 and by_name[QB2]["size_complete"]
    # An alias reports the size of what it points at.
    assert by_name[EXPECTED]["size_bytes"] == by_name[QB2]["size_bytes"]


def test_scan_root_skips_hostile_names(tmp_path):
    make_volume(tmp_path, QB2)
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"volume_id_x-bad\xff-v1.0.0"))
    os.mkdir(tmp_path / "volume_id_x-new\nline-v1.0.0")
    volumes, warnings = scan_root(str(tmp_path))
    assert [v["name"] for v in volumes] == [QB2]
    assert len(warnings) == 2
    assert all("unusable name" in w and "\n" not in w for w in warnings)


def test_scan_root_missing_root_is_empty(tmp_path):
    assert scan_root(str(tmp_path / "absent")) == ([], [])


def test_scan_root_unreadable_root_warns(tmp_path, monkeypatch):
    def deny(_path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "listdir", deny)
    volumes, warnings = scan_root(str(tmp_path))
    assert volumes == [] and "Permission denied" in warnings[0]


def test_expand_roots_globs_and_dedupes(tmp_path):
    for user in ("alice", "bob"):
        (tmp_path / "home" / user / "data" / "tt-cache").mkdir(parents=True)
    (tmp_path / "home" / "carol").mkdir()
    os.symlink(tmp_path / "home" / "alice" / "data" / "tt-cache", tmp_path / "again")
    roots = expand_roots(
        [
            str(tmp_path / "home" / "*" / "data" / "tt-cache"),
            str(tmp_path / "again"),
            str(tmp_path / "missing"),
            "",
        ]
    )
    assert roots == [
        str(tmp_path / "home" / "alice" / "data" / "tt-cache"),
        str(tmp_path / "home" / "bob" / "data" / "tt-cache"),
    ]


# --------------------------------------------------------------------------- expected and candidates


def test_quietbox2_label_is_the_candidate(tmp_path):
    make_volume(tmp_path, QB2)
    volumes = scan_root(str(tmp_path))[0]
    expected = expected_volume(str(tmp_path), QWEN, volumes)
    assert expected["name"] == EXPECTED and expected["path"] == str(tmp_path / EXPECTED)
    assert expected["exists"] is False and expected["is_alias"] is False and expected["type"] == "absent"
    candidates = select_candidates(volumes, QWEN, expected)
    assert [c["name"] for c in candidates] == [QB2]
    assert candidates[0]["label"] == "qb2_launch" and candidates[0]["tensor_cache_for_mesh"]


def test_expected_name_derived_without_volume_name(tmp_path):
    derived = {k: v for k, v in QWEN.items() if k != "volume_name"}
    assert expected_volume(str(tmp_path), derived)["name"] == EXPECTED


def test_expected_alias_is_reported_and_its_target_is_no_candidate(tmp_path):
    make_volume(tmp_path, QB2)
    os.symlink(QB2, tmp_path / EXPECTED)
    volumes = scan_root(str(tmp_path))[0]
    expected = expected_volume(str(tmp_path), QWEN, volumes)
    assert expected["exists"] and expected["is_alias"] and expected["link_target"] == QB2
    assert expected["tensor_cache_for_mesh"] is True
    assert select_candidates(volumes, QWEN, expected) == []


def test_candidates_order(tmp_path):
    root = tmp_path / "root"
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-v0.14.0", meshes=(), mtime=3000)
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-v0.9.0", meshes=("P300x2",), mtime=1000)
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-v0.10.0", meshes=("P300x2",), mtime=500)
    make_volume(root, QB2, meshes=("P300x2",), mtime=9000)
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-vold", meshes=("P300x2",), mtime=100)
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-vwrongmesh", meshes=("P150x4",), mtime=9999)
    # Not candidates: incomplete weights, other model, other impl, missing shard.
    make_volume(root, "volume_id_tt_transformers-Qwen3-32B-v0.16.0", drop="tokenizer.json")
    make_volume(root, "volume_id_tt_transformers-Qwen3-8B-v0.17.0", model="Qwen3-8B")
    make_volume(root, "volume_id_qwen3_32b_galaxy-Qwen3-32B-v0.17.0")
    make_volume(root, EXPECTED + ".ttfleet-aside-20261130T041500Z", mtime=99999)
    broken = make_volume(root, "volume_id_tt_transformers-Qwen3-32B-v0.15.0")
    touch(
        os.path.join(broken, "weights", "Qwen3-32B", "model.safetensors.index.json"),
        json.dumps({"weight_map": {"a": "model-00009-of-00009.safetensors"}}).encode(),
    )
    volumes = scan_root(str(root))[0]
    expected = expected_volume(str(root), QWEN, volumes)
    names = [c["name"].rsplit("-v", 1)[1] for c in select_candidates(volumes, QWEN, expected)]
    assert names == ["0.10.0", "0.9.0", "qb2_launch", "old", "0.14.0", "wrongmesh"]


def test_candidates_prefer_real_dir_over_link_to_it(tmp_path):
    make_volume(tmp_path, QB2)
    os.symlink(QB2, tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.14.0")
    volumes = scan_root(str(tmp_path))[0]
    expected = expected_volume(str(tmp_path), QWEN, volumes)
    candidates = select_candidates(volumes, QWEN, expected)
    assert [c["name"] for c in candidates] == [QB2]
    # A link whose target lives outside the scanned roots still counts.
    other = tmp_path / "elsewhere"
    make_volume(other, "data")
    os.rename(other / "data", other / "v")
    os.makedirs(other / "v" / "weights", exist_ok=True)
    os.symlink(other / "v", tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.16.0")
    volumes = scan_root(str(tmp_path))[0]
    candidates = select_candidates(volumes, QWEN, expected)
    assert [(c["is_link"], c["version"] or c["label"]) for c in candidates] == [(True, "0.16.0"), (False, "qb2_launch")]


def test_candidates_from_search_roots_including_same_name(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    seeded = tmp_path / "home" / "tt" / "data" / "tt-cache"
    make_volume(seeded, EXPECTED)
    make_volume(seeded, QB2, meshes=())
    roots = expand_roots([str(root), str(tmp_path / "home" / "*" / "data" / "tt-cache")])
    volumes = scan_roots(roots)[0]
    expected = expected_volume(str(root), QWEN, volumes)
    candidates = select_candidates(volumes, QWEN, expected)
    assert [c["path"] for c in candidates] == [str(seeded / EXPECTED), str(seeded / QB2)]


def test_candidate_with_hyphen_v_label_uses_expected_model(tmp_path):
    make_volume(tmp_path, "volume_id_tt_transformers-Qwen3-32B-vqb2-vfinal")
    volumes = scan_root(str(tmp_path))[0]
    assert volumes[0]["model_name"] == "Qwen3-32B-vqb2" and not volumes[0]["weights"]["complete"]
    expected = expected_volume(str(tmp_path), QWEN, volumes)
    candidates = select_candidates(volumes, QWEN, expected)
    assert len(candidates) == 1
    assert candidates[0]["label"] == "qb2-vfinal" and candidates[0]["model_name"] == "Qwen3-32B"
    assert candidates[0]["tensor_cache_for_mesh"]


# --------------------------------------------------------------------------- alias plans


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "cache"
    make_volume(root, QB2)
    return root


def test_alias_create_relative_then_idempotent(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    before = snapshot(tree)
    plan = plan_alias(path, src)
    assert snapshot(tree) == before  # planning alone is check mode
    assert plan["action"] == "create" and plan["changed"]
    assert plan["target"] == QB2 and plan["previous_state"] == "absent" and plan["previous_target"] is None
    assert plan["diff"]["before"] == "absent\n" and plan["diff"]["after"] == QB2 + "\n"
    apply_plan(plan)
    assert os.readlink(path) == QB2
    assert os.path.isfile(os.path.join(path, "weights", "Qwen3-32B", "config.json"))
    again = plan_alias(path, src)
    assert again["action"] == "none" and not again["changed"]
    assert again["diff"]["before"] == again["diff"]["after"]
    assert again["previous_target"] == QB2
    assert sorted(os.listdir(tree)) == sorted([QB2, EXPECTED])


def test_alias_relative_target_crosses_directories(tmp_path):
    src = make_volume(tmp_path / "seed" / "tt-cache", QB2)
    (tmp_path / "srv").mkdir()
    os.symlink(tmp_path / "srv", tmp_path / "srvlink")
    path = str(tmp_path / "srvlink" / EXPECTED)
    plan = plan_alias(path, src)
    assert plan["target"] == os.path.join("..", "seed", "tt-cache", QB2)
    apply_plan(plan)
    assert os.path.realpath(path) == os.path.realpath(src)


def test_alias_absolute_on_request(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    apply_plan(plan_alias(path, src, relative=False))
    assert os.readlink(path) == src
    # Switching the link form is a change; same form again is not.
    assert plan_alias(path, src)["action"] == "replace"
    assert plan_alias(path, src, relative=False)["action"] == "none"


def test_alias_replaces_link_atomically_and_returns_previous(tree, monkeypatch):
    other = make_volume(tree, "volume_id_tt_transformers-Qwen3-32B-v0.14.0")
    path = str(tree / EXPECTED)
    os.symlink(QB2, path)
    calls = []
    real_replace = os.replace

    def spy(a, b):
        calls.append((a, b))
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", spy)
    plan = plan_alias(path, other)
    assert plan["action"] == "replace" and plan["previous_target"] == QB2
    assert plan["diff"]["before"] == QB2 + "\n"
    apply_plan(plan)
    assert os.readlink(path) == os.path.basename(other)
    assert len(calls) == 1 and calls[0][1] == path
    assert os.path.dirname(calls[0][0]) == str(tree)
    assert not [n for n in os.listdir(tree) if n.startswith(TEMP_PREFIX)]


def test_alias_replaces_dangling_link(tree):
    path = str(tree / EXPECTED)
    os.symlink("gone", path)
    plan = plan_alias(path, str(tree / QB2))
    assert plan["action"] == "replace" and plan["previous_target"] == "gone"
    apply_plan(plan)
    assert os.readlink(path) == QB2


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_alias_refuses_real_entry_naming_both_paths(tree, kind):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    if kind == "directory":
        touch(os.path.join(path, "keep.txt"), b"precious")
    else:
        touch(path, b"precious")
    before = snapshot(tree)
    with pytest.raises(VolumeError) as err:
        plan_alias(path, src)
    message = str(err.value)
    assert path in message and src in message and "force: true" in message and f"real {kind}" in message
    assert snapshot(tree) == before


def test_alias_force_moves_real_directory_aside(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    touch(os.path.join(path, "keep.txt"), b"precious")
    plan = plan_alias(path, src, force=True, now=1764475200)
    assert plan["action"] == "move_aside" and plan["previous_state"] == "directory"
    assert plan["moved_aside"] == path + ".ttfleet-aside-20251130T040000Z"
    assert plan["diff"]["before"] == "<directory>\n"
    assert os.path.isdir(path) and not os.path.islink(path)  # plan only
    apply_plan(plan)
    assert os.readlink(path) == QB2
    with open(os.path.join(plan["moved_aside"], "keep.txt"), "rb") as handle:
        assert handle.read() == b"precious"
    # A second forced run on the alias is a no-op; a clash of aside names gets a counter.
    assert plan_alias(path, src, force=True)["action"] == "none"
    os.unlink(path)
    os.mkdir(path)
    assert plan_alias(path, src, force=True, now=1764475200)["moved_aside"] == plan["moved_aside"] + "-1"


def test_alias_force_moves_file_aside(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    touch(path, b"precious")
    plan = apply_plan(plan_alias(path, src, force=True))
    with open(plan["moved_aside"], "rb") as handle:
        assert handle.read() == b"precious"


@pytest.mark.parametrize("how", ["self", "inside", "through_link", "ancestor", "chain"])
def test_alias_refuses_loops(tmp_path, how):
    root = tmp_path / "root"
    make_volume(root, QB2)
    path = root / EXPECTED
    if how == "self":
        path.mkdir()
        src = path
    elif how == "inside":
        touch(str(path / "sub" / "f"))
        src = path / "sub"
    elif how == "through_link":
        os.symlink(QB2, path)
        os.symlink(EXPECTED, root / "volume_id_tt_transformers-Qwen3-32B-v0.14.0")
        src = root / "volume_id_tt_transformers-Qwen3-32B-v0.14.0"
    elif how == "ancestor":
        src = root
    else:
        os.symlink(QB2, path)
        src = path / "weights"
    before = snapshot(tmp_path)
    with pytest.raises(VolumeError, match="loop"):
        plan_alias(str(path), str(src), force=True)
    assert snapshot(tmp_path) == before


def test_alias_allowed_roots(tmp_path):
    allowed = tmp_path / "allowed"
    inside = make_volume(allowed, QB2)
    outside = make_volume(tmp_path / "other", QB2)
    os.symlink(outside, allowed / "volume_id_tt_transformers-Qwen3-32B-v0.14.0")
    path = str(allowed / EXPECTED)
    assert plan_alias(path, inside, allowed_roots=[str(allowed)])["action"] == "create"
    with pytest.raises(VolumeError, match="outside allowed_roots"):
        plan_alias(path, outside, allowed_roots=[str(allowed)])
    # A link under an allowed root that escapes it is judged by where it resolves.
    with pytest.raises(VolumeError, match="outside allowed_roots") as err:
        plan_alias(path, str(allowed / "volume_id_tt_transformers-Qwen3-32B-v0.14.0"), allowed_roots=[str(allowed)])
    assert os.path.realpath(outside) in str(err.value)
    # Prefix tricks do not count as inside.
    with pytest.raises(VolumeError, match="outside allowed_roots"):
        plan_alias(path, inside, allowed_roots=[str(allowed) + "x", str(tmp_path / "allow")])
    assert plan_alias(path, outside, allowed_roots=[str(allowed), str(tmp_path / "other")])["changed"]


@pytest.mark.parametrize(
    "setup, problem",
    [("missing", "does not exist"), ("file", "is not a directory"), ("dangling", "dangling symlink")],
)
def test_alias_refuses_bad_sources(tmp_path, setup, problem):
    src = tmp_path / "src"
    if setup == "file":
        touch(str(src))
    elif setup == "dangling":
        os.symlink("nowhere", src)
    with pytest.raises(VolumeError, match=problem) as err:
        plan_alias(str(tmp_path / EXPECTED), str(src))
    assert str(src) in str(err.value)
    assert not os.path.lexists(tmp_path / EXPECTED)


def test_alias_refuses_missing_parent(tmp_path):
    src = make_volume(tmp_path, QB2)
    with pytest.raises(VolumeError, match="create the volume root first"):
        plan_alias(str(tmp_path / "nope" / EXPECTED), src)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("path", "/tmp/a\x00b", "control characters"),
        ("path", "/tmp/a\nb", "control characters"),
        ("src", "/tmp/\x1b[31m", "control characters"),
        ("src", "/tmp/\x7f", "control characters"),
        ("path", "/tmp/bad\udcff", "not valid UTF-8"),
        ("path", "relative/alias", "absolute path"),
        ("src", "", "non-empty"),
        ("allowed_roots", "/ok\x00", "control characters"),
    ],
)
def test_alias_rejects_bad_text_before_touching_filesystem(monkeypatch, field, value, match):
    def forbidden(*_args, **_kwargs):
        raise AssertionError("filesystem touched")

    for name in ("lstat", "stat", "readlink", "listdir", "scandir"):
        monkeypatch.setattr(os, name, forbidden)
    args = {"path": "/tmp/alias", "src": "/tmp/src", "allowed_roots": None}
    args[field] = [value] if field == "allowed_roots" else value
    with pytest.raises(VolumeError, match=match):
        plan_alias(**args)
    if field == "path":
        with pytest.raises(VolumeError, match=match):
            plan_absent(value)


def test_absent_removes_only_links(tree):
    path = str(tree / EXPECTED)
    assert plan_absent(path)["action"] == "none"
    os.symlink(QB2, path)
    plan = plan_absent(path)
    assert plan["action"] == "remove" and plan["previous_target"] == QB2
    assert plan["diff"]["before"] == QB2 + "\n" and plan["diff"]["after"] == "absent\n"
    apply_plan(plan)
    assert not os.path.lexists(path)
    assert os.path.isdir(tree / QB2)
    assert plan_absent(path)["changed"] is False


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_absent_refuses_real_entries(tree, kind):
    path = str(tree / EXPECTED)
    if kind == "directory":
        touch(os.path.join(path, "keep.txt"))
    else:
        touch(path)
    before = snapshot(tree)
    with pytest.raises(VolumeError, match=f"real {kind}") as err:
        plan_absent(path)
    assert path in str(err.value)
    assert snapshot(tree) == before


def test_apply_rechecks_state(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    plan = plan_alias(path, src)
    os.mkdir(path)
    with pytest.raises(VolumeError, match="changed while planning"):
        apply_plan(plan)
    assert os.path.isdir(path) and not os.path.islink(path)
    os.rmdir(path)
    os.symlink("x", path)
    plan = plan_absent(path)
    os.unlink(path)
    touch(path)
    with pytest.raises(VolumeError, match="changed while planning"):
        apply_plan(plan)
    assert os.path.isfile(path)


def test_apply_refuses_when_aside_name_appears(tree):
    path, src = str(tree / EXPECTED), str(tree / QB2)
    os.mkdir(path)
    plan = plan_alias(path, src, force=True)
    os.mkdir(plan["moved_aside"])
    with pytest.raises(VolumeError, match="appeared"):
        apply_plan(plan)
    assert os.path.isdir(path) and not os.path.islink(path)
