# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What a host still needs before disk_prune (module_utils/_plan/prune_needs.py and the filters of
plugins/filter/reclaim.py), on the plans of real spec exports of two releases (the model_cache_plan of weights: false).
"""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleFilterError
from conftest import FIXTURES

from ansible_collections.ttfleet.inference.plugins.filter import reclaim as prune_filters
from ansible_collections.ttfleet.inference.plugins.module_utils._plan import cache as cp
from ansible_collections.ttfleet.inference.plugins.module_utils._plan import prune_needs as pp
from ansible_collections.ttfleet.inference.plugins.modules import model_cache_plan as module

LLAMA = "Llama-3.1-8B-Instruct"
QWEN = "Qwen3-32B"
MODELS = [{"name": LLAMA}, {"name": QWEN}, {"name": "Gone-Model", "state": "absent"}]
PRESENT = MODELS[:2]


def _plan(release, models=None, role="current"):
    """The registered loop result of model_cache_plan (weights: false) on the spec export of ``release``."""
    models = PRESENT if models is None else models
    defaults = {name: option.get("default") for name, option in module.ARGUMENT_SPEC.items()}
    params = {
        **defaults,
        "models": models,
        "device": "p300x2",
        "volume_root": "/var/lib/tt-cache",
        "spec_file": os.path.join(FIXTURES, "specs", f"release_model_spec-{release}.json.gz"),
        "weights": False,
        "host": "qb2-1",
        "disk_margin_gb": 0,
    }
    result = cp.plan_cache(params, print)
    return {**result, "item": {"role": role, "release": release, "dir": f"/opt/tt-inference-server/releases/{release}"}}


def _failed(release, role="previous", msg="cannot read /opt/tt-inference-server/releases/x: No such file"):
    item = {"role": role, "release": release, "dir": f"/opt/tt-inference-server/releases/{release}"}
    return {"failed": True, "msg": msg, "item": item}


def test_kept_releases_are_current_then_previous_each_once():
    status = {"release": "v0.20.0", "previous_release": "v0.18.0"}
    assert pp.kept_releases(status, "/opt/tt") == [
        {"role": "current", "release": "v0.20.0", "dir": "/opt/tt/releases/v0.20.0"},
        {"role": "previous", "release": "v0.18.0", "dir": "/opt/tt/releases/v0.18.0"},
    ]
    assert pp.kept_releases({"release": "v0.20.0", "previous_release": "v0.20.0"}, "/opt/tt") == [
        {"role": "current", "release": "v0.20.0", "dir": "/opt/tt/releases/v0.20.0"}
    ]
    assert pp.kept_releases({"release": None, "previous_release": None}, "/opt/tt") == []


@pytest.mark.parametrize(
    ("status", "root", "message"),
    [
        ({"release": "../../etc"}, "/opt/tt", "current release as '../../etc', which is not a release tag"),
        ({"release": "v1", "previous_release": ".."}, "/opt/tt", "previous release as '..'"),
        ({"release": "v1"}, "opt/tt", "must be an absolute path"),
    ],
)
def test_kept_releases_refuse_what_is_no_tag_or_root(status, root, message):
    with pytest.raises(pp.PruneError, match=message):
        pp.kept_releases(status, root)


def test_needs_are_the_union_of_both_releases_volumes_kernel_keys_and_images():
    current, previous = _plan("v0.20.0"), _plan("v0.18.0", role="previous")
    needs = pp.host_needs([current, previous], MODELS, [], {})
    names = {r["kernel"]["volume_name"] for plan in (current, previous) for r in plan["models"]}
    assert needs["needed_volumes"] == sorted(names)
    # Each release names its own volumes (the version is in the name): the union keeps both.
    assert len(names) > len({r["kernel"]["volume_name"] for r in current["models"]})
    assert all(set(key) == set(pp.KERNEL_KEY_FIELDS) for key in needs["needed_kernel_keys"])
    commits = {(k["model_name"], k["tt_metal_commit"]) for k in needs["needed_kernel_keys"]}
    assert commits == {
        (r["kernel"]["model_name"], r["kernel"]["tt_metal_commit"]) for p in (current, previous) for r in p["models"]
    }
    images = {r["spec"]["docker_image"] for p in (current, previous) for r in p["models"]}
    assert needs["needed_images"] == sorted(images)
    assert needs["image_repositories"] == sorted({image.rsplit(":", 1)[0] for image in images})
    assert needs["notes"] == [] and needs["releases"] == ["v0.20.0", "v0.18.0"]


def test_images_are_mapped_by_the_registry_mirrors_as_serve_maps_them():
    current = _plan("v0.20.0")
    origin = current["models"][0]["spec"]["docker_image"]
    prefix = origin.split("/", 1)[0]
    needs = pp.host_needs([current], PRESENT, [], {prefix: "registry.site.example:5000"})
    assert f"registry.site.example:5000/{origin.split('/', 1)[1]}" in needs["needed_images"]
    assert not [image for image in needs["needed_images"] if image.startswith(prefix + "/")]
    assert all(repo.startswith("registry.site.example:5000/") for repo in needs["image_repositories"])


def test_an_entry_image_wins_over_the_spec_image():
    current = _plan("v0.20.0", models=[{"name": LLAMA, "image": "ghcr.io/tenstorrent/own:1.0.0-abc"}])
    needs = pp.host_needs([current], [{"name": LLAMA}], [], {})
    assert needs["needed_images"] == ["ghcr.io/tenstorrent/own:1.0.0-abc"]


def test_a_previous_release_that_cannot_be_read_keeps_every_volume_of_the_models():
    current = _plan("v0.20.0")
    volumes = [
        "volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.0.1",
        "volume_id_tt_transformers-Qwen3-32B-v0.9.0",
        "volume_id_tt_transformers-Other-Model-v0.9.0",
        "volume_id_tt_transformers-Gone-Model-v0.9.0",
        "lost+found",
    ]
    needs = pp.host_needs([current, _failed("v0.18.0")], MODELS, volumes, {})
    assert volumes[0] in needs["needed_volumes"] and volumes[1] in needs["needed_volumes"]
    # Not the host's models: another model, one marked absent, something that is no volume.
    assert not set(volumes[2:]) & set(needs["needed_volumes"])
    assert needs["notes"] == [
        "the previous release v0.18.0 at /opt/tt-inference-server/releases/v0.18.0 cannot be read (cannot read "
        "/opt/tt-inference-server/releases/x: No such file): every volume of the host's models is kept"
    ]
    assert needs["releases"] == ["v0.20.0"]
    # Without the failed release only what the current one names is kept.
    assert volumes[0] not in pp.host_needs([current], MODELS, volumes, {})["needed_volumes"]


def test_a_host_with_models_and_no_release_keeps_every_volume_of_them():
    needs = pp.host_needs([], PRESENT, ["volume_id_tt_transformers-Qwen3-32B-v0.9.0", "volume_id_x-Other-v1.0.0"], {})
    assert needs["needed_volumes"] == ["volume_id_tt_transformers-Qwen3-32B-v0.9.0"]
    assert needs["notes"][0].startswith("no tt-inference-server release is linked")
    # No models: nothing is needed and nothing is said.
    assert pp.host_needs([], [], ["volume_id_x-Other-v1.0.0"], {})["needed_volumes"] == []


def test_report_line_names_bytes_kinds_what_stays_and_what_is_pending():
    result = {
        "items": [
            {"kind": "volumes", "action": "remove", "bytes": 10, "reason": "no kept release expects it"},
            {"kind": "volumes", "action": "keep", "bytes": 0, "reason": "", "note": "needed by a kept release"},
            {
                "kind": "volumes",
                "action": "keep",
                "bytes": 0,
                "reason": "no kept release expects it",
                "note": "factory",
            },
            {"kind": "images", "action": "remove", "bytes": 3, "reason": "no kept release runs it"},
        ],
        "reclaimable_bytes": 13,
        "reclaimed_bytes": 13,
        "pending": ["/v/.ttfleet-prune/x"],
    }
    assert pp.report_line("h", result, True) == (
        "h: prune would reclaim 13 bytes (13 B) (1 images, 1 volumes); 1 unneeded item(s) stay by default or in "
        "use (name them in prune_remove, or add their kind to prune_kinds; --check --diff says why); 1 left for the "
        "next run (time limit)."
    )
    assert pp.report_line("h", {**result, "items": result["items"][1:2], "pending": []}, False) == (
        "h: reclaimed 13 bytes (13 B) (nothing)."
    )


def test_pressure_text_names_the_reclaimable_bytes_and_the_command():
    # disk_prune with kinds: [] removes nothing and counts what a run with every kind would free.
    result = {"reclaimable_bytes": 4 << 30, "msg": "2 items reclaimable, 4.0 GiB (images 1.0 GiB, volumes 3.0 GiB)"}
    assert pp.pressure_text("qb2-1", result, ["/inv/hosts.yml"]) == (
        "Prune would reclaim 4294967296 bytes (4.0 GiB) on qb2-1 (2 items reclaimable, 4.0 GiB (images 1.0 GiB, "
        "volumes 3.0 GiB); factory and aliased volumes stay unless named): ansible-playbook -i /inv/hosts.yml "
        "ttfleet.inference.prune --limit qb2-1 (add --check --diff to see each item first)."
    )
    assert pp.pressure_text("h", {"reclaimable_bytes": 0, "msg": "0 items"}, None).startswith(
        "Prune would reclaim nothing on h"
    )
    assert pp.pressure_text("h", {"failed": True, "msg": "no docker\nmore"}, []) == (
        "What prune would reclaim on h is unknown (no docker); see with: ansible-playbook -i <inventory> "
        "ttfleet.inference.prune --limit h --check --diff"
    )
    assert "unknown (not computed)" in pp.pressure_text("h", None, "inv")


def test_the_disk_check_of_the_cache_plan_says_what_the_roles_look_for():
    # roles/model_cache/tasks/main.yml adds the prune line when the plan's message has this text.
    short = [{"path": "/v", "models": ["A"], "needed": 2, "free": 1}]
    assert "not enough free space in " in cp.shortfall_text("h", short, 0)


def test_the_filters_refuse_malformed_input_naming_themselves():
    filters = prune_filters.FilterModule().filters()
    assert set(filters) == {"prune_releases", "prune_needs", "prune_report", "prune_pressure"}
    for name in filters:
        assert os.path.isfile(os.path.join(os.path.dirname(prune_filters.__file__), f"{name}.yml"))
    with pytest.raises(AnsibleFilterError, match=r"^prune_needs: the input"):
        filters["prune_needs"]("x", [])
    with pytest.raises(AnsibleFilterError, match=r"^prune_needs: volume_names must be a list of names"):
        filters["prune_needs"]([], [], "abc")
    with pytest.raises(AnsibleFilterError, match=r"^prune_releases: fleet_status gave the current release as .a/b."):
        filters["prune_releases"]({"release": "a/b"}, "/opt")
    with pytest.raises(AnsibleFilterError, match=r"^prune_report: check_mode must be true or false"):
        filters["prune_report"]({}, "h", "maybe")
    with pytest.raises(AnsibleFilterError, match=r"^prune_pressure: the input must be"):
        filters["prune_pressure"]("x", "h")
    assert filters["prune_needs"]([_plan("v0.20.0")], PRESENT, None, None)["releases"] == ["v0.20.0"]
