"""_plan/metrics: the hosts' Prometheus targets, the fleet's file_sd lists and the textfile settings."""

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._plan.metrics import (
    MetricsError,
    file_sd,
    host_settings,
    host_targets,
)

# A fleet_status result as the module returns it (the keys the targets read, and others they ignore).
REPORT = {
    "release": "v0.20.0",
    "instances": [
        {
            "instance": "llama-3-1-8b",
            "model": "Llama-3.1-8B",
            "model_name": "Llama-3.1-8B",
            "device": "p150",
            "release": "v0.20.0",
            "profile": None,
            "port": 8001,
            "healthy": True,
        },
        {
            "instance": "llama-3-1-8b-instruct",
            "model_name": "Llama-3.1-8B-Instruct",
            "device": "p150",
            "release": "v0.20.0",
            "profile": "chat",
            "port": 8000,
            "healthy": False,
        },
    ],
}


def test_one_target_per_instance_with_every_label_and_the_node_target():
    got = host_targets(REPORT, "qb2-01", "10.0.0.7", "lab", "p150x4", 9100)
    assert got["host"] == "qb2-01"
    assert got["instances"] == [
        {
            "targets": ["10.0.0.7:8001"],
            "labels": {
                "host": "qb2-01",
                "instance": "llama-3-1-8b",
                "model": "Llama-3.1-8B",
                "device": "p150",
                "release": "v0.20.0",
                "profile": "",
                "site": "lab",
            },
        },
        {
            "targets": ["10.0.0.7:8000"],
            "labels": {
                "host": "qb2-01",
                "instance": "llama-3-1-8b-instruct",
                "model": "Llama-3.1-8B-Instruct",
                "device": "p150",
                "release": "v0.20.0",
                "profile": "chat",
                "site": "lab",
            },
        },
    ]
    assert got["nodes"] == [
        {"targets": ["10.0.0.7:9100"], "labels": {"host": "qb2-01", "device": "p150x4", "site": "lab"}}
    ]


def test_an_ipv6_address_is_bracketed_and_port_0_leaves_the_node_out():
    got = host_targets(REPORT, "h", "fd00::7", "", "p150x4", 0)
    assert got["instances"][0]["targets"] == ["[fd00::7]:8001"]
    assert got["nodes"] == []


@pytest.mark.parametrize("address", ["", "host name", "a/b", "h:8000/x", "-x", None, "a..b"])
def test_an_address_prometheus_cannot_scrape_is_refused_naming_the_variable(address):
    with pytest.raises(MetricsError, match="metrics_target_address"):
        host_targets(REPORT, "h", address, "", "n150", 9100)


@pytest.mark.parametrize("port", [0, 70000, "x", None, True])
def test_an_instance_without_a_port_is_refused_naming_it(port):
    report = {"instances": [{"instance": "a", "port": port}]}
    with pytest.raises(MetricsError, match="instance 'a'"):
        host_targets(report, "h", "10.0.0.1", "", "n150", 9100)


def test_a_failed_status_read_is_refused():
    with pytest.raises(MetricsError, match="fleet_status result"):
        host_targets({"failed": True, "msg": "boom"}, "h", "10.0.0.1", "", "n150", 9100)


def _entry(host, instance=None):
    labels = {"host": host} if instance is None else {"host": host, "instance": instance}
    return {"targets": [f"{host}:1"], "labels": labels}


def test_the_hosts_of_the_run_replace_theirs_others_stay_while_in_the_inventory():
    existing = {
        "instances": [_entry("a", "old"), _entry("b", "kept"), _entry("gone", "x"), "junk", {"targets": "x"}],
        "nodes": [_entry("a"), _entry("b"), _entry("gone")],
    }
    new = [{"host": "a", "instances": [_entry("a", "new")], "nodes": [_entry("a")]}]
    got = file_sd(new, existing, ["a"], ["a", "b", "c"])
    assert got["instances"] == [_entry("a", "new"), _entry("b", "kept")]
    assert got["nodes"] == [_entry("a"), _entry("b")]


def test_a_host_of_the_run_with_no_instances_drops_its_old_ones_and_the_order_is_stable():
    existing = {"instances": [_entry("a", "old"), _entry("c", "z"), _entry("b", "y")]}
    got = file_sd([{"host": "a", "instances": [], "nodes": []}], existing, ["a"], ["a", "b", "c"])
    assert got["instances"] == [_entry("b", "y"), _entry("c", "z")]
    assert file_sd([], None, [], [])["instances"] == []


def test_host_settings_record_what_the_site_run_saw():
    facts = {
        "device_nodes": ["/dev/tenstorrent/0", "/dev/tenstorrent/1"],
        "firmware_version": "18.6.0",
        "kmd_version": "2.4.1",
    }
    got = host_settings(
        "/var/lib/prometheus/node-exporter",
        ["/var/lib/tt-cache/", "/srv/preseed", ""],
        "p150x4",
        facts,
        2.5,
        "/var/lib/ttfleet/prune/report.json",
        600,
    )
    assert got == {
        "textfile_dir": "/var/lib/prometheus/node-exporter",
        "volume_roots": ["/srv/preseed", "/var/lib/tt-cache"],
        "device": "p150x4",
        "boards_expected": 2,
        "firmware": "18.6.0",
        "kmd": "2.4.1",
        "upgrade_margin_bytes": int(2.5 * (1 << 30)),
        "prune_report": "/var/lib/ttfleet/prune/report.json",
        "cache_scan_seconds": 600,
    }
    off = host_settings("", [], "n150", None, 0, "", 0)
    assert off["textfile_dir"] == "" and off["boards_expected"] is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("node-exporter", ["/v"], "", {}, 1, "", 1), "metrics_textfile_dir"),
        (("/d", ["relative"], "", {}, 1, "", 1), "tt_volume_root"),
        (("/d", ["/v"], "", {}, -1, "", 1), "must not be negative"),
        (("/d", ["/v"], "", {}, "lots", "", 1), "must be numbers"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(args, match):
    with pytest.raises(MetricsError, match=match):
        host_settings(*args)
