"""Fixtures of the fault-injection suite: lab hosts of our own, the lab's HF mirror, playbook runs, the results table.

Lab hosts are systemd containers started with tests/lab/lab.py's functions (never `lab.py up`, which removes other
lab containers), named ft-<device>-<n>, on a Docker network of their own (ft-faults), with an inventory under
tests/output/faults/inventory that takes the lab inventory's group_vars. Everything started here is removed at the
end of the session, also when a case fails.

    pytest tests/faults                     the fast half (what `tests/run-tests.sh faults` runs)
    TTFLEET_FAULTS=all pytest tests/faults  every case, and docs/faults.md rewritten (`make faults`)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))

import lab as labmod  # tests/lab/lab.py, imported for its functions

OUT = os.path.join(ROOT, "tests", "output", "faults")
INVENTORY = os.path.join(OUT, "inventory")
LOGS = os.path.join(OUT, "logs")
VARS = os.path.join(OUT, "vars")
FACT_CACHE = os.path.join(OUT, "fact-cache")
MIRROR_STATE = os.path.join(OUT, "mirror")
PLAYBOOKS = os.path.join(ROOT, "tests", "faults", "playbooks")
DOC = os.path.join(ROOT, "docs", "faults.md")
NETWORK = "ft-faults"
PREFIX = "ft-"
BIN = os.path.dirname(sys.executable)
SPEC_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "specs")
HOST_SPEC = "/var/tmp/ttfleet-spec/release_model_spec.json.gz"
# The TCP send buffers of every host of the suite (min, default, max): small enough that killing a server cuts its
# transfers (tests/faults/test_faults.py, shape_link), and far above what an unshaped lab bridge needs.
HOST_WMEM = "4096 16384 65536"
MODEL_REPO = "meta-llama/Llama-3.2-1B-Instruct"
GATED_REPO = "meta-llama/Llama-3.2-1B"
ALL = os.environ.get("TTFLEET_FAULTS", "") == "all"
STARTED = time.monotonic()

RESULTS = []


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: a case of the fault-injection suite (tests/faults)")
    config.addinivalue_line(
        "markers", "slow: a fault case that needs a served fleet or minutes of its own; runs with TTFLEET_FAULTS=all"
    )
    config.addinivalue_line("markers", "case(name): the row name of a fault case in docs/faults.md")


def pytest_collection_modifyitems(config, items):
    # The token-leak scan reads the logs of every case before it, whichever file holds them: it runs last.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("case") is not None
            and item.get_closest_marker("case").args[:1] == ("token-leak scan",)
        )
    )
    if ALL:
        return
    skip = pytest.mark.skip(reason="slow fault case: run with TTFLEET_FAULTS=all (make faults)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------
# Helpers


def log(msg):
    print(f"[faults {time.monotonic() - STARTED:6.0f} s] {msg}", file=sys.stderr, flush=True)


def sh(*argv, check=True, stdin=None, timeout=600):
    proc = subprocess.run(list(argv), check=False, text=True, capture_output=True, input=stdin, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc


def host_sh(host, script, check=True, timeout=600):
    """Run a shell script on a lab host as root."""
    return sh("docker", "exec", "-i", host, "sh", "-c", script, check=check, timeout=timeout)


def write_private(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(data)


class Run:
    """One finished ansible-playbook run: return code, combined output, the log it was saved to."""

    def __init__(self, name, rc, out, path, seconds):
        self.name, self.rc, self.out, self.path, self.seconds = name, rc, out, path, seconds

    def failures(self):
        """``[(host, result dict)]`` of every failed task (the json result format keeps each on one line)."""
        found = []
        for match in re.finditer(r"^(?:fatal|failed): \[([^\]]+)\].*?=> (\{.*\})\s*$", self.out, re.M):
            with contextlib.suppress(ValueError):
                found.append((match.group(1), json.loads(match.group(2))))
        return found

    def messages(self):
        """Every failure message of the run, items of loops included, as one string per failure."""
        texts = []
        for _host, result in self.failures():
            parts = [str(result.get("msg", ""))]
            for item in result.get("results") or []:
                if isinstance(item, dict) and item.get("failed"):
                    parts.append(str(item.get("msg", "")))
            texts.append(" ".join(part for part in parts if part))
        return texts

    def recap(self):
        """``{host: {ok, changed, unreachable, failed, ...}}`` from PLAY RECAP."""
        hosts = {}
        for match in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", self.out, re.M):
            hosts[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
        return hosts


def _ansible_env():
    return dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_CACHE_PLUGIN="jsonfile",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=FACT_CACHE,
        ANSIBLE_RETRY_FILES_ENABLED="0",
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )


def playbook_argv(name, playbook, extra=None, limit=None, verbose=False, check=False):
    """argv of one run; extra vars go through a 0600 file (secrets never on a command line)."""
    vars_file = os.path.join(VARS, f"{name}.json")
    write_private(vars_file, json.dumps(extra or {}, indent=1))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, playbook, "-e", f"@{vars_file}"]
    if limit:
        argv += ["--limit", limit]
    if verbose:
        argv.append("-v")
    if check:
        argv += ["--check", "--diff"]
    return argv


def run_playbook(name, playbook, extra=None, limit=None, verbose=False, timeout=1800, check=False):
    os.makedirs(LOGS, exist_ok=True)
    path = os.path.join(LOGS, f"{name}.log")
    start = time.monotonic()
    log(f"ansible-playbook {os.path.relpath(playbook, ROOT)} ({name})")
    with open(path, "w", encoding="utf-8") as handle:
        proc = subprocess.run(
            playbook_argv(name, playbook, extra, limit, verbose, check),
            cwd=ROOT,
            env=_ansible_env(),
            text=True,
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=timeout,
        )
    with open(path, encoding="utf-8") as handle:
        out = handle.read()
    seconds = time.monotonic() - start
    log(f"  -> rc {proc.returncode} in {seconds:.0f} s, log {os.path.relpath(path, ROOT)}")
    return Run(name, proc.returncode, out, path, seconds)


def start_playbook(name, playbook, extra=None, limit=None):
    """Start a run in the background (its own process group, so that a case can interrupt it)."""
    os.makedirs(LOGS, exist_ok=True)
    path = os.path.join(LOGS, f"{name}.log")
    handle = open(path, "w", encoding="utf-8")  # noqa: SIM115  (closed by finish_playbook)
    log(f"ansible-playbook {os.path.relpath(playbook, ROOT)} ({name}, background)")
    proc = subprocess.Popen(
        playbook_argv(name, playbook, extra, limit),
        cwd=ROOT,
        env=_ansible_env(),
        text=True,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proc.ft_log, proc.ft_handle, proc.ft_name, proc.ft_start = path, handle, name, time.monotonic()
    return proc


def finish_playbook(proc, timeout=600, kill=False):
    """Wait for a background run (or end it: SIGTERM, then SIGKILL, to its own process group)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15 if kill else timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    proc.ft_handle.close()
    with open(proc.ft_log, encoding="utf-8") as handle:
        out = handle.read()
    return Run(proc.ft_name, proc.returncode, out, proc.ft_log, time.monotonic() - proc.ft_start)


def read_log(path):
    """JSON lines of a counting proxy log."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def file_gets(entries):
    """Bytes relayed per file path of ``GET .../resolve/<sha>/<path>`` requests."""
    per_file = {}
    for entry in entries:
        match = re.match(r"^/[^/]+/[^/]+/resolve/[0-9a-f]{40}/(.+?)(?:\?.*)?$", entry["path"])
        if entry["method"] == "GET" and match:
            per_file[match.group(1)] = per_file.get(match.group(1), 0) + entry["bytes"]
    return per_file


def start_proxy(script, name, args):
    """Start a proxy of tests/ (counting_proxy.py or gated_hub.py) on the network's gateway; return (pid, url)."""
    out_path = os.path.join(OUT, f"{name}.out")
    pidfile = os.path.join(OUT, f"{name}.pid")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, script, *args, "--pidfile", pidfile],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    for _attempt in range(100):
        with open(out_path, encoding="utf-8") as handle:
            url = handle.readline().strip()
        if url.startswith("http://"):
            return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{name} did not start; see {out_path}")


# ---------------------------------------------------------------------------
# Results table


class Case:
    """What a case expects and what it observed; the pass column comes from the test's own outcome."""

    def __init__(self, name):
        self.name = name
        self.expected = ""
        self.observed = ""
        self.details = {}
        self.started = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    case = getattr(item, "ft_case", None)
    if case is None or report.when != "call":
        if case is not None and report.when == "setup" and report.failed:
            RESULTS.append(_row(case, False, f"setup failed: {str(report.longrepr)[-300:]}"))
        return
    observed = case.observed
    if report.failed and call.excinfo is not None:
        observed = f"{observed} FAILED: {' '.join(str(call.excinfo.value).split())[:400]}".strip()
    RESULTS.append(_row(case, report.passed, observed))


def _row(case, passed, observed):
    return {
        "case": case.name,
        "expected": case.expected,
        "observed": observed,
        "pass": bool(passed),
        "seconds": round(time.monotonic() - case.started, 1),
        "details": case.details,
    }


@pytest.fixture
def case(request):
    """The row of this case in the results table; set ``expected`` and ``observed``."""
    marker = request.node.get_closest_marker("case")
    name = marker.args[0] if marker else request.node.name
    if hasattr(request.node, "callspec"):
        name = f"{name} ({request.node.callspec.id})"
    request.node.ft_case = Case(name)
    return request.node.ft_case


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def pytest_sessionfinish(session, exitstatus):
    if not RESULTS:
        return
    os.makedirs(OUT, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{socket.gethostname()}, {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    wall = time.monotonic() - STARTED
    half = "all cases (TTFLEET_FAULTS=all)" if ALL else "fast half (pytest -m 'faults and not slow')"
    data = {"generated_at": now, "machine": machine, "selection": half, "wall_seconds": round(wall), "cases": RESULTS}
    with open(os.path.join(OUT, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
    lines = [
        "# Fault-injection results",
        "",
        "<!-- Generated by tests/faults (TTFLEET_FAULTS=all pytest tests/faults, or make faults); do not edit. -->",
        "",
        f"Generated {now} on {machine}: {half}, {len(RESULTS)} cases in {wall:.0f} s "
        f"({sum(r['pass'] for r in RESULTS)} passed). Each case injects the fault for real on lab hosts "
        "(systemd containers with simulated boards, tests/lab) and runs the real playbook or role; JSON with the "
        "measurements in `tests/output/faults/results.json`.",
        "",
        "| case | expected | observed | pass |",
        "|---|---|---|---|",
    ]
    for row in RESULTS:
        lines.append(
            f"| {_cell(row['case'])} | {_cell(row['expected'])} | {_cell(row['observed'])} | "
            f"{'yes' if row['pass'] else '**no**'} |"
        )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "faults.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    if ALL:
        with open(DOC, "w", encoding="utf-8") as handle:
            handle.write(text)


# ---------------------------------------------------------------------------
# The lab of the suite


def _remove_containers():
    names = sh("docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
    for name in names:
        if name.startswith(PREFIX) and re.match(r"^ft-[a-z0-9]+-\d+$", name):
            sh("docker", "rm", "-f", name, check=False)
            shutil.rmtree(labmod.host_docker_dir(name), ignore_errors=True)


def _kill_pidfile(path):
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        with open(path, encoding="utf-8") as handle:
            pid = int(handle.read().strip())
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _write_inventory(hosts):
    groups = {}
    for name, device in hosts.items():
        groups.setdefault(device, []).append(name)
    # The suite reaches its hosts through `docker exec` as root (molecule fleet and upgrade cover SSH with sudo).
    lines = [
        "---",
        "# Written by tests/faults/conftest.py for the fault suite's lab hosts.",
        "all:",
        "  vars:",
        "    ansible_connection: community.docker.docker",
        "  children:",
    ]
    for device, names in sorted(groups.items()):
        lines += [f"    {device}:", "      hosts:"] + [f"        {name}:" for name in sorted(names)]
    with open(os.path.join(INVENTORY, "hosts.yml"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


class Lab:
    """The suite's lab: hosts, mirror endpoints, the secret the gated repository wants."""

    def __init__(self):
        self.hosts = {}
        self.image = None
        self.mirror = {}
        self.models = {}
        self.procs = []
        self.secrets = []

    def add_host(self, name, device):
        self._start(name, device)
        self.hosts[name] = device
        _write_inventory(self.hosts)

    def add_hosts(self, devices):
        """Start and provision several hosts side by side (``{name: device}``), then add them to the inventory."""
        with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
            for future in [pool.submit(self._start, name, device) for name, device in devices.items()]:
                future.result()
        self.hosts.update(devices)
        _write_inventory(self.hosts)

    def _start(self, name, device):
        log(f"starting {name} ({device})")
        labmod.start_host(name, device, self.image, sysctls=(f"net.ipv4.tcp_wmem={HOST_WMEM}",))
        labmod.provision(name, device)
        host_sh(name, f"mkdir -p {os.path.dirname(HOST_SPEC)}")
        sh("docker", "cp", os.path.join(SPEC_FIXTURES, "release_model_spec-v0.20.0.json.gz"), f"{name}:{HOST_SPEC}")

    def remove_hosts(self, names):
        """Take hosts out of the inventory and remove their containers, so that later cases see the lab as before."""
        for name in names:
            self.hosts.pop(name, None)
            sh("docker", "rm", "-f", name, check=False)
        _write_inventory(self.hosts)

    @property
    def origin_log(self):
        return os.path.join(MIRROR_STATE, "origin.jsonl")

    @property
    def slow_log(self):
        return os.path.join(OUT, "slow.jsonl")


@pytest.fixture(scope="session")
def lab():
    """One n150 lab host (ft-n150-1), the lab HF mirror behind its byte counter, a slow and a gated endpoint."""
    subprocess.run([os.path.join(ROOT, "tests", "lab", "ensure-docker.sh")], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(OUT, ignore_errors=True)
    for path in (INVENTORY, LOGS, VARS, FACT_CACHE):
        os.makedirs(path, exist_ok=True)
    # The lab inventory's group_vars, without the vars file of the lead's mirror: ours is written below.
    shutil.copytree(
        os.path.join(ROOT, "inventories", "lab", "group_vars"),
        os.path.join(INVENTORY, "group_vars"),
        ignore=shutil.ignore_patterns("zz_*"),
    )
    labmod.NETWORK = NETWORK  # start_host puts hosts on lab.NETWORK: ours, not the lead's ttfleet-lab
    the_lab = Lab()
    _remove_containers()
    try:
        the_lab.image = labmod.ensure_image()
        if sh("docker", "network", "inspect", NETWORK, check=False).returncode != 0:
            sh("docker", "network", "create", "--label", "ttfleet.faults", NETWORK)
        labmod.ensure_ttis_repo()
        the_lab.add_host("ft-n150-1", "n150")
        vars_file = os.path.join(INVENTORY, "group_vars", "all", "zz_faults_mirror.yml")
        out = sh(
            sys.executable,
            os.path.join(ROOT, "tests", "lab", "hf_mirror.py"),
            "start",
            "--state",
            MIRROR_STATE,
            "--vars-file",
            vars_file,
            "--network",
            NETWORK,
            "--repo",
            MODEL_REPO,
            "--repo",
            GATED_REPO,
        ).stdout
        the_lab.mirror = json.loads(out.strip().splitlines()[-1])
        with open(os.path.join(MIRROR_STATE, "models.json"), encoding="utf-8") as handle:
            the_lab.models = json.load(handle)
        host = the_lab.mirror["origin"].split("//")[1].rsplit(":", 1)[0]
        proc, the_lab.slow_endpoint = start_proxy(
            os.path.join(ROOT, "tests", "tools", "counting_proxy.py"),
            "slow",
            [
                "--listen",
                f"{host}:0",
                "--upstream",
                the_lab.mirror["origin"],
                "--log",
                the_lab.slow_log,
                "--rate",
                "131072",
            ],
        )
        the_lab.procs.append(proc)
        token = "hf_" + secrets.token_urlsafe(24)
        the_lab.secrets.append(token)
        the_lab.hf_token = token
        write_private(os.path.join(OUT, "gated-token"), token)
        proc, the_lab.gated_endpoint = start_proxy(
            os.path.join(ROOT, "tests", "faults", "gated_hub.py"),
            "gated",
            [
                "--listen",
                f"{host}:0",
                "--upstream",
                the_lab.mirror["endpoint"],
                "--gated",
                GATED_REPO,
                "--token-file",
                os.path.join(OUT, "gated-token"),
            ],
        )
        the_lab.procs.append(proc)
        yield the_lab
    finally:
        log("removing the suite's lab hosts, mirror and proxies")
        for proc in the_lab.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for name in ("slow.pid", "gated.pid"):
            _kill_pidfile(os.path.join(OUT, name))
        sh(
            sys.executable,
            os.path.join(ROOT, "tests", "lab", "hf_mirror.py"),
            "stop",
            "--state",
            MIRROR_STATE,
            "--vars-file",
            os.path.join(INVENTORY, "group_vars", "all", "zz_faults_mirror.yml"),
            check=False,
        )
        _remove_containers()
        sh("docker", "network", "rm", NETWORK, check=False)
