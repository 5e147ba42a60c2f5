# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Unit tests for plugins/module_utils/_plan/reuse.py: which commit made a volume's kernels, and hardlinked volumes."""

from __future__ import annotations

import json
import os

import pytest
from conftest import FIXTURES

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import MARKER_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import (
    RECORD_NAME,
    annotate_candidates,
    apply_hardlink,
    plan_hardlink,
    read_record,
    recorded_commit,
    release_commits,
    same_commit,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import iter_specs, load_spec_file
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.candidates import (
    expected_volume,
    select_candidates,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import scan_roots

LLAMA = "Llama-3.1-8B-Instruct"
OLD = f"volume_id_tt_transformers-{LLAMA}-v0.17.0"
NEW = f"volume_id_tt_transformers-{LLAMA}-v0.19.0"


def _catalog(release):
    return load_spec_file(os.path.join(FIXTURES, "specs", f"release_model_spec-{release}.json.gz"))


def _volume(root, name, model=LLAMA, cache_mesh="P300x2"):
    volume = root / name
    weights = volume / "weights" / model
    weights.mkdir(parents=True)
    for rel, body in (
        ("config.json", b"{}"),
        ("tokenizer.json", b"{}"),
        ("model-00001-of-00002.safetensors", b"a" * 4096),
        ("model-00002-of-00002.safetensors", b"b" * 1024),
        ("original/params.json", b"{}"),
    ):
        (weights / rel).parent.mkdir(parents=True, exist_ok=True)
        (weights / rel).write_bytes(body)
    (weights / ".ttfleet-manifest.json").write_text(json.dumps({"schema": 1, "revision": "0e9e39f"}))
    # An HF-cache style relative link inside the volume keeps working in the new one.
    (volume / "huggingface").mkdir()
    (volume / "huggingface" / "blob").write_bytes(b"blob")
    (volume / "huggingface" / "snapshot").symlink_to("blob")
    if cache_mesh:
        cache = volume / "tt_metal_cache" / f"cache_{model}" / cache_mesh
        cache.mkdir(parents=True)
        (cache / "kernels.bin").write_bytes(b"k" * 100)
    (volume / "logs").mkdir()
    (volume / "logs" / "run.log").write_text("old\n")
    (volume / "model_file_symlinks_map").mkdir()
    (weights.parent / ".ttfleet-staging").mkdir()
    (weights.parent / ".ttfleet-staging" / "leftover.part").write_bytes(b"x")
    return volume


def _derived(release="v0.20.0", root=None):
    return resolve(_catalog(release), LLAMA, "p300x2", volume_root=str(root) if root else None)


def test_same_commit_matches_short_and_full_shas():
    assert same_commit("8c48a10", "8c48a10d3e9a1f0b")
    assert same_commit("8C48A10", "8c48a10")
    assert not same_commit("8c48a10", "b204341")
    assert not same_commit("8c4", "8c48a10")
    assert not same_commit(None, "8c48a10")


def test_release_commits_of_real_specs_date_the_previous_version():
    derived = _derived()
    commits = release_commits([_catalog("v0.18.0")], derived, iter_specs)
    assert commits["0.17.0"][0].startswith("8c48a10")
    assert "v0.18.0" in commits["0.17.0"][1]
    assert not same_commit(commits["0.17.0"][0], derived["tt_metal_commit"])


def _candidates(root, derived, **kwargs):
    volumes, _warnings = scan_roots([str(root)])
    expected = expected_volume(str(root), derived, volumes)
    return expected, annotate_candidates(select_candidates(volumes, derived, expected), derived, str(root), **kwargs)


def test_previous_version_of_another_commit_is_hardlinked(tmp_path):
    _volume(tmp_path, OLD)
    derived = _derived(root=tmp_path)
    commits = release_commits([_catalog("v0.18.0")], derived, iter_specs)
    expected, candidates = _candidates(tmp_path, derived, lookup=commits.get)
    assert expected["type"] == "absent"
    best = candidates[0]
    assert best["kernels"] == "other"
    assert best["reuse"] == "hardlink"
    assert best["same_filesystem"]
    assert "8c48a10" in best["reuse_reason"]


def test_unknown_commit_of_a_version_pin_is_hardlinked_but_a_build_label_is_aliased(tmp_path):
    _volume(tmp_path, OLD)
    derived = _derived(root=tmp_path)
    _expected, candidates = _candidates(tmp_path, derived, lookup=lambda version: None)
    assert candidates[0]["kernels"] == "unknown"
    assert candidates[0]["reuse"] == "hardlink"

    label_root = tmp_path / "label"
    label_root.mkdir()
    _volume(label_root, f"volume_id_tt_transformers-{LLAMA}-vqb2_launch")
    derived = _derived(root=label_root)
    _expected, candidates = _candidates(label_root, derived, lookup=lambda version: None)
    assert candidates[0]["reuse"] == "symlink"
    assert "build label" in candidates[0]["reuse_reason"]


def test_same_commit_or_isolation_off_keeps_the_alias(tmp_path):
    _volume(tmp_path, OLD)
    derived = _derived(root=tmp_path)
    _expected, candidates = _candidates(
        tmp_path, derived, lookup=lambda version: (derived["tt_metal_commit"], "a test")
    )
    assert candidates[0]["kernels"] == "same"
    assert candidates[0]["reuse"] == "symlink"
    _expected, candidates = _candidates(tmp_path, derived, lookup=lambda version: None, isolate=False)
    assert candidates[0]["reuse"] == "symlink"


def test_a_kernel_marker_dates_the_volume_without_any_release(tmp_path):
    volume = _volume(tmp_path, OLD)
    marker = volume / "tt_metal_cache" / f"cache_{LLAMA}" / ".ttfleet-kernels-P300x2.json"
    marker.write_text(json.dumps({"key": {"tt_metal_commit": "8c48a10"}}))
    assert recorded_commit(str(volume), LLAMA, "P300x2") == ("8c48a10", str(marker))
    derived = _derived(root=tmp_path)
    asked = []
    _expected, candidates = _candidates(tmp_path, derived, lookup=asked.append)
    assert candidates[0]["kernels"] == "other"
    assert asked == []


def test_hardlinked_volume_shares_weights_and_starts_an_empty_kernel_cache(tmp_path):
    old = _volume(tmp_path, OLD)
    new = tmp_path / NEW
    plan = plan_hardlink(str(new), str(old), tt_metal_commit="b204341")
    assert plan["action"] == "create"
    assert plan["files"] == 7  # 5 weights + manifest + huggingface/blob; not the cache, logs or staging
    manifest_size = (old / "weights" / LLAMA / ".ttfleet-manifest.json").stat().st_size
    assert plan["bytes"] == 4096 + 1024 + 2 + 2 + 2 + len(b"blob") + manifest_size
    assert not new.exists()
    apply_hardlink(plan)

    for rel in ("config.json", "model-00001-of-00002.safetensors", "original/params.json", ".ttfleet-manifest.json"):
        assert (new / "weights" / LLAMA / rel).stat().st_ino == (old / "weights" / LLAMA / rel).stat().st_ino
    assert os.readlink(new / "huggingface" / "snapshot") == "blob"
    assert (new / "huggingface" / "snapshot").read_bytes() == b"blob"
    assert list((new / "tt_metal_cache").iterdir()) == []
    assert not (new / "logs").exists()
    assert not (new / "model_file_symlinks_map").exists()
    assert not (new / "weights" / ".ttfleet-staging").exists()
    record = read_record(str(new))
    assert record["weights_from"] == str(old)
    assert record["tt_metal_commit"] == "b204341"
    assert recorded_commit(str(new), LLAMA, "P300x2")[0] == "b204341"
    # The old volume is untouched, its kernel cache included.
    assert (old / "tt_metal_cache" / f"cache_{LLAMA}" / "P300x2" / "kernels.bin").read_bytes() == b"k" * 100
    assert not (old / RECORD_NAME).exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ttfleet-tmp-")] == []

    again = plan_hardlink(str(new), str(old), tt_metal_commit="b204341")
    assert again["action"] == "none"
    assert not again["changed"]


def test_hardlink_refuses_to_replace_what_it_did_not_make(tmp_path):
    old = _volume(tmp_path, OLD)
    new = tmp_path / NEW
    new.mkdir()
    (new / "keep").write_text("mine")
    with pytest.raises(VolumeError, match="refusing to replace"):
        plan_hardlink(str(new), str(old))
    plan = plan_hardlink(str(new), str(old), force=True, now=0)
    assert plan["action"] == "move_aside"
    apply_hardlink(plan)
    assert (tmp_path / f"{NEW}.ttfleet-aside-19700101T000000Z" / "keep").read_text() == "mine"
    assert read_record(str(new))["weights_from"] == str(old)


def test_hardlink_refuses_overlaps_and_missing_sources(tmp_path):
    old = _volume(tmp_path, OLD)
    with pytest.raises(VolumeError, match="overlap"):
        plan_hardlink(str(old / "inner"), str(old))
    with pytest.raises(VolumeError, match="not a directory"):
        plan_hardlink(str(tmp_path / NEW), str(tmp_path / "missing"))
    with pytest.raises(VolumeError, match="allowed_roots"):
        plan_hardlink(str(tmp_path / NEW), str(old), allowed_roots=[str(tmp_path / "elsewhere")])


def test_a_failed_build_leaves_no_half_volume_and_the_source_intact(tmp_path, monkeypatch):
    old = _volume(tmp_path, OLD)
    new = tmp_path / NEW
    plan = plan_hardlink(str(new), str(old))
    real_link = os.link
    calls = []

    def failing_link(src, dst, **kwargs):
        calls.append(src)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", dst)
        return real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "link", failing_link)
    with pytest.raises(VolumeError, match="No space left"):
        apply_hardlink(plan)
    assert not new.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ttfleet-tmp-")] == []
    assert (old / "weights" / LLAMA / "model-00001-of-00002.safetensors").stat().st_nlink == 1


def test_a_volume_of_the_same_commit_goes_first(tmp_path):
    _volume(tmp_path, OLD)
    _volume(tmp_path, f"volume_id_tt_transformers-{LLAMA}-v0.18.0", cache_mesh=None)
    derived = _derived(root=tmp_path)
    commits = {"0.17.0": ("8c48a10", "v0.18.0"), "0.18.0": (derived["tt_metal_commit"], "v0.19.0")}
    _expected, candidates = _candidates(tmp_path, derived, lookup=commits.get)
    # Without isolation the cached -v0.17.0 would win; its kernels are of another commit, -v0.18.0's are not.
    assert [c["version"] for c in candidates] == ["0.18.0", "0.17.0"]
    assert candidates[0]["reuse"] == "symlink" and candidates[1]["reuse"] == "hardlink"


@pytest.mark.skipif(os.geteuid() != 0, reason="the layout and the planted files need root")
def test_a_hardlinked_volume_of_a_hostile_source_follows_the_layout(tmp_path):
    victim = tmp_path / "root-only"
    victim.write_bytes(b"secret")
    os.chmod(victim, 0o600)
    old = _volume(tmp_path, OLD)
    weights = old / "weights" / LLAMA
    # What the container user can plant in a volume it owns: a link to a root-only file, a FIFO, a marker
    # FIFO where the kernel cache records its commit.
    (weights / "stolen.json").symlink_to(victim)
    os.mkfifo(weights / "pipe")
    os.mkfifo(old / "tt_metal_cache" / f"cache_{LLAMA}" / f"{MARKER_PREFIX}P300x2.json")
    for current, dirs, names in os.walk(old):
        for name in [*dirs, *names, "."]:
            os.chown(os.path.join(current, name), 1000, 1000, follow_symlinks=False)
    assert recorded_commit(str(old), LLAMA, "P300x2") == (None, None)
    new = tmp_path / NEW
    apply_hardlink(plan_hardlink(str(new), str(old), tt_metal_commit="b204341"))

    assert os.readlink(new / "weights" / LLAMA / "stolen.json") == str(victim)
    assert os.lstat(new / "weights" / LLAMA / "stolen.json").st_uid == 0
    assert not os.path.lexists(new / "weights" / LLAMA / "pipe")
    for rel in (".", "weights", f"weights/{LLAMA}", "huggingface"):
        st = os.lstat(new / rel)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o755), rel
    st = os.lstat(new / "tt_metal_cache")
    assert (st.st_uid, st.st_mode & 0o777) == (1000, 0o755)
    assert (new / RECORD_NAME).stat().st_uid == 0
    assert victim.read_bytes() == b"secret" and (victim.stat().st_uid, victim.stat().st_mode & 0o777) == (0, 0o600)
