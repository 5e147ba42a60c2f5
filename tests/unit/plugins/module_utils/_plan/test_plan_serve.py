"""Serving instances (plugins/module_utils/_plan/serve.py), the serve_env module, the serve_instances filter and
the instance wrapper of the serve role (roles/serve/files/ttfleet-serve)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import os
import stat
import threading
import time
import types

import pytest
from ansible.errors import AnsibleFilterError
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.filter.serve import serve_instances
from ansible_collections.ttfleet.inference.plugins.module_utils._plan import serve as _serve
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve import ServeError
from ansible_collections.ttfleet.inference.plugins.modules import serve_env as serve_env_module

# tests/unit/plugins/module_utils/_plan/<this file>: six levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
        ("Qwen3-32B", "qwen3-32b"),
        ("stable-diffusion-xl-base-1.0", "stable-diffusion-xl-base-1-0"),
        ("whisper-large-v3", "whisper-large-v3"),
        ("DeepSeek-R1-Distill-Llama-70B", "deepseek-r1-distill-llama-70b"),
        ("Falcon3-7B-Instruct_", "falcon3-7b-instruct"),
    ],
)
def test_slug(name, expected):
    assert _serve.slug(name) == expected
    assert _serve.instance_name({"name": name}) == expected


def test_instance_key_wins_and_is_checked():
    assert _serve.instance_name({"name": "Qwen3-32B", "instance": "qwen-a"}) == "qwen-a"
    for bad in ("Qwen", "-x", "a_b", "a/b", "x" * 64):
        with pytest.raises(ServeError, match="instance name is 1-63 lower-case"):
            _serve.instance_name({"name": "Qwen3-32B", "instance": bad})


def test_unusable_name():
    with pytest.raises(ServeError, match="set its instance key"):
        _serve.instance_name({"name": "///"})


# --- ports, boards -----------------------------------------------------------------------------


TWO = [
    {"name": "Llama-3.1-8B-Instruct", "device": "p150", "device_ids": [0]},
    {"name": "meta-llama/Llama-3.1-8B", "device": "p150", "device_ids": [1], "image_archive": "/srv/img.tar"},
]


def test_plan_defaults_ports_by_position_and_device():
    instances, problems = _serve.plan_instances(TWO, "p150x4")
    assert problems == []
    assert [(i["instance"], i["port"], i["device"], i["device_ids"]) for i in instances] == [
        ("llama-3-1-8b-instruct", 8000, "p150", [0]),
        ("llama-3-1-8b", 8001, "p150", [1]),
    ]
    assert instances[1]["image_archive"] == "/srv/img.tar"
    assert "image_archive" not in instances[0]


def test_plan_base_port_and_explicit_port():
    models = [{"name": "a", "device_ids": [0]}, {"name": "b", "device_ids": [1], "port": 9100}]
    instances, problems = _serve.plan_instances(models, "p150x4", base_port=7000)
    assert problems == []
    assert [i["port"] for i in instances] == [7000, 9100]
    assert [i["device"] for i in instances] == ["p150x4", "p150x4"]


def test_port_clash_names_both_models():
    models = [*TWO, {"name": "whisper-large-v3", "device_ids": [2], "port": 8001}]
    _instances, problems = _serve.plan_instances(models, "p150x4")
    assert len(problems) == 1
    assert "port clash" in problems[0]
    assert "meta-llama/Llama-3.1-8B" in problems[0] and "whisper-large-v3" in problems[0] and "8001" in problems[0]


@pytest.mark.parametrize(
    ("third_ids", "where"),
    [([1, 2], "share device ids [1]"), ([], "share every board")],
)
def test_board_clash_names_both_models(third_ids, where):
    models = [*TWO, {"name": "whisper-large-v3", "device_ids": third_ids, "port": 9000}]
    _instances, problems = _serve.plan_instances(models, "p150x4")
    clashes = [p for p in problems if "board clash" in p]
    assert clashes and all("whisper-large-v3" in p for p in clashes)
    assert any("meta-llama/Llama-3.1-8B" in p and where in p for p in clashes)


def test_two_instances_without_device_ids_clash():
    _instances, problems = _serve.plan_instances([{"name": "a"}, {"name": "b"}], "n300")
    assert problems == [
        "board clash: a (instance a, every board) and b (instance b, every board) share every "
        "board: give each its own device_ids"
    ]


def test_absent_entries_do_not_clash_but_keep_their_position():
    models = [{"name": "a", "state": "absent"}, {"name": "b"}]
    instances, problems = _serve.plan_instances(models, "n150")
    assert problems == []
    assert [(i["state"], i["port"]) for i in instances] == [("absent", 8000), ("present", 8001)]


def test_same_instance_name_twice():
    models = [{"name": "Qwen3-32B", "device_ids": [0, 1]}, {"name": "Qwen/Qwen3-32B", "device_ids": [2, 3]}]
    _instances, problems = _serve.plan_instances(models, "p300x2")
    assert problems == [
        "Qwen3-32B and Qwen/Qwen3-32B both get instance name qwen3-32b: set a distinct instance key on one of them"
    ]
    models[1]["instance"] = "qwen3-32b-b"
    assert _serve.plan_instances(models, "p300x2")[1] == []


def test_port_out_of_range():
    _instances, problems = _serve.plan_instances([{"name": "a"}], "n150", base_port=70000)
    assert any("outside 1-65535" in p for p in problems)


def test_entry_without_name():
    with pytest.raises(ServeError, match="has no name"):
        _serve.plan_instances([{"port": 1}], "n150")


def test_filter():
    assert serve_instances(TWO, "p150x4", 8000)["problems"] == []
    with pytest.raises(AnsibleFilterError, match="serve_instances"):
        serve_instances("nope", "p150x4")
    with pytest.raises(AnsibleFilterError, match="has no name"):
        serve_instances([{}], "p150x4")


@pytest.mark.parametrize(
    ("bind", "host"), [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("10.1.2.3", "10.1.2.3"), ("::", "[::1]")]
)
def test_health_host(bind, host):
    assert _serve.health_host(bind) == host


# --- env files ---------------------------------------------------------------------------------


def test_env_round_trip():
    values = {"VLLM_API_KEY": "abc-DEF_123", "HF_TOKEN": "hf_x"}
    text = _serve.render_env(values, header="two lines\nof header")
    assert text == "# two lines\n# of header\nHF_TOKEN=hf_x\nVLLM_API_KEY=abc-DEF_123\n"
    assert _serve.parse_env(text) == values


@pytest.mark.parametrize("value", ["with space", "new\nline", "", "tab\tx"])
def test_env_refuses_values_docker_cannot_carry(value):
    with pytest.raises(ServeError, match="printable ASCII"):
        _serve.render_env({"API_KEY": value})


def test_env_refuses_bad_names():
    with pytest.raises(ServeError, match="not valid"):
        _serve.render_env({"1X": "a"})


def test_desired_env_generates_once_and_keeps():
    values, generated = _serve.desired_env("vLLM", {})
    assert generated and list(values) == ["VLLM_API_KEY"] and len(values["VLLM_API_KEY"]) >= 40
    again, generated = _serve.desired_env("vLLM", values)
    assert not generated and again == values


def test_desired_env_engines_and_options():
    assert list(_serve.desired_env("media", {})[0]) == ["API_KEY"]
    assert list(_serve.desired_env("forge", {})[0]) == ["API_KEY"]
    assert _serve.desired_env("vLLM", {}, api_key="given-key")[0] == {"VLLM_API_KEY": "given-key"}
    assert _serve.desired_env("vLLM", {"VLLM_API_KEY": "old"}, no_auth=True, hf_token="hf_t") == (
        {"HF_TOKEN": "hf_t"},
        False,
    )
    with pytest.raises(ServeError, match="not one of"):
        _serve.desired_env("tensorrt", {})


def test_upstream_default_key_never_used():
    values, generated = _serve.desired_env("media", {"API_KEY": "your-secret-key"})
    assert generated and values["API_KEY"] != "your-secret-key"
    with pytest.raises(ServeError, match="well-known default"):
        _serve.desired_env("media", {}, api_key="your-secret-key")


# --- serve_env module --------------------------------------------------------------------------


def run_module(capsys, args, check_mode=False):
    if check_mode:
        args = {**args, "_ansible_check_mode": True}
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        serve_env_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_generates_keeps_and_never_shows_the_key(tmp_path, capsys):
    path = tmp_path / "qwen3-32b.env"
    code, planned = run_module(capsys, {"path": str(path), "engine": "vLLM", "_ansible_diff": True}, check_mode=True)
    assert code == 0 and planned["changed"] and planned["generated"] and not path.exists()

    code, result = run_module(capsys, {"path": str(path), "engine": "vLLM", "_ansible_diff": True})
    assert code == 0 and result["changed"] and result["generated"]
    key = _serve.parse_env(path.read_text())["VLLM_API_KEY"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key not in json.dumps(result)
    assert result["diff"]["after"] == "VLLM_API_KEY=<secret>\n"

    code, again = run_module(capsys, {"path": str(path), "engine": "vLLM"})
    assert code == 0 and not again["changed"] and not again["generated"]
    assert _serve.parse_env(path.read_text())["VLLM_API_KEY"] == key


def test_module_fixes_mode_and_replaces_a_given_key(tmp_path, capsys):
    path = tmp_path / "w.env"
    run_module(capsys, {"path": str(path), "engine": "media"})
    os.chmod(path, 0o644)
    code, result = run_module(capsys, {"path": str(path), "engine": "media"})
    assert result["changed"] and stat.S_IMODE(path.stat().st_mode) == 0o600
    code, result = run_module(capsys, {"path": str(path), "engine": "media", "api_key": "operator-key"})
    assert code == 0 and result["changed"] and "operator-key" not in json.dumps(result)
    assert _serve.parse_env(path.read_text()) == {"API_KEY": "operator-key"}


def test_module_errors(tmp_path, capsys):
    code, result = run_module(capsys, {"path": str(tmp_path / "missing" / "x.env"), "engine": "vLLM"})
    assert code == 1 and "does not exist" in result["msg"]
    args = {"path": str(tmp_path / "x.env"), "engine": "media", "api_key": "your-secret-key"}
    code, result = run_module(capsys, args)
    assert code == 1 and "well-known default" in result["msg"] and not (tmp_path / "x.env").exists()


# --- the instance wrapper ----------------------------------------------------------------------


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    path = os.path.join(ROOT, "roles", "serve", "files", "ttfleet-serve")
    loader = importlib.machinery.SourceFileLoader("ttfleet_serve_wrapper", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    monkeypatch.setattr(module, "RUN_DIR", str(tmp_path / "run"))
    env = tmp_path / "x.env"
    env.write_text("# header\nVLLM_API_KEY=k3y\n")
    conf = {
        "health_url": "http://127.0.0.1:8001/health",
        "health_failures": 2,
        "env_file": str(env),
        "served_model": "meta-llama/Llama-3.1-8B",
        "start_timeout": 5,
    }
    return module, conf


def test_wrapper_health_restarts_after_failures_in_a_row(wrapper, monkeypatch):
    module, conf = wrapper
    answers = iter([503, None, 200, 503, 503])
    restarts = []
    monkeypatch.setattr(module, "_unit_state", lambda unit: "active")
    monkeypatch.setattr(module, "get", lambda url, key=None, timeout=10: (next(answers), b"", None))
    monkeypatch.setattr(module.subprocess, "run", lambda argv, **kw: restarts.append(argv))
    for _check in range(5):
        module.cmd_health("x", conf)
        # 503 then nothing: restart; 200 resets; 503, 503: restart again.
    assert restarts == [["systemctl", "restart", "--no-block", "tt-serve@x.service"]] * 2


def test_wrapper_health_leaves_starting_instances_alone(wrapper, monkeypatch):
    module, conf = wrapper
    monkeypatch.setattr(module, "_unit_state", lambda unit: "activating")
    monkeypatch.setattr(module, "get", lambda *a, **k: pytest.fail("a starting instance was probed"))
    assert module.cmd_health("x", conf) == 0


def test_wrapper_ready_requires_the_model_with_the_key(wrapper, monkeypatch):
    module, conf = wrapper
    seen = []

    def get(url, key=None, timeout=10):
        seen.append((url, key))
        if url.endswith("/health"):
            return 200, b"{}", None
        return 200, json.dumps({"data": [{"id": "meta-llama/Llama-3.1-8B"}]}).encode(), None

    monkeypatch.setattr(module, "get", get)
    assert module.cmd_ready("x", conf, 5) == 0
    assert seen[-1] == ("http://127.0.0.1:8001/v1/models", "k3y")
    conf["served_model"] = "other/model"
    assert module.cmd_ready("x", conf, 5) == 1


def test_wrapper_sees_the_log_marker_across_chunks_and_copies_every_byte(wrapper, tmp_path, monkeypatch):
    module, _conf = wrapper
    read_end, write_end = os.pipe()
    marker = "Application startup complete"
    # A long line first, then the server's own line (uvicorn's prefix).
    body = b"x" * 70000 + b"\nINFO:     Application startup complete.\n"
    copied = io.BytesIO()
    monkeypatch.setattr(module.sys, "stdout", types.SimpleNamespace(buffer=copied))
    seen = threading.Event()
    with os.fdopen(read_end, "rb", buffering=0) as stream:
        thread = threading.Thread(target=module.watch_output, args=(stream, marker, seen, "qwen-b"))
        thread.start()
        # The marker straddles a read boundary: the first write ends in its middle.
        os.write(write_end, body[:70020])
        time.sleep(0.05)
        os.write(write_end, body[70020:])
        os.close(write_end)
        thread.join(5)
    assert seen.is_set() and os.path.exists(module.marker_path("qwen-b"))
    assert copied.getvalue() == body


def test_wrapper_without_the_marker_never_marks(wrapper, monkeypatch):
    module, _conf = wrapper
    read_end, write_end = os.pipe()
    monkeypatch.setattr(module.sys, "stdout", types.SimpleNamespace(buffer=io.BytesIO()))
    seen = threading.Event()
    os.write(write_end, b"Application startup failed\n")
    os.close(write_end)
    with os.fdopen(read_end, "rb", buffering=0) as stream:
        module.watch_output(stream, "Application startup complete", seen, "qwen-b")
    assert not seen.is_set() and not os.path.exists(module.marker_path("qwen-b"))


MARKER = "Application startup complete"


@pytest.mark.parametrize(
    "line",
    [
        b"Application startup complete.",
        b"INFO:     Application startup complete.",
        b"\x1b[32mINFO\x1b[0m:     Application startup complete.\r",
        b"INFO 12-05 01:23:45 [launcher.py:37] Application startup complete",
        b"(APIServer pid=7) INFO 12-05 01:23:45.123 [launcher.py:37] Application startup complete",
        b"2026-12-05 01:23:45,123 - run_vllm_api_server.py:389 - INFO: Application startup complete",
        b"2026-12-05 01:23:45,123 - WARNING - Application startup complete",
    ],
)
def test_wrapper_counts_the_servers_own_marker_lines(wrapper, line):
    module, _conf = wrapper
    assert module.is_marker_line(module.marker_pattern(MARKER), line)


@pytest.mark.parametrize(
    "line",
    [
        b"INFO 12-05 01:23:45 [logger.py:43] Received request chatcmpl-1: prompt: 'Application startup complete'",
        b"(APIServer pid=7) INFO 12-05 01:23:45 [logger.py:43] Received request x: prompt: 'a\\nApplication startup "
        b"complete'",
        b'INFO:     127.0.0.1:40000 - "GET /Application startup complete HTTP/1.1" 404',
        b"stand-in: Application startup complete",
        b" Application startup complete",
        b"INFO Application startup complete",
        b"NOTICE:     Application startup complete",
        b"Application startup complet",
    ],
)
def test_wrapper_ignores_the_marker_inside_other_text(wrapper, line):
    module, _conf = wrapper
    assert not module.is_marker_line(module.marker_pattern(MARKER), line)


def test_wrapper_matches_the_marker_literally(wrapper):
    module, _conf = wrapper
    pattern = module.marker_pattern("ready (v1.*)")
    assert module.is_marker_line(pattern, b"INFO:     ready (v1.*) now")
    assert not module.is_marker_line(pattern, b"INFO:     ready (v1.2) now")


def test_wrapper_gives_a_first_start_its_own_timeout(wrapper, tmp_path):
    module, conf = wrapper
    cache = tmp_path / "cache"
    conf.update(start_timeout=120, first_start_timeout=900, cache_dir=str(cache))
    assert module.start_timeout(conf) == 900  # missing
    cache.mkdir()
    assert module.start_timeout(conf) == 900  # empty
    (cache / "kernels.bin").write_bytes(b"x")
    assert module.start_timeout(conf) == 120
    link = tmp_path / "link"
    link.symlink_to(cache)
    assert module.start_timeout({**conf, "cache_dir": str(link)}) == 900  # a link is not the cache
    assert module.start_timeout({"start_timeout": 60}) == 60


def test_wrapper_ready_waits_for_the_marker(wrapper, monkeypatch):
    module, conf = wrapper
    conf["ready_log_marker"] = "Application startup complete"
    monkeypatch.setattr(module, "get", lambda url, key=None, timeout=10: (200, b'{"data": []}', None))
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    assert module.cmd_ready("qwen-b", conf, 5) == 1
