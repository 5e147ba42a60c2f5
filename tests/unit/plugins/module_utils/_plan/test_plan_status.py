"""ttfleet.inference.fleet_status: state files, unit state, health probe, expected volume."""

import json
import os
import subprocess

import pytest
from http_servers import canned, serve

from ansible_collections.ttfleet.inference.plugins.module_utils._plan import status as _status
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import apply_hardlink, plan_hardlink


@pytest.fixture
def server():
    with serve(canned(path="/health")) as httpd:
        yield httpd


def _systemctl(active="active", returncode=0):
    def runner(argv, **kwargs):
        assert argv[:3] == ["systemctl", "show", argv[2]]
        out = f"ActiveState={active}\nSubState=running\nNRestarts=2\nUnitFileState=enabled\nActiveEnterTimestamp=x\n"
        return subprocess.CompletedProcess(argv, returncode, out, "boom" if returncode else "")

    return runner


def _volume(root, model="Qwen3-32B", manifest=True):
    weights = os.path.join(root, "weights", model)
    os.makedirs(weights)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        with open(os.path.join(weights, name), "w") as handle:
            handle.write("x")
    if manifest:
        with open(os.path.join(weights, ".ttfleet-manifest.json"), "w") as handle:
            json.dump(
                {
                    "source": "hf",
                    "repo_id": "Qwen/Qwen3-32B",
                    "revision": "a" * 40,
                    "files": {"a": {}},
                    "verified_at": "2026-11-30T00:00:00Z",
                },
                handle,
            )
    mesh = os.path.join(root, "tt_metal_cache", f"cache_{model}", "P300x2")
    os.makedirs(mesh)
    with open(os.path.join(mesh, "kernel.bin"), "w") as handle:
        handle.write("k")


def test_state_files_sorted_and_bad_ones_reported(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"model": "B", "port": 8001}))
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "c.json").write_text("[1]")
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / ".hidden.json").write_text("{}")
    found = _status.read_state_files(str(tmp_path))
    assert [item["instance"] for item in found] == ["a", "b", "c"]
    assert found[0]["error"] and found[1]["error"] is None and found[2]["error"] == "does not hold a JSON object"
    assert found[1]["data"]["port"] == 8001


def test_missing_state_dir_means_no_instances(tmp_path):
    assert _status.read_state_files(str(tmp_path / "absent")) == []


def test_health_url_defaults_to_loopback():
    assert _status.health_url({"port": 8001}) == "http://127.0.0.1:8001/health"
    assert _status.health_url({"port": "8002", "bind_host": "0.0.0.0"}) == "http://127.0.0.1:8002/health"
    assert _status.health_url({"port": 8003, "bind_host": "10.0.0.5"}) == "http://10.0.0.5:8003/health"
    assert _status.health_url({"health_url": "http://h:1/health", "port": 9}) == "http://h:1/health"
    assert _status.health_url({}) is None


def test_probe_healthy_unhealthy_unreachable(server):
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    assert _status.probe(url, 2)["status"] == "healthy"
    server.RequestHandlerClass.status = 503
    result = _status.probe(url, 2)
    assert (result["status"], result["code"]) == ("unhealthy", 503)
    server.shutdown()
    server.server_close()
    assert _status.probe(url, 1)["status"] == "unreachable"
    assert _status.probe(None, 1)["status"] == "unknown"


def test_unit_state_parses_systemctl():
    state = _status.unit_state("tt-serve@a.service", runner=_systemctl())
    assert state["active_state"] == "active" and state["restarts"] == 2 and state["enabled"] == "enabled"
    failed = _status.unit_state("tt-serve@a.service", runner=_systemctl(returncode=1))
    assert failed["available"] is False and failed["error"] == "boom"


def test_describe_expected_alias_and_directory(tmp_path):
    factory = tmp_path / "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
    _volume(str(factory))
    link = tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    link.symlink_to(factory.name)
    info = _status.describe_expected(str(link), "Qwen3-32B")
    assert info["is_alias"] and info["alias_of"] == str(factory)
    assert info["weights"]["usable"] and info["weights"]["revision"] == "a" * 40
    assert info["weights"]["verified"] == "2026-11-30T00:00:00Z"
    assert info["kernel_cache_meshes"] == ["P300x2"]
    direct = _status.describe_expected(str(factory), "Qwen3-32B")
    assert direct["type"] == "directory" and not direct["is_alias"]
    absent = _status.describe_expected(str(tmp_path / "nope"), "Qwen3-32B")
    assert absent["type"] == "absent" and not absent["exists"]


def test_describe_expected_names_the_volume_a_hardlinked_directory_shares_weights_with(tmp_path):
    old = tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.14.0"
    _volume(str(old))
    new = tmp_path / "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
    apply_hardlink(plan_hardlink(str(new), str(old), tt_metal_commit="b204341"))
    info = _status.describe_expected(str(new), "Qwen3-32B")
    assert info["type"] == "directory" and not info["is_alias"]
    assert info["weights_from"] == str(old) and info["tt_metal_commit"] == "b204341"
    assert info["weights"]["usable"] and info["kernel_cache_meshes"] == []
    row = {"host": "qb2", "reachable": True, "instances": [{"instance": "q", "volume": info}]}
    assert _status.status_lines([row])[1].endswith(f"{new.name} (weights of {old.name})  -")


def test_host_report_marks_unhealthy(tmp_path, server):
    state = tmp_path / "state"
    state.mkdir()
    port = server.server_address[1]
    volume = tmp_path / "vol"
    _volume(str(volume))
    (state / "qwen3-32b.json").write_text(json.dumps({"model": "Qwen3-32B", "port": port, "volume_path": str(volume)}))
    (state / "down.json").write_text(json.dumps({"model": "X", "port": 1}))
    releases = tmp_path / "opt"
    (releases / "releases" / "v0.20.0").mkdir(parents=True)
    (releases / "current").symlink_to("releases/v0.20.0")
    report = _status.host_report(str(state), str(releases), timeout=1, runner=_systemctl())
    assert report["release"] == "v0.20.0" and report["previous_release"] is None
    assert report["instance_count"] == 2
    assert report["unhealthy"] == ["down"]
    good = report["instances"][1]
    assert good["healthy"] and good["unit"]["unit"] == "tt-serve@qwen3-32b.service"
    inactive = _status.host_report(str(state), str(releases), timeout=1, runner=_systemctl(active="failed"))
    assert inactive["unhealthy"] == ["down", "qwen3-32b"]


def test_status_lines_table():
    rows = [
        {
            "host": "qb2",
            "device_type": "p300x2",
            "release": "v0.20.0",
            "reachable": True,
            "instances": [
                {
                    "instance": "qwen3-32b",
                    "port": 8000,
                    "unit": {"active_state": "active"},
                    "health": {"status": "healthy"},
                    "volume": {
                        "path": "/v/volume_id_tt_transformers-Qwen3-32B-v0.17.0",
                        "is_alias": True,
                        "alias_of": "/h/volume_id_tt_transformers-Qwen3-32B-vqb2_launch",
                    },
                }
            ],
        },
        {"host": "n150-1", "device_type": "n150", "release": None, "reachable": True, "instances": []},
        {"host": "gone", "device_type": "t3k", "reachable": False},
    ]
    lines = _status.status_lines(rows)
    assert lines[0].split() == ["HOST", "DEVICE", "RELEASE", "INSTANCE", "PORT", "UNIT", "HEALTH", "VOLUME", "IMAGE"]
    assert lines[1].split() == [
        "qb2",
        "p300x2",
        "v0.20.0",
        "qwen3-32b",
        "8000",
        "active",
        "healthy",
        "volume_id_tt_transformers-Qwen3-32B-v0.17.0",
        "->",
        "volume_id_tt_transformers-Qwen3-32B-vqb2_launch",
        "-",
    ]
    assert lines[2].split()[:4] == ["n150-1", "n150", "-", "(none)"]
    assert "unreachable" in lines[3].split()
    assert len({line.index("INSTANCE") if i == 0 else None for i, line in enumerate(lines)} - {None}) == 1
    assert lines[1].index("qwen3-32b") == lines[0].index("INSTANCE")


def test_a_serve_profile_is_reported_and_shown_after_the_instance(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    data = {"model": "Qwen3.8-27B", "port": 1, "profile": "p1d1", "spec_source": "runtime_model_spec"}
    (state / "qwen-b.json").write_text(json.dumps(data))
    report = _status.host_report(str(state), str(tmp_path / "opt"), timeout=1, runner=_systemctl())
    (item,) = report["instances"]
    assert (item["profile"], item["spec_source"]) == ("p1d1", "runtime_model_spec")
    row = {"host": "p150x2-03", "device_type": "p150x2", "release": "v0.20.0", "instances": [item]}
    assert _status.status_lines([row])[1].split()[3:5] == ["qwen-b", "(p1d1)"]


def test_status_lines_show_the_image_and_its_digest():
    digest = "sha256:" + "0123456789ab" + "f" * 52
    item = {
        "instance": "q",
        "image": "reg.site:5000/tenstorrent/tt-inference-server/vllm-x:0.20.0-b2",
        "image_digest": digest,
    }
    row = {"host": "h", "reachable": True, "instances": [item]}
    assert _status.status_lines([row])[1].split()[-1] == "vllm-x:0.20.0-b2@0123456789ab"
    item["image_digest"] = None
    assert _status.status_lines([row])[1].split()[-1] == "vllm-x:0.20.0-b2"
    item["image"] = "evil\x1b]0;x\x07/y:1"
    assert "\x1b" not in _status.status_lines([row])[1]


def test_status_summary_counts_the_rows():
    rows = [
        {
            "host": "qb2",
            "reachable": True,
            "release": "v0.20.0",
            "instances": [{"instance": "a", "healthy": True}, {"instance": "b", "healthy": False}],
            "unhealthy": ["b"],
        },
        {"host": "n150-1", "reachable": True, "release": None, "instances": [], "unhealthy": []},
        {"host": "n150-2", "reachable": True, "release": "v0.20.0", "instances": [], "unhealthy": []},
        {"host": "gone", "reachable": False, "instances": [], "unhealthy": []},
    ]
    assert _status.status_summary(rows) == {
        "healthy": False,
        "hosts": 4,
        "reachable": 3,
        "unreachable": ["gone"],
        "unhealthy": ["qb2/b"],
        "instances": 2,
        "healthy_instances": 1,
        "releases": {"v0.20.0": 2, "none": 1},
    }
    assert _status.status_summary([rows[1]])["healthy"] is True
    assert _status.status_summary([])["healthy"] is True


def test_status_summary_escapes_every_name_a_host_gave():
    hostile = "\x1b]0;pwned\x07\x1b[2J\r\nfatal: forged\u202e\x9b[31m"
    rows = [
        {
            "host": "qb2",
            "reachable": True,
            "release": "v" + hostile,
            "instances": [{"instance": hostile, "healthy": False}, "not a mapping"],
            "unhealthy": [hostile],
        },
        {"host": "h" + hostile, "reachable": False},
        # A host that answers with other types: a name instead of a list, a row that is not a mapping.
        {"host": "odd", "reachable": True, "release": 7, "instances": {"x": 1}, "unhealthy": hostile},
        "not a row",
    ]
    summary = _status.status_summary(rows)
    escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\r\\nfatal: forged\\u202e\\x9b[31m"
    assert summary["unhealthy"] == [f"qb2/{escaped}", f"odd/{escaped}"]
    assert summary["unreachable"] == [f"h{escaped}", "-"]
    assert summary["releases"] == {f"v{escaped}": 1, "7": 1}
    assert (summary["hosts"], summary["reachable"], summary["instances"]) == (4, 2, 3)
    text = json.dumps(summary, ensure_ascii=False)
    for char in ("\x1b", "\x07", "\r", "\n", "\u202e", "\x9b"):
        assert char not in text, repr(char)
