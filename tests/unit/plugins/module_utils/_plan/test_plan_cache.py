# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The plan of the model_cache role: module_utils/_plan/cache.py and the model_cache_plan module, on real spec exports,
real volume trees and a real path source (listed and compared by model_weights' own check mode)."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import FIXTURES, patch_module_args
from unit_helpers import package_spec

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import cache as cp
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import source as ttis_source
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
from ansible_collections.ttfleet.inference.plugins.modules import model_cache_plan as module

SPEC = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
LLAMA = "Llama-3.1-8B-Instruct"
SHA = "0e9e39f249a16976918f6564b8830bc894c89659"
FILES = {
    "config.json": b"{}",
    "tokenizer.json": b"{}",
    "model-00001-of-00002.safetensors": b"a" * 4096,
    "model-00002-of-00002.safetensors": b"b" * 1024,
}


def _weights(directory, manifest_revision=None):
    directory.mkdir(parents=True)
    for rel, body in FILES.items():
        (directory / rel).write_bytes(body)
    if manifest_revision:
        (directory / ".ttfleet-manifest.json").write_text(json.dumps({"schema": 1, "revision": manifest_revision}))
    return directory


def _copied(directory):
    """Files that are not root's with mode 0644 are copied, not hardlinked: every byte is planned."""
    for rel in FILES:
        os.chmod(directory / rel, 0o600)
    return directory


def _args(tmp_path, models, **extra):
    return {
        "models": models,
        "device": "p300x2",
        "volume_root": str(tmp_path / "volumes"),
        "spec_file": SPEC,
        "host": "qb2-1",
        "disk_margin_gb": 0,
        "_ansible_check_mode": True,
        **extra,
    }


def run(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


# --- sources -----------------------------------------------------------------------------------


def test_a_candidate_recording_another_revision_is_no_candidate():
    candidates = [{"path": "/a", "manifest": {"data": {"revision": "1" * 40}}}, {"path": "/b", "manifest": None}]
    assert [c["path"] for c in cp.fresh_candidates(candidates, "2" * 40)] == ["/b"]
    assert [c["path"] for c in cp.fresh_candidates(candidates, "1" * 40)] == ["/a", "/b"]
    # Without a pinned revision every candidate stays.
    assert len(cp.fresh_candidates(candidates, "")) == 2


def test_the_first_source_that_applies_wins_and_says_why_the_others_did_not():
    expected = {"path": "/v/x", "type": "absent", "exists": False}
    reasons = cp.source_reasons(expected, [], SHA, "/srv/models/x", False, "")
    source, reason = cp.choose_source("h", "M", {}, expected, ["preseeded", "s3", "path", "hf"], reasons, [])
    assert source == "path"
    assert reason.startswith("path: the copy at /srv/models/x (before it, preseeded did not apply: no volume")
    assert "s3 did not apply: no model_cache_s3_bucket" in reason


def test_preseeded_applies_to_weights_in_place_that_no_fetch_recorded():
    placed = {
        "path": "/v/x",
        "type": "dir",
        "exists": True,
        "weights": {"usable": True},
        "manifest": {"present": False},
    }
    assert cp.source_reasons(placed, [], "", "", False, "")["preseeded"][0]
    fetched = dict(placed, manifest={"present": True})
    assert not cp.source_reasons(fetched, [], "", "", False, "")["preseeded"][0]
    # A floating revision makes hf and s3 apply; s3 still needs a bucket.
    floating = cp.source_reasons(fetched, [], "", "", True, "models")
    assert floating["hf"][0] and floating["s3"][0] and not floating["path"][0]


def test_no_source_names_the_host_the_model_and_the_fix():
    expected = {"path": "/v/x", "type": "absent", "exists": False}
    reasons = cp.source_reasons(expected, [], "", "", False, "")
    spec = {"hf_weights_repo": "meta-llama/M", "model_name": "M"}
    with pytest.raises(cp.PlanError) as info:
        cp.choose_source("qb2-1", "M", spec, expected, ["hf"], reasons, ["/data/*"])
    message = str(info.value)
    assert message.startswith('qb2-1: no source in ["hf"] can fill /v/x for M (meta-llama/M)')
    assert 'under ["/data/*"]' in message and "set revision to a commit SHA of meta-llama/M" in message


def test_disk_shortfalls_sum_the_models_of_each_filesystem():
    work = [
        {"model": "A", "fs_device": 1, "fs_path": "/mnt/small", "fs_free": 5000, "bytes_needed": 3000},
        {"model": "B", "fs_device": 1, "fs_path": "/mnt/small", "fs_free": 5000, "bytes_needed": 3000},
        {"model": "C", "fs_device": 2, "fs_path": "/big", "fs_free": 10**9, "bytes_needed": 3000},
        {"model": "D", "fs_device": None, "bytes_needed": 0},
    ]
    short = cp.disk_shortfalls(work, 0)
    assert short == [{"path": "/mnt/small", "models": ["A", "B"], "needed": 6000, "free": 5000}]
    # The margin counts once per filesystem: A alone with a margin that fills the rest.
    assert cp.disk_shortfalls(work[:1] + work[2:], 2001)[0]["models"] == ["A"]
    assert cp.disk_shortfalls(work[:1], 2000) == []
    text = cp.shortfall_text("h", short, 0)
    assert text.startswith("h: not enough free space in /mnt/small for the weights of A, B: needed 6000 bytes")
    assert text.endswith("put tt_volume_root on a bigger filesystem.")


def _params(tmp_path, **extra):
    """The module's parameters as AnsibleModule gives them (its defaults, then these) for plan_cache."""
    defaults = {name: option.get("default") for name, option in module.ARGUMENT_SPEC.items()}
    return {
        **defaults,
        "models": [{"name": LLAMA}],
        "device": "p300x2",
        "volume_root": str(tmp_path / "volumes"),
        "spec_file": SPEC,
        "weights": False,
        "host": "qb2-1",
        "disk_margin_gb": 0,
        **extra,
    }


def test_check_entry_names_the_entry_and_the_field():
    entry = {"name": LLAMA, "device": "n150", "impl": None}
    assert cp.check_entry(entry, 0) is entry
    with pytest.raises(cp.PlanError, match=r"^models\[3\] has no name; give each tt_models entry"):
        cp.check_entry({"name": ""}, 3)
    with pytest.raises(cp.PlanError, match=f"^tt_models entry {re.escape(LLAMA)}: image must be a string, got 7$"):
        cp.check_entry({"name": LLAMA, "image": 7}, 0)


def test_unique_work_keeps_one_entry_per_directory_models_before_extras():
    records = [
        {"work": {"dest": "/v/a/weights/A", "model": "A"}, "extras": [{"dest": "/v/a/weights/D", "model": "A--D"}]},
        # A second instance of model A shares its volume, draft included.
        {"work": {"dest": "/v/a/weights/A", "model": "A"}, "extras": [{"dest": "/v/a/weights/D", "model": "A--D"}]},
        {"name": "B"},  # weights: false records carry no work
        {"work": {"dest": "/v/b/weights/B", "model": "B"}},
    ]
    assert [item["model"] for item in cp.unique_work(records)] == ["A", "B", "A--D"]


def test_plan_cache_refuses_before_reading_anything(tmp_path):
    # No catalog is read and no volume scanned: the spec file does not exist.
    params = _params(tmp_path, spec_file=str(tmp_path / "missing.json"))
    with pytest.raises(cp.WeightsError, match=r"^s3_endpoint must not carry credentials$"):
        cp.plan_cache(params, print, "s3_endpoint must not carry credentials")
    with pytest.raises(cp.PlanError, match=r"^disk_margin_gb must not be negative, got -1$"):
        cp.plan_cache({**params, "disk_margin_gb": -1}, print)


def test_plan_cache_without_weights_resolves_specs_and_kernel_keys(tmp_path):
    warnings = []
    result = cp.plan_cache(_params(tmp_path), warnings.append)
    (model,) = result["models"]
    assert set(model) == {"name", "entry", "spec", "kernel"}
    assert model["kernel"]["model_name"] == LLAMA and model["kernel"]["mesh"] == "P300x2"
    assert result["work"] == [] and result["root_exists"] is False and result["changed"] is False


def test_failure_text_hides_every_secret_and_names_a_filesystem_error():
    params = {"hf_token": "hf_tok", "s3_secret_key": "s3_sec", "s3_session_token": "s3_ses", "s3_access_key": "AKIA"}
    exc = cp.PlanError("qb2-1: hf_tok s3_sec s3_ses AKIA https://u:pw@hub.example/x")
    text = cp.failure_text(exc, params)
    assert text == "qb2-1: ******** ******** ******** ******** https://********@hub.example/x"
    oserror = cp.failure_text(PermissionError(13, "Permission denied", "/v/hf_tok"), params)
    assert oserror == "cannot plan the model cache: [Errno 13] Permission denied: '/v/********'"


# --- the module --------------------------------------------------------------------------------


def test_a_path_source_is_listed_and_its_bytes_planned(tmp_path, capsys):
    source = _copied(_weights(tmp_path / "nfs" / LLAMA))
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA, "path": str(source)}], sources=["preseeded", "path"]))
    assert code == 0, result
    [model] = result["models"]
    assert model["source"] == "path" and model["action"] == "fetch"
    assert model["reason"].startswith(f"path: the copy at {source} (before it, preseeded did not apply")
    assert model["bytes_to_fetch"] == sum(len(body) for body in FILES.values())
    assert model["volume"]["type"] == "absent" and model["candidate"] is None
    assert model["volume"]["path"] == model["spec"]["paths"]["volume"]
    assert model["kernel"] == {
        "volume": model["spec"]["paths"]["volume"],
        "volume_name": model["spec"]["volume_name"],
        "model_name": LLAMA,
        "mesh": "P300x2",
        "impl_id": "tt_transformers",
        "tt_metal_commit": model["spec"]["tt_metal_commit"],
        "vllm_commit": model["spec"]["vllm_commit"] or "",
    }
    assert result["work"] == [model["work"]]
    assert model["work"]["origin"] == "path" and not model["work"]["shareable"]
    assert result["root_exists"] is False
    # Check mode wrote nothing, not even the volume root.
    assert not (tmp_path / "volumes").exists()


def test_a_preseeded_volume_is_the_alias_of_the_expected_one(tmp_path, capsys):
    old = tmp_path / "volumes" / f"volume_id_tt_transformers-{LLAMA}-v0.17.0"
    _weights(old / "weights" / LLAMA)
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA, "revision": SHA}]))
    assert code == 0, result
    [model] = result["models"]
    assert (model["source"], model["action"]) == ("preseeded", "alias")
    assert model["candidate"]["path"] == str(old)
    assert model["candidate"]["reuse"] in ("symlink", "hardlink") and model["candidate"]["reuse_reason"]
    assert model["bytes_to_fetch"] == 0 and model["filesystem"] is None
    assert model["work"]["alias_from"] == str(old) and model["work"]["link"] == model["candidate"]["reuse"]
    assert result["root_exists"] is True


def test_only_weights_in_place_whose_layout_is_off_are_pending(tmp_path, capsys):
    """An own record is pending while model_weights (source none) would change the volume's layout, and not once it
    has it: the role skips the module on a converged host (issue 34). Owners as the module would see them."""
    old = tmp_path / "volumes" / f"volume_id_tt_transformers-{LLAMA}-v0.17.0"
    _weights(old / "weights" / LLAMA)
    args = _args(tmp_path, [{"name": LLAMA, "revision": SHA}], container_owner=1000, container_group=1000)
    code, result = run(capsys, args)
    assert result["models"][0]["action"] == "alias" and result["models"][0]["pending"] is True
    # The weights at the expected volume's own path: no alias, only the layout.
    volume = tmp_path / "volumes" / os.path.basename(result["models"][0]["volume"]["path"])
    old.rename(volume)
    code, result = run(capsys, args)
    assert code == 0, result
    [model] = result["models"]
    assert (model["source"], model["action"]) == ("preseeded", "own")
    assert model["pending"] is True and model["work"]["pending"] is False
    for name in ("tt_metal_cache", "logs", "model_file_symlinks_map", "huggingface"):
        (volume / name).mkdir()
        os.chown(volume / name, 1000, 1000)
    for directory in (volume, volume / "weights"):
        os.chown(directory, os.getuid(), os.getgid())
        os.chmod(directory, 0o755)
    if os.getuid() != 0:
        pytest.skip("the layout wants root's volume directories: run as root to see it converged")
    code, result = run(capsys, args)
    assert code == 0, result
    assert result["models"][0]["pending"] is False
    # Still pending when one directory of the container user is missing again.
    os.rmdir(volume / "logs")
    code, result = run(capsys, args)
    assert result["models"][0]["pending"] is True


def test_a_fetch_is_pending_while_bytes_are_missing_and_not_once_they_are_in_place(tmp_path, capsys):
    source = _copied(_weights(tmp_path / "nfs" / LLAMA))
    args = _args(tmp_path, [{"name": LLAMA, "path": str(source)}], sources=["path"])
    code, result = run(capsys, args)
    assert code == 0, result
    [model] = result["models"]
    assert model["pending"] is True and model["work"]["pending"] is True
    # The fetch itself, by model_weights' code with the options the role passes, then the plan again.
    sync_weights(
        {
            "dest": model["spec"]["paths"]["weights"],
            "source": "path",
            "path": str(source),
            "repo_id": model["spec"]["hf_weights_repo"],
            "disk_margin_gb": 0,
        },
        check_mode=False,
    )
    code, result = run(capsys, args)
    assert code == 0, result
    assert result["models"][0]["pending"] is False and result["work"][0]["pending"] is False
    assert result["work"][0]["complete"] is True


def test_a_new_revision_is_fetched_rather_than_aliased(tmp_path, capsys):
    old = tmp_path / "volumes" / f"volume_id_tt_transformers-{LLAMA}-v0.17.0"
    _weights(old / "weights" / LLAMA, manifest_revision="1" * 40)
    source = _weights(tmp_path / "nfs" / LLAMA)
    code, result = run(
        capsys,
        _args(tmp_path, [{"name": LLAMA, "revision": SHA, "path": str(source), "sources": ["preseeded", "path"]}]),
    )
    assert code == 0, result
    assert result["models"][0]["source"] == "path"


def test_each_model_is_resolved_once_from_one_catalog(tmp_path, capsys, monkeypatch):
    calls = {"load": 0, "resolve": []}
    real_load, real_resolve = ttis_source.load_catalog, ttis_derive.resolve_entry

    def load(**kwargs):
        calls["load"] += 1
        return real_load(**kwargs)

    def resolve(catalog, entry, device, **kwargs):
        calls["resolve"].append((entry["name"], device))
        return real_resolve(catalog, entry, device, **kwargs)

    monkeypatch.setattr(ttis_source, "load_catalog", load)
    monkeypatch.setattr(cp, "resolve_entry", resolve)
    source = _weights(tmp_path / "nfs" / LLAMA)
    models = [{"name": LLAMA, "path": str(source)}, {"name": "Qwen3-32B", "device": "p300x2", "path": str(source)}]
    code, result = run(capsys, _args(tmp_path, models, sources=["path"]))
    assert code == 0, result
    assert calls == {"load": 1, "resolve": [(LLAMA, "p300x2"), ("Qwen3-32B", "p300x2")]}
    assert [m["name"] for m in result["models"]] == [LLAMA, "Qwen3-32B"]


def test_weights_false_reports_specs_and_kernel_keys_only(tmp_path, capsys):
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA, "port": 8001}], weights=False))
    assert code == 0, result
    [model] = result["models"]
    assert set(model) == {"name", "entry", "spec", "kernel"}
    assert model["entry"]["port"] == 8001 and model["kernel"]["mesh"] == "P300x2"
    assert result["work"] == []


def test_the_module_fails_for_a_model_no_source_can_fill(tmp_path, capsys):
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA}], sources=["hf"]))
    assert code == 1
    assert result["msg"].startswith(f'qb2-1: no source in ["hf"] can fill {tmp_path}/volumes/volume_id_')


def test_the_module_fails_before_any_byte_when_the_disk_is_short(tmp_path, capsys):
    source = _copied(_weights(tmp_path / "nfs" / LLAMA))
    args = _args(tmp_path, [{"name": LLAMA, "path": str(source)}], sources=["path"], disk_margin_gb=1 << 30)
    code, result = run(capsys, args)
    assert code == 1
    assert result["msg"].startswith("qb2-1: not enough free space")


def test_bad_entries_name_the_entry(tmp_path, capsys):
    code, result = run(capsys, _args(tmp_path, [{"device": "n150"}]))
    assert code == 1 and "models[0] has no name" in result["msg"]
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA, "device": 150}]))
    assert code == 1 and result["msg"] == f"tt_models entry {LLAMA}: device must be a string, got 150"


def test_secrets_never_reach_the_result(tmp_path, capsys):
    code, result = run(capsys, _args(tmp_path, [{"name": LLAMA}], sources=["hf"], hf_token="hf_secret_value"))
    assert code == 1
    assert "hf_secret_value" not in json.dumps(result)


# --- extra repositories and specs from outside the catalog -------------------------------------


def test_an_extra_repository_is_planned_beside_the_weights_and_counted_on_the_disk(tmp_path, capsys):
    source = _copied(_weights(tmp_path / "nfs" / LLAMA))
    draft = _copied(_weights(tmp_path / "nfs" / "Draft-1B"))
    model = {
        "name": LLAMA,
        "revision": SHA,
        "path": str(source),
        "sources": ["path"],
        "extra_repos": [{"repo": "org/Draft-1B", "revision": "1" * 40, "path": str(draft)}],
    }
    code, result = run(capsys, _args(tmp_path, [model]))
    assert code == 0, result
    [record] = result["models"]
    [extra] = record["extras"]
    assert extra["model"] == f"{LLAMA}--Draft-1B" and extra["extra_of"] == LLAMA
    assert extra["dest"] == os.path.join(record["spec"]["paths"]["volume"], "weights", "Draft-1B")
    assert (extra["origin"], extra["repo_id"], extra["revision_arg"]) == ("path", "org/Draft-1B", "1" * 40)
    assert extra["bytes"] == sum(len(body) for body in FILES.values())
    assert result["work"] == [record["work"], extra]
    # Both land on one filesystem: the disk check sums them.
    assert record["work"]["fs_device"] == extra["fs_device"]
    # Free space as measured once (other tests write to the same filesystem meanwhile).
    work = [dict(item, fs_free=10**9) for item in result["work"]]
    margin = 10**9 - record["work"]["bytes_needed"] - extra["bytes_needed"] + 1
    [short] = cp.disk_shortfalls(work, margin)
    assert short["models"] == [LLAMA, f"{LLAMA}--Draft-1B"]
    assert not cp.disk_shortfalls(work[:1], margin)


def test_an_extra_repository_without_a_source_names_the_fix(tmp_path, capsys):
    source = _weights(tmp_path / "nfs" / LLAMA)
    model = {
        "name": LLAMA,
        "path": str(source),
        "sources": ["path"],
        "extra_repos": [{"repo": "org/Draft-1B", "revision": "1" * 40}],
    }
    code, result = run(capsys, _args(tmp_path, [model]))
    assert code == 1 and "extra repository org/Draft-1B has no source" in result["msg"]


def test_a_runtime_spec_plans_its_own_volume(tmp_path, capsys):
    source = _weights(tmp_path / "nfs" / "Qwen3.8-27B")
    spec = package_spec(tt_metal_commit="f" * 40, docker_image="registry.example/q:0.1.0")
    model = {"name": "Qwen/Qwen3.8-27B", "spec": spec, "path": str(source), "sources": ["path"], "profile": "tp2"}
    code, result = run(capsys, _args(tmp_path, [model], device="p150x2"))
    assert code == 0, result
    [record] = result["models"]
    assert record["volume"]["path"].endswith("/volume_id_qwen36-Qwen3.8-27B-v0.1.0")
    assert record["kernel"]["mesh"] == "P150x2-tp2" and record["kernel"]["tt_metal_commit"] == "f" * 40
    assert result["spec_source"] == "spec_file"


# --- one repository and revision per directory (issue 29 case 7) --------------------------------


def _drafted(tmp_path, instance, *repos, revision=SHA):
    """An entry of LLAMA whose extra repositories come from path copies (missing ones: a listing would fail)."""
    return {
        "name": LLAMA,
        "instance": instance,
        "revision": revision,
        "path": str(tmp_path / "nfs" / LLAMA),
        "sources": ["path"],
        "extra_repos": [
            {"repo": repo, "revision": "1" * 40, "path": str(tmp_path / "nfs" / repo.replace("/", "--"))}
            for repo in repos
        ],
    }


@pytest.mark.parametrize(
    ("models", "named"),
    [
        # Two repositories with one last component beside one model.
        (
            lambda t: [_drafted(t, "a", "org-a/Draft-1B", "org-b/Draft-1B")],
            [
                f"org-a/Draft-1B@{'1' * 40} (extra_repos[0] of tt_models entry {LLAMA}, instance a) and org-b/",
                "(extra_repos[1] of",
                "keep one of the two",
            ],
        ),
        # A draft named like its model: it would land in the model's own weights directory.
        (
            lambda t: [_drafted(t, "a", f"evil/{LLAMA}")],
            [
                f"(the weights of tt_models entry {LLAMA}, instance a) and evil/{LLAMA}@",
                "cannot be named like the model",
            ],
        ),
        # Two entries of one model share its volume: their drafts meet there.
        (
            lambda t: [_drafted(t, "qwen-a", "org-a/Draft-1B"), _drafted(t, "qwen-b", "org-b/Draft-1B")],
            ["org-a/Draft-1B@", ", instance qwen-a) and org-b/Draft-1B@", ", instance qwen-b) would", "keep one of"],
        ),
        # ... and so do their weights, pinned at other revisions.
        (
            lambda t: [_drafted(t, "qwen-a"), _drafted(t, "qwen-b", revision="2" * 40)],
            [f"@{SHA} (the weights of", "@" + "2" * 40, f"pin one revision of meta-llama/{LLAMA} in every entry"],
        ),
    ],
    ids=["same-last-component", "draft-named-like-model", "two-entries-two-drafts", "two-revisions"],
)
def test_two_repositories_in_one_directory_are_refused_before_any_listing(tmp_path, capsys, models, named):
    # The path copies do not exist: listing any of them would fail with another message.
    code, result = run(capsys, _args(tmp_path, models(tmp_path)))
    assert code == 1, result
    message = result["msg"]
    assert message.startswith("qb2-1: ") and "would share one directory" in message, message
    assert "Nothing was fetched" in message
    for text in named:
        assert text in message, (text, message)


def test_one_repository_named_by_two_entries_is_planned_once(tmp_path, capsys):
    _copied(_weights(tmp_path / "nfs" / LLAMA))
    _copied(_weights(tmp_path / "nfs" / "org--Draft-1B"))
    models = [_drafted(tmp_path, "qwen-a", "org/Draft-1B"), _drafted(tmp_path, "qwen-b", "org/Draft-1B")]
    code, result = run(capsys, _args(tmp_path, models))
    assert code == 0, result
    assert [item["model"] for item in result["work"]] == [LLAMA, f"{LLAMA}--Draft-1B"]


def test_directory_claims_name_the_entry_and_each_repository():
    spec = {"paths": {"volume": "/v/vol", "weights": "/v/vol/weights/M"}, "hf_weights_repo": "org/M"}
    entry = {"name": "org/M", "profile": "tp2", "extra_repos": [{"repo": "x/D", "revision": "1" * 40}]}
    claims = cp.directory_claims(entry, spec)
    assert claims == [
        {
            "dest": "/v/vol/weights/M",
            "repo": "org/M",
            "revision": "",
            "extra": False,
            "what": "the weights of tt_models entry org/M, profile tp2",
        },
        {
            "dest": "/v/vol/weights/D",
            "repo": "x/D",
            "revision": "1" * 40,
            "extra": True,
            "what": "extra_repos[0] of tt_models entry org/M, profile tp2",
        },
    ]
    # The same pair twice is one directory's one content; another revision is not.
    cp.check_directories("h", claims + claims)
    with pytest.raises(cp.PlanError, match=r"^h: x/D@1{40} \(extra_repos\[0\] .*\) and x/D@2{40} \(extra_rep"):
        cp.check_directories("h", [*claims, dict(claims[1], revision="2" * 40)])
