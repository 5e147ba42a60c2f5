"""An instance port that breaks the protocol, against the serve role's health check (the real ttfleet-serve, run as
its units run it), the fleet_status probe, the HTML report and the terminal table (issue 15).

Each case asserts its bound: the failure counted toward the restart, the time a check may take, the wrapper's peak
memory, the credentials another origin received, and the text that reaches the terminal or the report.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT, SLACK, baseline_rss_mib, drip, endless, http_head, long_head, run_bounded, send

from ansible_collections.ttfleet.inference.plugins.filter.tt_status import tt_status_lines
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import open_url, read_capped
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_HEALTH_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._plan import status as _status

WRAPPER = os.path.join(ROOT, "roles", "serve", "files", "ttfleet-serve")
TEMPLATES = os.path.join(ROOT, "roles", "serve", "templates")
# The units run the wrapper with the host's /usr/bin/python3, without the collection.
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
HUGE = 256 << 20
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# Runs the wrapper as a child and reports that child's peak RSS (RUSAGE_CHILDREN of this one-child parent).
MEASURE = """
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
sys.stderr.write("\\n@@peak_rss_mib=%.1f\\n" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024))
sys.exit(rc)
"""


# --- the wrapper, as the units run it -----------------------------------------------------------------------------


class Host:
    """A throwaway /etc/ttfleet/serve and /run/ttfleet/serve, a copy of the wrapper that uses them, and a systemctl
    and docker on PATH that record their calls (systemctl is-active answers ``active``)."""

    def __init__(self, tmp_path):
        self.etc = tmp_path / "etc"
        self.run_dir = tmp_path / "run"
        self.bin = tmp_path / "bin"
        self.calls = tmp_path / "calls.log"
        for path in (self.etc, self.bin):
            path.mkdir()
        with open(WRAPPER, encoding="utf-8") as handle:
            text = handle.read()
        for name, value in (("CONFIG_DIR", self.etc), ("RUN_DIR", self.run_dir)):
            line = re.search(rf'^{name} = "[^"]*"$', text, re.M)
            assert line, f"{name} is no longer a constant of the wrapper"
            text = text.replace(line.group(0), f"{name} = {str(value)!r}")
        self.script = tmp_path / "ttfleet-serve"
        self.script.write_text(text)
        for tool in ("systemctl", "docker"):
            fake = self.bin / tool
            fake.write_text(
                f'#!/bin/sh\necho "{tool} $*" >> {self.calls}\n'
                + ('[ "$1" = is-active ] && echo active\n' if tool == "systemctl" else "")
                + "exit 0\n"
            )
            fake.chmod(0o755)
        self.env_file = tmp_path / "x.env"
        self.env_file.write_text("VLLM_API_KEY=instance-key-0123456789\n")

    def configure(self, url, **conf):
        base = {
            "instance": "x",
            "health_url": url + "/health",
            "health_failures": 2,
            "env_file": str(self.env_file),
            "served_model": "meta-llama/Llama-3.1-8B",
            "start_timeout": 30,
            "stop_timeout": 5,
            "container_name": "tt-serve-x",
            "model": "Llama-3.1-8B",
            "device": "n150",
            "port": int(url.rsplit(":", 1)[1]),
        }
        base.update(conf)
        (self.etc / "x.conf").write_text(json.dumps(base))

    def run(self, *args, timeout=60, env=None):
        """``python3 ttfleet-serve ARGS``; returns rc, stderr, stdout, seconds, peak RSS of the wrapper."""
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, PYTHON, str(self.script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, PATH=f"{self.bin}:{os.environ['PATH']}", **(env or {})),
            check=False,
        )
        seconds = time.monotonic() - start
        peak = float(re.search(r"@@peak_rss_mib=([\d.]+)", proc.stderr).group(1))
        return {"rc": proc.returncode, "err": proc.stderr, "out": proc.stdout, "seconds": seconds, "peak": peak}

    def failures(self):
        counter = self.run_dir / "x.failures"
        return int(counter.read_text()) if counter.exists() else 0

    def restarts(self):
        if not self.calls.exists():
            return 0
        return self.calls.read_text().count("systemctl restart --no-block tt-serve@x.service")


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def healthy(conn, req, srv):
    body = b'{"status":"ok"}'
    send(conn, http_head(200, {"Content-Type": "application/json"}, len(body)) + body)


def not_http(conn, req, srv):
    send(conn, b"SSH-2.0-OpenSSH_9.6\r\n\x1b]0;owned\x07\x1b[2Jfatal: forged\r\n")


def ends_early(conn, req, srv):
    send(conn, http_head(200, length=1000) + b'{"status":')


def huge_undeclared(conn, req, srv):
    send(conn, http_head(200)) and endless(conn, chunk=b"x" * 65536, stop=srv.stop, limit=HUGE)


def huge_declared(conn, req, srv):
    send(conn, http_head(200, length=HUGE)) and endless(conn, chunk=b"x" * 65536, stop=srv.stop, limit=HUGE)


# Both drip for over a minute, well inside every stall limit (2 s and up), so only an overall limit can end them.
def dripping(conn, req, srv):
    drip(conn, long_head(200, length=2) + b"ok", stop=srv.stop)


def body_drip(conn, req, srv):
    send(conn, http_head(200, length=512)) and drip(conn, b"x" * 512, stop=srv.stop)


def silent(conn, req, srv):
    srv.stop.wait(60)


@pytest.mark.parametrize("script", [not_http, ends_early], ids=["not-http", "ends-early"])
def test_a_protocol_error_is_a_failed_check_counted_toward_the_restart(hostile, host, script):
    server = hostile(script)
    host.configure(server.url)

    first = host.run("health", "x")
    assert first["rc"] == 0, first["err"]
    assert "Traceback" not in first["err"]
    assert (host.failures(), host.restarts()) == (1, 0), first["err"]
    assert "failed:" in first["err"] and "(1 of 2 failures in a row)" in first["err"]
    # The port's bytes (ESC, OSC, a forged "fatal:" line) reach the journal as escapes.
    assert not any(UNSAFE.search(line) or line.startswith("fatal:") for line in first["err"].splitlines())

    second = host.run("health", "x")
    assert second["rc"] == 0 and "Traceback" not in second["err"]
    assert host.restarts() == 1 and host.failures() == 0, second["err"]
    assert "restarting tt-serve@x.service" in second["err"]
    # At once: not at the 10 s limit of a check.
    for run in (first, second):
        assert run["seconds"] < SLACK


def test_a_whole_200_resets_the_count(hostile, host):
    broken = hostile(not_http)
    host.configure(broken.url)
    host.run("health", "x")
    assert host.failures() == 1
    good = hostile(healthy)
    host.configure(good.url)
    result = host.run("health", "x")
    assert result["rc"] == 0 and host.failures() == 0 and host.restarts() == 0, result["err"]


@pytest.mark.parametrize("script", [huge_undeclared, huge_declared], ids=["undeclared", "declared"])
def test_a_256_mib_health_body_is_cut_at_64_kib(hostile, host, script):
    server = hostile(script)
    host.configure(server.url, health_failures=1)
    result = host.run("health", "x")
    assert result["rc"] == 0 and "Traceback" not in result["err"], result["err"]
    assert host.restarts() == 1, result["err"]
    assert "65536-byte cap" in result["err"]
    # The wrapper alone is ~10-20 MiB; reading the body whole took 276 MiB.
    assert result["peak"] < 48, result
    assert result["seconds"] < 10


@pytest.mark.parametrize(
    ("script", "limit"),
    [(dripping, None), (body_drip, 3)],
    ids=["head-default-limit", "body"],
)
def test_a_dripping_answer_fails_within_the_check_deadline(hostile, host, script, limit):
    server = hostile(script)
    conf = {"health_timeout": limit} if limit else {}  # without one, the wrapper's HEALTH_TIMEOUT: 10 s
    host.configure(server.url, health_failures=1, **conf)
    result = host.run("health", "x")
    assert result["rc"] == 0 and "Traceback" not in result["err"], result["err"]
    assert host.restarts() == 1, result["err"]
    assert f"no whole answer within {limit or 10} s" in result["err"]
    assert result["seconds"] < (limit or 10) + SLACK, result


def test_a_silent_port_fails_at_the_stall_limit(hostile, host):
    server = hostile(silent)
    host.configure(server.url, health_failures=1, health_timeout=30)
    result = host.run("health", "x")
    assert host.restarts() == 1, result["err"]
    assert "stalled: no data for 5 s" in result["err"]
    assert result["seconds"] < 5 + SLACK, result


def test_a_closed_port_is_a_failed_check(host):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    host.configure(f"http://127.0.0.1:{port}", health_failures=1)
    result = host.run("health", "x")
    assert result["rc"] == 0 and host.restarts() == 1 and "ConnectionRefusedError" in result["err"]


def _router(models):
    """/health answers 200; /v1/models runs ``models``."""

    def script(conn, req, srv):
        if req is not None and req.path == "/v1/models":
            models(conn, req, srv)
        else:
            healthy(conn, req, srv)

    return script


def test_ready_sends_the_key_to_the_instance_only_and_follows_no_redirect(hostile, host, catcher):
    server = hostile(_router(lambda conn, req, srv: send(conn, http_head(302, {"Location": catcher.url + "/x"}, 0))))
    host.configure(server.url)
    result = host.run("ready", "x", "5")
    assert result["rc"] == 1 and "answered 302" in result["err"], result["err"]
    assert catcher.requests == []
    models = [req for req in server.requests if req.path == "/v1/models"]
    assert models and models[0].header("authorization") == "Bearer instance-key-0123456789"
    assert all(req.header("authorization") is None for req in server.requests if req.path == "/health")
    assert "instance-key" not in result["err"] + result["out"]


@pytest.mark.parametrize(
    "models",
    [
        huge_undeclared,
        not_http,
        lambda conn, req, srv: send(conn, http_head(200, length=60002) + b"[" * 60000 + b"]]"),
        lambda conn, req, srv: send(conn, http_head(200, length=11) + b'{"data": 5}'),
    ],
    ids=["256-mib", "not-http", "deep-json", "data-not-a-list"],
)
def test_ready_refuses_a_broken_model_list_in_bounds(hostile, host, models):
    server = hostile(_router(models))
    host.configure(server.url)
    result = host.run("ready", "x", "5")
    assert result["rc"] == 1 and "Traceback" not in result["err"], result["err"]
    assert "expected meta-llama/Llama-3.1-8B" in result["err"]
    assert result["peak"] < 48 and result["seconds"] < 10, result


def test_ready_gives_up_at_its_timeout_on_a_dripping_health(hostile, host):
    server = hostile(dripping)
    host.configure(server.url)
    result = host.run("ready", "x", "3")
    assert result["rc"] == 1 and "not 200, within 3 s" in result["err"], result["err"]
    assert result["seconds"] < 3 + SLACK, result


def _notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(0.1)
    return sock, path


def _messages(sock):
    found = []
    while True:
        try:
            found.append(sock.recv(4096).decode())
        except OSError:
            return found


def test_start_extends_the_unit_timeout_to_its_own_and_reports_ready(hostile, host, tmp_path):
    server = hostile(healthy)
    sleeper = [sys.executable, "-c", "import time; time.sleep(1)"]
    host.configure(server.url, argv=sleeper, start_timeout=3600, stop_timeout=60)
    sock, path = _notify_socket(tmp_path)
    with sock:
        result = host.run("start", "x", env={"NOTIFY_SOCKET": path})
        messages = _messages(sock)
    assert result["rc"] == 0, result["err"]
    assert messages[0].startswith(f"EXTEND_TIMEOUT_USEC={(3600 + 60 + 60) * 1_000_000}\n"), messages
    assert any(message.startswith("READY=1") for message in messages), messages


def test_start_on_a_dripping_health_fails_at_the_start_timeout(hostile, host, tmp_path):
    server = hostile(dripping)
    sleeper = [sys.executable, "-c", "import time; time.sleep(5)"]
    host.configure(server.url, argv=sleeper, start_timeout=2, stop_timeout=1)
    sock, path = _notify_socket(tmp_path)
    with sock:
        result = host.run("start", "x", env={"NOTIFY_SOCKET": path})
        messages = _messages(sock)
    assert result["rc"] == 1 and "did not answer 200 within 2 s" in result["err"], result["err"]
    assert not any("READY=1" in message for message in messages)
    assert "docker stop --time 1 tt-serve-x" in host.calls.read_text()
    # The probes end at the start timeout; then the (fake) docker stop and the container's own exit at 5 s.
    assert result["seconds"] < 5 + SLACK, result


def _unit(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as handle:
        return handle.read()


def test_units_that_probe_have_a_finite_start_timeout():
    with open(WRAPPER, encoding="utf-8") as handle:
        text = handle.read()
    constants = {
        name: float(value) for name, value in re.findall(r"^([A-Z_]+) = ([\d.]+)(?:  #.*)?$", text, re.M) if value
    }
    assert "MAX_HEALTH_BYTES = 64 * 1024" in text and MAX_HEALTH_BYTES == 64 * 1024
    health = re.search(r"^TimeoutStartSec=(\d+)$", _unit("tt-serve-health@.service.j2"), re.M)
    assert health, "the oneshot health check has no finite TimeoutStartSec"
    # Longer than the wrapper's own worst case, so the wrapper counts the failure before systemd kills it.
    worst = constants["HEALTH_TIMEOUT"] + 2 * constants["SYSTEMCTL_TIMEOUT"]
    assert worst < int(health.group(1)) <= 120
    serve = re.search(r"^TimeoutStartSec=(\S+)$", _unit("tt-serve@.service.j2"), re.M)
    assert serve and serve.group(1).isdigit(), "tt-serve@ needs a finite TimeoutStartSec (the wrapper extends it)"


# --- fleet_status: one broken port, one healthy --------------------------------------------------------------------


def _systemctl(argv, **kwargs):
    out = "ActiveState=active\nSubState=running\nNRestarts=0\nUnitFileState=enabled\nActiveEnterTimestamp=x\n"
    return subprocess.CompletedProcess(argv, 0, out, "")


def _state(tmp_path, **ports):
    state = tmp_path / "state"
    state.mkdir()
    for name, url in ports.items():
        (state / f"{name}.json").write_text(json.dumps({"model": name, "health_url": url + "/health"}))
    return state


def redirect_to(target):
    return lambda conn, req, srv: send(conn, http_head(302, {"Location": target + "/health"}, 0))


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (not_http, "broke the HTTP protocol"),
        (ends_early, "broke the HTTP protocol"),
        (huge_undeclared, "passed the 65536-byte cap"),
        (huge_declared, "above the 65536-byte cap"),
        (dripping, "did not finish within its 2 s limit"),
        (body_drip, "did not finish within its 2 s limit"),
        # The stall limit is the whole timeout here: the one that fires first is left to scheduling, either is right.
        (silent, r"stalled: no data for 2(\.0)? s|did not finish within its 2 s limit"),
    ],
    ids=["not-http", "ends-early", "256-mib", "256-mib-declared", "drip-head", "drip-body", "silent"],
)
def test_one_broken_port_makes_only_its_instance_unhealthy(hostile, tmp_path, script, reason):
    good, broken = hostile(healthy), hostile(script)
    state = _state(tmp_path, good=good.url, broken=broken.url)
    start = time.monotonic()
    report = _status.host_report(str(state), str(tmp_path / "none"), timeout=2, runner=_systemctl)
    # The broken port drips or stays silent for a minute; its probe ends at its 2 s limit.
    assert time.monotonic() - start < 2 + SLACK
    assert report["instance_count"] == 2 and report["unhealthy"] == ["broken"]
    bad, fine = report["instances"]
    assert fine["healthy"] and fine["health"]["status"] == "healthy" and fine["health"]["code"] == 200
    assert bad["health"]["status"] == "unhealthy" and not bad["healthy"]
    assert re.search(reason, bad["health"]["error"]), bad["health"]
    assert not UNSAFE.search(bad["health"]["error"])
    assert bad["health"]["seconds"] < 2 + SLACK


def test_probe_sends_no_credential_and_follows_no_redirect(hostile, catcher, tmp_path):
    good, away = hostile(healthy), hostile(redirect_to(catcher.url))
    state = _state(tmp_path, good=good.url, away=away.url)
    report = _status.host_report(str(state), str(tmp_path / "none"), timeout=2, runner=_systemctl)
    assert report["unhealthy"] == ["away"]
    assert report["instances"][0]["health"]["code"] == 302
    assert catcher.requests == []
    assert all(req.header("authorization") is None for req in good.requests + away.requests)


def test_net_keeps_the_deadline_armed_while_a_closing_answer_drips_its_body(hostile):
    # http.client closes a "Connection: close" connection once the headers are in; the watchdog must outlive that.
    server = hostile(body_drip)
    # The stall limit is far above the overall one: with the watchdog disarmed, the read would wait for the whole
    # 512-byte body (100 s), not end at 2 s.
    deadline = Deadline(total=2, stall=30, what="the answer")
    start = time.monotonic()
    with (
        pytest.raises(NetError, match=r"did not finish within its 2 s limit|broke the HTTP protocol"),
        open_url(server.url + "/x", deadline) as resp,
    ):
        read_capped(resp, 1024, "the body", server.url, deadline)
    assert time.monotonic() - start < 2 + SLACK
    assert deadline.expired


def test_probe_of_a_closed_port_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = _status.probe(f"http://127.0.0.1:{port}/health", 2)
    assert result["status"] == "unreachable" and "ConnectionRefusedError" in result["error"]


def test_fleet_status_memory_stays_bounded_on_a_256_mib_health_body(hostile, tmp_path):
    broken = hostile(huge_undeclared)
    state = _state(tmp_path, broken=broken.url)
    code = (
        "import json, subprocess\n"
        "from ansible_collections.ttfleet.inference.plugins.module_utils._plan import status as _status\n"
        "def runner(argv, **kw):\n"
        "    return subprocess.CompletedProcess(argv, 0, 'ActiveState=active\\n', '')\n"
        f"report = _status.host_report({str(state)!r}, '/nonexistent', timeout=10, runner=runner)\n"
        "print(json.dumps(report['unhealthy']))\n"
    )
    result = run_bounded(code)
    assert result["rc"] == 0, result["err"]
    assert json.loads(result["out"].strip().splitlines()[-1]) == ["broken"]
    assert result["peak_rss_mib"] < baseline_rss_mib() + 16, result


# --- the operator's terminal and the HTML report ------------------------------------------------------------------

HOSTILE = "\x1b]0;owned\x07\x1b[2J\nfatal: forged\r\u202e\x9b[31m"
MARK = "PWNB\"'<>&<script>alert(1)</script><img src=x onerror=alert(1)>PWNE"


def test_status_lines_escape_terminal_controls():
    rows = [
        {
            "host": "qb2" + HOSTILE,
            "device_type": HOSTILE,
            "release": HOSTILE,
            "reachable": True,
            "instances": [
                {
                    "instance": "i" + HOSTILE,
                    "port": HOSTILE,
                    "unit": {"active_state": HOSTILE},
                    "health": {"status": "unhealthy" + HOSTILE},
                    "volume": {"path": "/v/vol" + HOSTILE, "is_alias": True, "alias_of": "/h/other" + HOSTILE},
                },
                "not a mapping",
                {"volume": {"path": 7, "weights_from": ["x"]}, "unit": "x", "health": None},
            ],
        },
        {"host": HOSTILE, "reachable": False},
        "not a row",
    ]
    lines = tt_status_lines(rows)
    assert len(lines) == 1 + 3 + 1 + 1
    for line in lines:
        assert not UNSAFE.search(line), repr(line)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\nfatal: forged\\r\\u202e\\x9b[31m" in lines[1]
    assert not any(line.startswith("fatal:") for line in lines)


@pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason="ansible-playbook is not installed")
def test_html_report_escapes_every_field_from_the_hosts(tmp_path):
    instance = {
        "instance": MARK,
        "model": MARK,
        "port": MARK,
        "healthy": False,
        "unit": {"active_state": MARK, "restarts": MARK},
        "health": {"status": MARK, "code": MARK, "error": MARK},
        "volume": {
            "path": "/v/" + MARK,
            "type": MARK,
            "is_alias": True,
            "alias_of": MARK,
            "weights": {"revision": MARK, "usable": True, "verified": MARK},
            "kernel_cache_meshes": [MARK, MARK],
        },
    }
    second = dict(instance, volume=dict(instance["volume"], is_alias=False, weights_from=MARK))
    rows = [
        {
            "host": MARK,
            "reachable": True,
            "device_type": MARK,
            "boards": {MARK: MARK},
            "firmware": MARK,
            "kmd": MARK,
            "release": MARK,
            "instances": [instance, second],
        },
        {"host": MARK, "reachable": True, "device_type": MARK, "boards": {}, "release": MARK, "instances": []},
        {"host": MARK, "reachable": False, "device_type": MARK, "boards": {}, "instances": []},
    ]
    (tmp_path / "vars.json").write_text(json.dumps({"__status_rows": rows, "__status_unreachable": [MARK]}))
    out = tmp_path / "fleet-status.html"
    template = os.path.join(ROOT, "playbooks", "templates", "fleet-status.html.j2")
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.template:\n        src: {template}\n        dest: {out}\n        mode: '0644'\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            f"@{tmp_path / 'vars.json'}",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    html = out.read_text()
    assert "<img" not in html and "<script>alert" not in html and "onerror=alert(1)>" not in html
    found = re.findall(r"PWNB(.*?)PWNE", html)
    # Every field of every row: host, device, boards, firmware, KMD, release, instance, model, unit, restarts, health,
    # code, error (a title attribute), port, volume, alias, revision, verified, kernel cache, hardlink source.
    assert len(found) >= 40, len(found)
    for inner in found:
        assert not re.search(r"[<>\"']", inner), inner
    classes = re.findall(r'class="([^"]*)"', html)
    assert classes and all(re.fullmatch(r"[a-z0-9_ -]*", value) for value in classes), classes
    assert '<tr class="pwnbscriptalert1scriptimgsrcxonerroralert1pwne">' in html
