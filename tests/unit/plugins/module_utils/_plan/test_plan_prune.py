# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The pure decisions of disk_prune (_plan/prune.py): every reason, every keep rule, remove and kinds."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import (
    KINDS,
    REPORT_ONLY,
    PruneError,
    check_options,
    plan_images,
    plan_kernel_caches,
    plan_releases,
    plan_spool,
    plan_staging,
    plan_volumes,
)

ROOT = "/opt/tt-cache"
V14 = "volume_id_tt_transformers-Qwen3-32B-v0.14.0"
V17 = "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
V19 = "volume_id_tt_transformers-Qwen3-32B-v0.19.0"
QB2 = "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
ASIDE = V17 + ".ttfleet-aside-20261130T041500Z"
ALL = tuple(KINDS)


def vol(name, target=None, **extra):
    return {"name": name, "is_link": target is not None, "target": target, "problem": None, "in_use": None, **extra}


def decide(entries, needed=(), remove=(), kinds=ALL):
    return {found["name"]: found for found in plan_volumes(ROOT, entries, needed, remove, kinds)}


def test_volume_not_expected_by_a_kept_release_is_removed_with_its_model_and_version():
    found = decide([vol(V14), vol(V19)], needed=[V19])
    assert found[V14]["action"] == "remove"
    assert found[V14]["reason"] == "no kept release expects it (model Qwen3-32B, version 0.14.0)"
    assert (found[V19]["action"], found[V19]["note"]) == ("keep", "needed by a kept release")


def test_volume_moved_aside_by_volume_alias_is_removed_with_its_date():
    found = decide([vol(ASIDE)])
    assert found[ASIDE]["action"] == "remove"
    assert found[ASIDE]["reason"] == "moved aside by volume_alias on 20261130T041500Z"


def test_unneeded_alias_is_removed_and_no_longer_protects_its_target():
    found = decide([vol(V17, target=V14), vol(V14), vol(V19)], needed=[V19])
    assert found[V17]["reason"] == f"alias to {V14}, not needed"
    assert found[V17]["action"] == found[V14]["action"] == "remove"


def test_needed_alias_keeps_its_target_even_when_named_in_remove():
    found = decide([vol(V19, target=V17), vol(V17, target=V14), vol(V14)], needed=[V19], remove=[V14])
    assert [found[name]["action"] for name in (V19, V17, V14)] == ["keep"] * 3
    assert found[V14]["note"].startswith(f"the needed alias {V19} points to it")
    assert "named in remove, still kept" in found[V14]["note"]


def test_alias_that_stays_keeps_its_target_unless_the_target_is_named():
    mounted = "container tt-q mounts /opt/tt-cache/x"
    found = decide([vol(V17, target=V14, in_use=mounted), vol(V14)])
    assert found[V17]["action"] == "keep"
    assert found[V14]["action"] == "keep" and f"the alias {V17} points to it" in found[V14]["note"]
    found = decide([vol(V17, target=V14, in_use=mounted), vol(V14)], remove=[V14])
    assert found[V14]["action"] == "remove"
    # A chain: the alias that stays keeps every name it leads to.
    found = decide([vol(V19, target=V17, in_use=mounted), vol(V17, target=V14), vol(V14)])
    assert [found[name]["action"] for name in (V19, V17, V14)] == ["keep"] * 3


def test_report_only_counts_an_alias_and_its_target_as_a_full_run_would_remove_them():
    found = decide([vol(V17, target=V14), vol(V14)], kinds=[])
    assert [(found[n]["action"], found[n]["note"]) for n in (V17, V14)] == [("skip", REPORT_ONLY)] * 2


def test_alias_with_an_absolute_target_in_the_root_and_one_outside_it():
    found = decide([vol(V17, target=f"{ROOT}/{V14}"), vol(V14), vol(V19, target="/home/tt/data/x")], needed=[V17])
    assert found[V14]["action"] == "keep"
    assert found[V19]["reason"] == "alias to /home/tt/data/x, not needed"


def test_factory_volume_is_kept_unless_named_in_remove():
    found = decide([vol(QB2)])
    assert found[QB2]["action"] == "keep" and "not a version" in found[QB2]["note"]
    found = decide([vol(QB2)], remove=[QB2])
    assert found[QB2]["action"] == "remove"


def test_volume_in_use_is_kept_even_when_named():
    found = decide([vol(V14, in_use="container tt-qwen mounts /opt/tt-cache/x")], remove=[V14])
    assert found[V14]["action"] == "keep"
    assert found[V14]["note"] == "in use: container tt-qwen mounts /opt/tt-cache/x (named in remove, still kept)"


def test_volume_without_a_version_is_kept_unless_named():
    name = "volume_id_tt_transformers-Qwen3-32B"
    assert decide([vol(name)])[name]["action"] == "keep"
    assert decide([vol(name)], remove=[name])[name]["action"] == "remove"


def test_unsafe_volume_is_skipped_with_the_problem_naming_it():
    problem = f"{ROOT}/{V14} is owned by uid 1000, not root; it is left alone (remove it by hand)"
    found = decide([vol(V14, problem=problem)])
    assert (found[V14]["action"], found[V14]["note"]) == ("skip", problem)


@pytest.mark.parametrize(("kinds", "note"), [([], REPORT_ONLY), (["images"], "kind volumes is not in kinds")])
def test_kinds_turn_remove_into_skip(kinds, note):
    found = decide([vol(V14)], kinds=kinds)
    assert (found[V14]["action"], found[V14]["note"]) == ("skip", note)
    assert found[V14]["reason"]


def test_kernel_caches_moved_aside_are_reclaimable():
    entries = [
        {"name": f"{V17}/tt_metal_cache/cache_Qwen3-32B/P300x2.ttfleet-aside-20261201T000000Z", "path": "/p"},
        {"name": f"{V17}/tt_metal_cache/cache_Qwen3-32B/P150.ttfleet-aside-x", "path": "/q", "problem": "/q is a fifo"},
    ]
    first, second = plan_kernel_caches(entries, ALL)
    assert (first["action"], first["reason"]) == ("remove", "kernel cache moved aside on 20261201T000000Z")
    assert (second["action"], second["note"]) == ("skip", "/q is a fifo")


def test_staging_of_a_needed_volume_is_resumable_work():
    stale, resumable = plan_staging([{"name": V14, "path": "/a"}, {"name": V19, "path": "/b"}], [V19], ALL)
    assert (stale["action"], stale["reason"]) == ("remove", f"stale partial download: no kept release expects {V14}")
    assert (resumable["action"], resumable["note"]) == ("keep", "the resumable download of a needed volume")


KEY = {"model_name": "Qwen3-32B", "mesh": "P300x2", "impl_id": "tt_transformers", "tt_metal_commit": "8c48a10"}


def test_spool_archives_of_needed_keys_stay_and_a_live_spool_is_skipped():
    old = {**KEY, "tt_metal_commit": "0ld", "vllm_commit": "none"}
    needed = {**KEY, "vllm_commit": "f52987a"}
    entries = [
        {"name": "s:new", "path": "/s/new", "key": needed},
        {"name": "s:old", "path": "/s/old", "key": old},
        {"name": "t:old", "path": "/t/old", "key": old, "live": "a live peer server (pid 7) serves the spool /t"},
    ]
    kept, gone, live = plan_spool(entries, [{**KEY, "vllm_commit": "f52987a"}], ALL)
    assert (kept["action"], kept["note"]) == ("keep", "a kept release needs these kernels")
    assert gone["action"] == "remove" and "tt_metal_commit 0ld, vllm_commit none" in gone["reason"]
    assert (live["action"], live["note"]) == ("skip", "a live peer server (pid 7) serves the spool /t")


def _releases(tags, current, previous):
    return {
        "markers": [{"path": f"/r/releases/{tag}/.ttfleet-release.json", "mtime": n} for n, tag in enumerate(tags)],
        "current": current,
        "previous": previous,
        "dirs": {tag: [f"releases/{tag}", f"venvs/{tag}"] for tag in tags},
    }


def test_releases_beyond_current_previous_and_the_newest_keep_go_with_their_venvs():
    found = _releases(["v0.14.0", "v0.15.0", "v0.16.0", "v0.17.0", "v0.18.0"], "v0.18.0", "v0.14.0")
    items = {i["name"]: i for i in plan_releases("/r", found, 2, [], ALL)}
    gone = sorted(name for name, i in items.items() if i["action"] == "remove")
    assert gone == ["releases/v0.15.0", "releases/v0.16.0", "venvs/v0.15.0", "venvs/v0.16.0"]
    assert items["releases/v0.14.0"]["note"] == "the previous release"
    assert items["releases/v0.17.0"]["note"] == "one of the newest 2 releases"
    assert "beyond current (v0.18.0), previous (v0.14.0) and the newest 2" in items["venvs/v0.15.0"]["reason"]


def test_release_named_in_remove_goes_unless_current_or_previous():
    found = _releases(["v0.16.0", "v0.17.0", "v0.18.0"], "v0.18.0", "v0.16.0")
    items = {i["name"]: i for i in plan_releases("/r", found, 3, ["v0.17.0", "v0.18.0"], ALL)}
    assert items["releases/v0.17.0"]["action"] == "remove"
    assert items["releases/v0.18.0"]["action"] == "keep" and "still kept" in items["releases/v0.18.0"]["note"]


def test_releases_without_a_current_link_or_a_marker_are_kept():
    found = _releases(["v0.14.0"], "", "")
    assert [i["action"] for i in plan_releases("/r", found, 1, [], ALL)] == ["keep", "keep"]
    found = _releases(["v0.17.0"], "v0.17.0", "")
    found["dirs"]["v0.9.0"] = ["releases/v0.9.0"]
    items = {i["name"]: i for i in plan_releases("/r", found, 1, [], ALL)}
    assert items["releases/v0.9.0"]["action"] == "keep" and "no release marker" in items["releases/v0.9.0"]["note"]


REPO = "ghcr.io/tenstorrent/tt-inference-server/vllm"


def test_images_needed_used_or_of_other_repositories_stay_and_bytes_count_when_every_tag_goes():
    images = [
        {"id": "a", "tags": [f"{REPO}:0.17"], "size": 100, "used_by": []},
        {"id": "b", "tags": [f"{REPO}:0.14", f"{REPO}:old"], "size": 200, "used_by": []},
        {"id": "c", "tags": [f"{REPO}:0.15"], "size": 300, "used_by": ["tt-qwen"]},
        {"id": "d", "tags": [f"{REPO}:0.16", "other/x:1"], "size": 400, "used_by": []},
        {"id": "e", "tags": ["debian:12"], "size": 500, "used_by": []},
    ]
    items = plan_images(images, [REPO], [f"{REPO}:0.17"], [], ALL)
    by_ref = {i["ref"]: i for i in items}
    assert "debian:12" not in by_ref
    assert by_ref[f"{REPO}:0.17"]["action"] == "keep"
    assert by_ref[f"{REPO}:0.15"]["note"] == "used by container tt-qwen"
    assert [by_ref[f"{REPO}:{t}"]["action"] for t in ("0.14", "old", "0.16")] == ["remove"] * 3
    assert sum(by_ref[f"{REPO}:{t}"]["bytes"] for t in ("0.14", "old")) == 200
    assert by_ref[f"{REPO}:0.16"]["bytes"] == 0  # another repository's tag keeps the image


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"kinds": ["volumes", "disks"]}, "kinds lists disks"),
        ({"needed_volumes": ["a/b"]}, "needed_volumes holds 'a/b'"),
        ({"remove": ["../victim"]}, "remove holds '../victim'"),
        ({"remove": ["/opt/tt-cache/x"]}, "remove holds '/opt/tt-cache/x'"),
        ({"time_limit": 0}, "time_limit is 0"),
        ({"release_keep": 0}, "release_keep is 0"),
        ({"needed_kernel_keys": [{"model_name": "x"}]}, "needed_kernel_keys holds"),
    ],
)
def test_bad_input_names_the_option(change, named):
    options = {"kinds": list(ALL), "time_limit": 900, "release_keep": 2, **change}
    with pytest.raises(PruneError, match=named):
        check_options(options)


def test_an_image_reference_may_be_named_in_remove():
    check_options({"kinds": [], "time_limit": 1, "release_keep": 1, "remove": [f"{REPO}:0.14", "v0.17.0"]})
    found = plan_images([{"id": "b", "tags": [f"{REPO}:0.14"], "size": 1}], [REPO], [], [f"{REPO}:0.14"], ALL)
    assert (found[0]["action"], found[0]["reason"]) == ("remove", "named in remove")
