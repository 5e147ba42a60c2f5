"""The filters that call the plans of plugins/module_utils/_plan (plugins/filter/releases.py, serve.py, holders.py):
each is registered under the name of its documentation file, passes its input through and refuses malformed input
with an error that names the filter."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter import holders, releases, serve

# tests/unit/plugins/filter/<this file>: five levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
PLUGINS = {"releases": releases, "serve": serve, "holders": holders}


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_every_filter_has_its_documentation(plugin):
    for name in PLUGINS[plugin].FilterModule().filters():
        path = os.path.join(ROOT, "plugins", "filter", f"{name}.yml")
        assert os.path.isfile(path), f"{name} has no {path}"
        with open(path, encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["DOCUMENTATION"]["name"] == name


def filters(plugin):
    return PLUGINS[plugin].FilterModule().filters()


def test_release_links():
    found = [{"path": "/r/releases/v0.17.0/.m", "mtime": 1.0}, {"path": "/r/releases/v0.18.0/.m", "mtime": 2.0}]
    link = {"stat": {"islnk": True, "lnk_target": "releases/v0.18.0"}}
    plan = filters("releases")["release_links"](found, "v0.19.0", "1", "yes", [link])
    assert plan["kept"] == ["v0.19.0"]
    assert plan["pruned"] == ["v0.17.0", "v0.18.0"]
    # The switch entry point passes prune as false: nothing is pruned, whatever keep says.
    assert filters("releases")["release_links"](found, "v0.17.0", 1, False, [link])["pruned"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("not a list", "v0.1.0", 2), "the input must be the files of ansible.builtin.find"),
        (([], "v0.1.0", 0), "inference_server_keep_releases is 0"),
        (([{"mtime": 1}], "v0.1.0", 2), "malformed find or stat results"),
        (([], "v0.1.0", 2, "maybe"), "prune must be true or false, got 'maybe'"),
        (([], "v0.1.0", 2, True, "x"), "links must be the results of the stat"),
    ],
)
def test_release_links_refuses(args, message):
    with pytest.raises(AnsibleFilterError, match=f"release_links: .*{message}"):
        filters("releases")["release_links"](*args)


def test_serve_filters_pass_through():
    serve_filters = filters("serve")
    results = [{"image": "a:1", "image_origin": "o/a:1", "__serve_instance": {"instance": "x"}}]
    images = serve_filters["serve_image_list"](results)
    assert images == [{"image": "a:1", "origin": "o/a:1"}]
    assert serve_filters["serve_mirror_list"]([[{"image": "a:1", "origin": "o/a:1"}], None]) == [
        {"source": "o/a:1", "target": "a:1"}
    ]
    mirrored = {"images": [{"target": "a:1", "image_bytes": 7}]}
    assert serve_filters["serve_image_fetch_list"](images, mirrored) == [{"image": "a:1", "origin": "o/a:1", "size": 7}]
    assert serve_filters["serve_image_records"]({"images": [{"image": "a:1"}]}, {"skipped": True}) == {
        "a:1": {"image": "a:1"}
    }
    command = {"image": "a:1", "argv": ["run", "a:1"]}
    assert serve_filters["serve_run_argv"](command, {"pinned": "a:1@sha256:f"}, "true") == ["run", "a:1@sha256:f"]
    stats = [{"item": {"volume": "/v", "__serve_instance": {"instance": "x"}}, "stat": {"exists": False}}]
    assert serve_filters["serve_volumes_missing"](stats, {}, False) == ["x (/v)"]
    assert serve_filters["serve_unit_plan"]({"configuration": {"changed": True}, "units": None}, True) == {
        "state": "restarted",
        "reasons": ["configuration"],
        "asked": False,
    }
    assert serve_filters["serve_health_host"]("0.0.0.0") == "127.0.0.1"
    assert serve_filters["serve_health_host"]("::") == "[::1]"
    assert serve_filters["serve_health_host"]("10.0.0.5") == "10.0.0.5"


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("serve_image_list", ("x",), "the input must be the results of container_command"),
        ("serve_image_list", ([{"image": "a:1"}],), "malformed container_command results"),
        ("serve_mirror_list", ([["x"]],), "malformed serve_registry_pulls"),
        ("serve_mirror_list", ({"h1": []},), "the hosts' serve_registry_pulls"),
        ("serve_image_fetch_list", ([], "x"), "must be a registered result"),
        ("serve_image_records", ("x",), "must be a registered result"),
        ("serve_run_argv", ({"argv": []}, {}), "malformed container_command result"),
        ("serve_volumes_missing", ([{"stat": {}}], {}, False), "malformed results"),
        ("serve_unit_plan", ([],), "must map what was written"),
        ("serve_unit_plan", ({}, "sometimes"), "check_mode must be true or false"),
        ("serve_run_argv", ({"image": "a", "argv": []}, {}, "x"), "pin_digest must be true or false"),
        ("serve_health_host", (0,), "must be serve_bind_host"),
    ],
)
def test_serve_filters_refuse(name, args, message):
    with pytest.raises(AnsibleFilterError, match=f"{name}: .*{message}"):
        filters("serve")[name](*args)


def test_holder_filters_pass_through():
    holder_filters = filters("holders")
    planned = [{"kernel": {"model_name": "m"}}]
    assert holder_filters["kernel_deploys"](planned, [{"name": "m"}], "path", "", "h1") == {
        "pulls": True,
        "keys": [{"model_name": "m"}],
    }
    inspected = [{"deployable": True, "__model_cache_kspec": {"model_name": "m"}}]
    want = holder_filters["kernel_wants"](inspected, "cache-1", "lab")
    assert holder_filters["kernel_wants_by_host"]([want, {}], ["h1", "h2"]) == {"h1": want}
    slot = {"id": "k", "role": "pull", "round": 1, "peer": "h2", "alternates": [], "serve_rounds": [2]}
    assert holder_filters["kernel_round"]([slot], "1") == {"pull": [slot], "serve": False}
    assert holder_filters["weights_round"]({"m": slot}, 2) == {"pull": [], "serve": ["m"]}
    assert holder_filters["kernel_holders"](slot, "cache-1") == ["h2", "cache-1"]
    assert holder_filters["kernel_holder_urls"]([slot], "cache-1", ["cache-1"], None, {"h2": "http://h2/"}) == {
        "k": ["http://h2/"]
    }
    packed = [{"__model_cache_kspec": {"model_name": "m"}, "manifest": {"sha256": "f" * 64}}]
    assert holder_filters["kernel_expected_sha256"](packed, {"model_name": "m"}) == "f" * 64
    assert holder_filters["weights_holder_urls"](slot, "m", {"h2": {"m": "http://h2/w/"}}) == ["http://h2/w/"]


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("kernel_deploys", ("x", [], "path", "", "h1"), "the input"),
        ("kernel_deploys", ([{}], [{"name": "m"}], "path", "", "h1"), "malformed input"),
        ("kernel_deploys", ([], "x", "path", "", "h1"), "models must be the list"),
        ("kernel_wants", ([{"deployable": True}], "p", "s"), "malformed input"),
        ("kernel_wants_by_host", ([{}], "h1"), "hosts must be the list"),
        ("kernel_wants_by_host", ([{}, {}], ["h1"]), "2 wants for 1 hosts"),
        ("kernel_round", ([], "first"), "the round must be a number"),
        ("weights_round", ([], 1), "must be a dict"),
        ("kernel_holders", ({"alternates": []}, "p"), "malformed input"),
        ("kernel_holder_urls", ([{"id": "k", "peer": "h"}], "p", "x", [], {}), "peers must be the kernel peers"),
        ("kernel_holder_urls", ([{"id": "k", "peer": "h"}], "p", [], [], []), "server_urls"),
        ("kernel_expected_sha256", ([], "x"), "key must be a dict"),
        ("weights_holder_urls", ({"peer": "h"}, "m", None), "server_urls"),
    ],
)
def test_holder_filters_refuse(name, args, message):
    with pytest.raises(AnsibleFilterError, match=f"{name}: .*{message}"):
        filters("holders")[name](*args)
