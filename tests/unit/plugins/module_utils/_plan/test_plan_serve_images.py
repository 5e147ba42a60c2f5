"""The serve plan of a host (plugins/module_utils/_plan/serve.py): the image lists of roles/serve/tasks/images.yml,
the missing volumes of main.yml and the restart of present.yml."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import serve

UPSTREAM = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.0.4-abc"
MIRRORED = "registry.site.example/tenstorrent/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.0.4-abc"
MEDIA = "ghcr.io/tenstorrent/tt-media-inference-server:0.2.0"


def command(instance, image, origin=None, **entry):
    return {
        "changed": False,
        "image": image,
        "image_origin": origin or image,
        "argv": ["docker", "run", "--name", f"x-{instance}", image, "--model", "m"],
        "volume": f"/opt/cache/volume_id_{instance}",
        "__serve_instance": {"instance": instance, **entry},
    }


def test_image_list_each_image_once_with_the_first_instances_archive():
    results = [
        command("a", MIRRORED, UPSTREAM, image_archive="/srv/a.tar", image_archive_sha256="1" * 64),
        # Same image, another archive: the first instance's stays.
        command("b", MIRRORED, UPSTREAM, image_archive="/srv/b.tar"),
        command("c", MEDIA, image_archive_s3_key="images/media.tar.zst"),
        # A skipped loop item adds nothing.
        {"skipped": True, "__serve_instance": {"instance": "d"}},
    ]
    assert serve.image_list(results) == [
        {"image": MIRRORED, "origin": UPSTREAM, "archive": "/srv/a.tar", "archive_sha256": "1" * 64},
        {"image": MEDIA, "origin": MEDIA, "archive_s3_key": "images/media.tar.zst"},
    ]
    assert serve.image_list(None) == []


def test_mirror_list_only_mirrored_names_once_across_hosts():
    pulls = [
        [{"image": MIRRORED, "origin": UPSTREAM, "source": "registry"}],
        None,
        # Pulled under its own name: the registry's, not the site's to copy.
        [{"image": MEDIA, "origin": MEDIA, "source": "registry"}, {"image": MIRRORED, "origin": UPSTREAM}],
        [],
    ]
    assert serve.mirror_list(pulls) == [{"source": UPSTREAM, "target": MIRRORED}]


def test_image_fetch_list_takes_sizes_from_the_site_copy_unless_skipped():
    images = [{"image": MIRRORED, "origin": UPSTREAM}, {"image": MEDIA, "origin": MEDIA}]
    mirrored = {"changed": True, "images": [{"source": UPSTREAM, "target": MIRRORED, "image_bytes": 123}]}
    assert serve.image_fetch_list(images, mirrored) == [
        {"image": MIRRORED, "origin": UPSTREAM, "size": 123},
        {"image": MEDIA, "origin": MEDIA},
    ]
    assert serve.image_fetch_list(images, {"skipped": True, "images": mirrored["images"]}) == images
    assert serve.image_fetch_list(images, None) == images
    # The input is never changed in place.
    assert "size" not in images[0]


def test_image_records_prefer_the_fetch_and_ignore_skipped_tasks():
    probe = {
        "images": [{"image": MEDIA, "source": "present", "id": "sha256:1"}, {"image": MIRRORED, "source": "registry"}]
    }
    fetched = {
        "images": [{"image": MIRRORED, "source": "registry", "id": "sha256:2", "pinned": f"{MIRRORED}@sha256:d"}]
    }
    records = serve.image_records(probe, fetched)
    assert records[MEDIA]["id"] == "sha256:1"
    assert records[MIRRORED]["id"] == "sha256:2"
    assert serve.image_records(probe, {"skipped": True, "images": fetched["images"]})[MIRRORED] == probe["images"][1]
    assert serve.image_records({"skipped": True}, None) == {}


@pytest.mark.parametrize(
    ("record", "pin", "runs"),
    [
        ({"pinned": f"{MIRRORED}@sha256:d"}, True, f"{MIRRORED}@sha256:d"),
        ({"pinned": f"{MIRRORED}@sha256:d"}, False, MIRRORED),
        # No digest from the registry (an image loaded from an archive): the name as computed.
        ({"pinned": None}, True, MIRRORED),
        ({"pinned": ""}, True, MIRRORED),
        ({}, True, MIRRORED),
        (None, True, MIRRORED),
    ],
)
def test_run_argv_replaces_only_the_image_argument(record, pin, runs):
    cmd = command("a", MIRRORED, UPSTREAM)
    cmd["argv"].append(f"--label={MIRRORED}")
    argv = serve.run_argv(cmd, record, pin)
    assert argv == ["docker", "run", "--name", "x-a", runs, "--model", "m", f"--label={MIRRORED}"]


def stat(cmd, exists):
    return {"item": cmd, "stat": {"exists": exists}}


def test_volumes_missing_names_instance_and_path():
    a, b = command("a", MEDIA), command("b", MEDIA)
    assert serve.volumes_missing([stat(a, True), stat(b, False)], {}, False) == [f"b ({b['volume']})"]
    assert serve.volumes_missing([{"item": a, "stat": {}}], None, False) == [f"a ({a['volume']})"]
    assert serve.volumes_missing(None, None, True) == []


def test_volumes_missing_reads_container_command_results():
    """The role passes container_command's results, which say whether the volume exists (issue 34: no stat a volume)."""
    a, b, named = command("a", MEDIA), command("b", MEDIA), command("n", MEDIA)
    results = [dict(a, __serve_instance={"instance": "a"}, volume_exists=True),
               dict(b, __serve_instance={"instance": "b"}, volume_exists=False),
               dict(named, __serve_instance={"instance": "n"}, volume_exists=None)]  # fmt: skip
    assert serve.volumes_missing(results, {}, False) == [f"b ({b['volume']})"]
    plan = {"models": [{"name": "m", "volume": {"path": b["volume"]}}]}
    assert serve.volumes_missing(results, plan, True) == []


def test_volumes_model_cache_plans_count_in_check_mode_only():
    a = command("a", MEDIA)
    plan = {"models": [{"name": "m", "volume": {"path": a["volume"]}}]}
    assert serve.volumes_missing([stat(a, False)], plan, True) == []
    assert serve.volumes_missing([stat(a, False)], plan, False) == [f"a ({a['volume']})"]


UNCHANGED = {"changed": False}
CHANGED = {"changed": True}
SKIPPED = {"changed": False, "skipped": True}
LOOP_CHANGED = {"results": [{"changed": False}, {"changed": True}], "msg": "All items completed"}
LOOP_UNCHANGED = {"results": [{"changed": False}], "msg": "All items completed"}


def causes(**changed):
    base = {
        "configuration": UNCHANGED,
        "secrets": UNCHANGED,
        "units": LOOP_UNCHANGED,
        "wrapper": UNCHANGED,
        "model spec": SKIPPED,
    }
    return {**base, **changed}


def test_unit_started_when_nothing_changed():
    assert serve.unit_plan(causes(), False) == {"state": "started", "reasons": [], "asked": True}
    assert serve.unit_plan(causes(), True) == {"state": "started", "reasons": [], "asked": True}


@pytest.mark.parametrize("cause", ["configuration", "secrets", "wrapper", "model spec"])
def test_unit_restarts_for_each_cause_and_names_it(cause):
    plan = serve.unit_plan(causes(**{cause: CHANGED}), False)
    assert plan["state"] == "restarted"
    assert plan["reasons"] == [cause]


def test_unit_restarts_for_changed_template_units_a_loop_result():
    plan = serve.unit_plan(causes(units=LOOP_CHANGED, secrets=CHANGED), False)
    assert plan == {"state": "restarted", "reasons": ["secrets", "units"], "asked": True}


@pytest.mark.parametrize(
    ("changed", "asked"),
    [({"units": LOOP_CHANGED}, False), ({"configuration": CHANGED}, False), ({"secrets": CHANGED}, True)],
)
def test_check_mode_does_not_ask_about_a_unit_not_installed_yet(changed, asked):
    assert serve.unit_plan(causes(**changed), True)["asked"] is asked
    assert serve.unit_plan(causes(**changed), False)["asked"] is True


def test_changed_is_ansibles_test():
    assert serve.changed({"changed": True, "results": []}) is True
    assert serve.changed({"results": [{"changed": True}]}) is True
    assert serve.changed({"results": []}) is False
    assert serve.changed({}) is False
    assert serve.changed(None) is False
