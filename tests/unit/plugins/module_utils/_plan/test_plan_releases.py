"""Which tt-inference-server releases a host keeps, prunes and links as previous (module_utils/_plan/releases.py),
the decision of roles/inference_server/tasks/links.yml for its main entry point (installs and prunes) and its switch
entry point (the rollback: moves the links, prunes nothing)."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.releases import (
    ReleasesError,
    installed,
    link_name,
    plan_links,
)

ROOT = "/opt/ttfleet/tt-inference-server/releases"


def markers(*tags_by_age):
    """find results for markers installed in the order given, listed in another order (find gives no order)."""
    files = [
        {"path": f"{ROOT}/{tag}/.ttfleet-release.json", "mtime": 1000.0 + age} for age, tag in enumerate(tags_by_age)
    ]
    return list(reversed(files))


def link(target):
    return {"item": "current", "stat": {"exists": True, "islnk": True, "lnk_target": f"releases/{target}"}}


NO_LINK = {"item": "previous", "stat": {"exists": False}}


def test_installed_orders_by_install_time_and_skips_foreign_directories():
    found = [
        *markers("v0.9.0", "v0.10.0", "v0.2.0"),
        {"path": f"{ROOT}/latest/.ttfleet-release.json", "mtime": 1.0},
        {"path": f"{ROOT}/v1.0.0-rc1/.ttfleet-release.json", "mtime": 2.0},
        {"path": f"{ROOT}/v1.0/.ttfleet-release.json", "mtime": 3.0},
    ]
    # Install order, not version order: v0.2.0 was installed last (a downgrade).
    assert installed(found) == ["v0.9.0", "v0.10.0", "v0.2.0"]
    assert installed(None) == []


@pytest.mark.parametrize(
    ("result", "name"),
    [
        (link("v0.18.0"), "v0.18.0"),
        ({"stat": {"exists": True, "islnk": True, "lnk_target": "/abs/releases/v0.18.0"}}, "v0.18.0"),
        # A real directory where the link should be, a missing link, a skipped stat: no release.
        ({"stat": {"exists": True, "islnk": False, "isdir": True}}, ""),
        (NO_LINK, ""),
        ({"skipped": True}, ""),
        (None, ""),
    ],
)
def test_link_name(result, name):
    assert link_name(result) == name


def test_first_install_in_check_mode_knows_only_the_target():
    plan = plan_links([], "v0.18.0", 2, True, [{"stat": {"exists": False}}, NO_LINK])
    assert plan["installed"] == []
    assert plan["known"] == plan["kept"] == ["v0.18.0"]
    assert plan["pruned"] == []
    assert (plan["previous"], plan["link_previous"], plan["unlink_previous"], plan["published_previous"]) == (
        "",
        False,
        False,
        None,
    )


def test_upgrade_keeps_the_newest_and_links_the_one_left():
    found = markers("v0.16.0", "v0.17.0", "v0.18.0")
    plan = plan_links(found, "v0.19.0", 2, True, [link("v0.18.0"), link("v0.17.0")])
    assert plan["known"] == ["v0.16.0", "v0.17.0", "v0.18.0", "v0.19.0"]
    assert plan["kept"] == ["v0.18.0", "v0.19.0"]
    assert plan["pruned"] == ["v0.16.0", "v0.17.0"]
    assert (plan["old_current"], plan["old_previous"], plan["previous"]) == ("v0.18.0", "v0.17.0", "v0.18.0")
    assert plan["link_previous"] is True
    assert plan["unlink_previous"] is False
    assert plan["published_previous"] == "v0.18.0"


def test_the_target_is_kept_even_outside_the_window():
    # main reinstalling an older release that is already there: it is current, so it stays.
    found = markers("v0.16.0", "v0.17.0", "v0.18.0")
    plan = plan_links(found, "v0.16.0", 2, True, [link("v0.18.0"), link("v0.17.0")])
    assert plan["known"] == ["v0.16.0", "v0.17.0", "v0.18.0"]
    assert plan["kept"] == ["v0.16.0", "v0.17.0", "v0.18.0"]
    assert plan["pruned"] == []
    assert plan["previous"] == "v0.18.0"


def test_keep_one_prunes_the_release_previous_would_name():
    found = markers("v0.17.0", "v0.18.0")
    plan = plan_links(found, "v0.19.0", "1", True, [link("v0.18.0"), link("v0.17.0")])
    assert plan["kept"] == ["v0.19.0"]
    assert plan["pruned"] == ["v0.17.0", "v0.18.0"]
    assert plan["previous"] == "v0.18.0"
    # The link goes rather than pointing at a release that is removed; no fact names it.
    assert plan["link_previous"] is False
    assert plan["unlink_previous"] is True
    assert plan["published_previous"] is None


def test_converged_host_leaves_previous_where_it_is():
    found = markers("v0.17.0", "v0.18.0")
    plan = plan_links(found, "v0.18.0", 2, True, [link("v0.18.0"), link("v0.17.0")])
    assert plan["pruned"] == []
    assert plan["previous"] == "v0.17.0"
    assert plan["link_previous"] is False
    assert plan["published_previous"] == "v0.17.0"


def test_previous_missing_on_a_converged_host_stays_missing():
    plan = plan_links(markers("v0.18.0"), "v0.18.0", 2, True, [link("v0.18.0"), NO_LINK])
    assert (plan["previous"], plan["link_previous"], plan["unlink_previous"]) == ("", False, False)
    assert plan["published_previous"] is None


def test_rollback_switch_prunes_nothing_and_links_the_release_left():
    # The switch entry point: current goes back to v0.17.0, previous names v0.19.0 (the release rolled back from).
    found = markers("v0.16.0", "v0.17.0", "v0.18.0", "v0.19.0")
    plan = plan_links(found, "v0.17.0", 1, False, [link("v0.19.0"), link("v0.18.0")])
    assert plan["kept"] == plan["known"] == ["v0.16.0", "v0.17.0", "v0.18.0", "v0.19.0"]
    assert plan["pruned"] == []
    assert plan["previous"] == "v0.19.0"
    assert plan["link_previous"] is True
    assert plan["published_previous"] == "v0.19.0"


def test_repeated_switch_keeps_previous():
    found = markers("v0.17.0", "v0.19.0")
    plan = plan_links(found, "v0.17.0", 2, False, [link("v0.17.0"), link("v0.19.0")])
    assert plan["previous"] == "v0.19.0"
    assert plan["link_previous"] is False


def test_switch_ignores_keep_releases():
    plan = plan_links(markers("v0.17.0"), "v0.17.0", "not a number", False, [])
    assert plan["kept"] == ["v0.17.0"]


@pytest.mark.parametrize("keep", [0, -1, "x", None])
def test_prune_needs_a_positive_keep(keep):
    with pytest.raises(ReleasesError, match=r"inference_server_keep_releases is .*set it to 1 or more"):
        plan_links(markers("v0.17.0"), "v0.18.0", keep, True, [])


def test_links_missing_altogether():
    plan = plan_links(markers("v0.17.0"), "v0.18.0", 2, True, None)
    assert (plan["old_current"], plan["old_previous"], plan["previous"]) == ("", "", "")
    assert plan["kept"] == ["v0.17.0", "v0.18.0"]
