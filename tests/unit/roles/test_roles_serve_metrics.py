"""roles/serve/files/ttfleet-serve: the textfile metrics the health run writes (docs/operations.md, "Metrics").

The textfile directory may belong to node_exporter's user: a link or file planted there is replaced, never followed,
and a directory that is a link is refused. The wrapper runs alone on the hosts, so it is loaded here from its file.
"""

import importlib.machinery
import importlib.util
import json
import os
import stat

import pytest
from conftest import ROOT

WRAPPER = os.path.join(ROOT, "roles", "serve", "files", "ttfleet-serve")


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    loader = importlib.machinery.SourceFileLoader("ttfleet_serve_wrapper", WRAPPER)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    for name in ("CONFIG_DIR", "RUN_DIR", "STATE_DIR"):
        path = tmp_path / name.lower()
        path.mkdir()
        monkeypatch.setattr(module, name, str(path))
    monkeypatch.setattr(module, "METRICS_CONF", str(tmp_path / "metrics.json"))
    monkeypatch.setattr(module, "BOARD_DIR", str(tmp_path / "dev"))
    return module


def test_a_link_planted_at_the_final_name_is_replaced_not_followed(wrapper, tmp_path):
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    os.symlink(victim, textfiles / "ttfleet_x.prom")
    wrapper.write_textfile(str(textfiles), "ttfleet_x.prom", "ttfleet_a 1\n")
    assert victim.read_text() == "root's file\n"
    info = os.lstat(textfiles / "ttfleet_x.prom")
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
    assert (textfiles / "ttfleet_x.prom").read_text() == "ttfleet_a 1\n"
    assert sorted(os.listdir(textfiles)) == ["ttfleet_x.prom"]


def test_a_textfile_directory_that_is_a_link_is_refused(wrapper, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    os.symlink(real, tmp_path / "textfiles")
    with pytest.raises(OSError):
        wrapper.write_textfile(str(tmp_path / "textfiles"), "ttfleet_x.prom", "ttfleet_a 1\n")
    assert os.listdir(real) == []


def test_a_directory_at_the_final_name_fails_and_leaves_no_temporary_file(wrapper, tmp_path):
    textfiles = tmp_path / "textfiles"
    (textfiles / "ttfleet_x.prom").mkdir(parents=True)
    with pytest.raises(OSError):
        wrapper.write_textfile(str(textfiles), "ttfleet_x.prom", "ttfleet_a 1\n")
    assert os.listdir(textfiles) == ["ttfleet_x.prom"]


def test_label_values_are_escaped_as_the_text_format_requires(wrapper):
    out = wrapper.Metrics()
    out.add("ttfleet_a", "gauge", "A.", {"model": 'a"b\\c\nd'}, 1)
    assert out.text() == '# HELP ttfleet_a A.\n# TYPE ttfleet_a gauge\nttfleet_a{model="a\\"b\\\\c\\nd"} 1\n'


def test_the_last_health_result_stays_while_the_unit_is_not_active(wrapper):
    conf = {"model": "M", "device": "p150", "profile": ""}
    wrapper.instance_metrics("x", conf, "active", {"ok": False, "code": 503, "seconds": 0.1, "time": 5.0}, 2)
    text = wrapper.instance_metrics("x", conf, "activating", None, 2).text()
    assert 'ttfleet_instance_health_ok{device="p150",model="M",profile="",release="",ttfleet_instance="x"} 0' in text
    assert 'state="activating",ttfleet_instance="x"} 1' in text
    assert "ttfleet_instance_restarts_total{" in text


def test_host_metrics_read_the_prune_report_only_when_it_is_roots(wrapper, tmp_path):
    (tmp_path / "dev").mkdir()
    for name in ("0", "1", "2", "x"):
        (tmp_path / "dev" / name).touch()
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"time": 7, "reclaimable_bytes": 1234, "volume_root": "/v"}))
    settings = {"device": "p150x4", "boards_expected": 4, "volume_roots": [str(tmp_path)], "prune_report": str(report)}
    text = wrapper.host_metrics(settings).text()
    assert 'ttfleet_host_boards{device="p150x4"} 3' in text
    assert 'ttfleet_reclaimable_bytes{volume_root="/v"} 1234' in text
    assert f'ttfleet_volume_free_bytes{{volume_root="{tmp_path}"}}' in text
    if os.geteuid() == 0:
        os.chown(report, 1000, 1000)
        assert "ttfleet_reclaimable_bytes" not in wrapper.host_metrics(settings).text()
    report.unlink()
    assert "ttfleet_reclaimable_bytes" not in wrapper.host_metrics(settings).text()


def test_the_kernel_cache_size_counts_a_hardlinked_file_once_and_follows_no_link(wrapper, tmp_path):
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "a").write_bytes(b"x" * 100)
    os.link(cache / "a", cache / "sub" / "b")
    (tmp_path / "big").write_bytes(b"y" * 5000)
    os.symlink(tmp_path / "big", cache / "link")
    os.symlink(tmp_path, cache / "dirlink")
    assert wrapper.tree_bytes(str(cache)) == 100
    assert wrapper.tree_bytes(str(cache / "link")) is None
