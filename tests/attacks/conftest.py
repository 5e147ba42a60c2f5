"""The attacker suite: a hostile local user (uid 1000, a real unprivileged process through setpriv) against the
root-run modules of the collection, on real directories (issue 13, docs/security.md).

Each module runs as Ansible runs it without the controller: ``python <checkout>/plugins/modules/<name>.py
<args.json>`` with ``{"ANSIBLE_MODULE_ARGS": {...}}``, as root, with the collections tree on PYTHONPATH; the JSON
result is read from stdout. Every test gets an arena under /var/tmp (reachable by uid 1000, unlike pytest's
tmp_path): a root-owned 0600 victim file and a root-only victim directory outside the volumes, a volume root and a
volume owned by 1000 (the hostile layout: a tree the attacker prepared before the first run), and a root-only
``private`` directory for arguments, stores and run directories. Tests assert that the victims keep their content,
owner, mode and link count and that no module blocks past its timeout.

TTFLEET_ATTACK_CHECKOUT points the suite at another checkout (default: this one), for example the code before a
fix; the interpreter is TTFLEET_ATTACK_PYTHON or the one running pytest.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import typing
import urllib.parse
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHECKOUT = Path(os.environ.get("TTFLEET_ATTACK_CHECKOUT") or HERE.parents[1]).resolve()
PYTHON = os.environ.get("TTFLEET_ATTACK_PYTHON") or sys.executable
COLLECTIONS = CHECKOUT / ".ansible" / "collections"
UID = GID = 1000
TIMEOUT = 20
VOLUME_NAME = "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
MODEL = "Qwen3-32B"
MESH = "P300x2"
ATTACKER_SOURCE = (HERE / "attacker.py").read_text(encoding="utf-8")


def pytest_configure(config):
    config.addinivalue_line("markers", "broke(n): a case of issue 13 that broke the code before the fix")
    config.addinivalue_line("markers", "held: a case of issue 13 that held before the fix and must keep holding")
    config.addinivalue_line("markers", "broke29(n): a case of issue 29 that broke the code before the fix")
    config.addinivalue_line(
        "markers", "finding: an attack found while writing this suite that broke the code before the fix"
    )


def pytest_report_header(config):
    return f"attacks against {CHECKOUT} with {PYTHON}"


# A per-case summary for the before/after proof: TTFLEET_ATTACK_SUMMARY=<file> writes one line per test.
_CASES = {}
_OUTCOMES = {}


def pytest_collection_modifyitems(items):
    for item in items:
        broke = item.get_closest_marker("broke")
        broke29 = item.get_closest_marker("broke29")
        if item.get_closest_marker("finding"):
            _CASES[item.nodeid] = "finding"
        elif broke29:
            _CASES[item.nodeid] = f"29/{broke29.args[0]}"
        elif broke:
            _CASES[item.nodeid] = f"broke {broke.args[0]:>2}"
        else:
            _CASES[item.nodeid] = "held" if item.get_closest_marker("held") else "control"


def pytest_runtest_logreport(report):
    if _OUTCOMES.get(report.nodeid, ("",))[0] in ("FAILED", "ERROR"):
        return
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = (crash.message if crash else str(report.longrepr)).splitlines()[0][:300]
        _OUTCOMES[report.nodeid] = ("FAILED" if report.when == "call" else "ERROR", reason, report.duration)
    elif report.when == "call":
        _OUTCOMES[report.nodeid] = (report.outcome.upper(), "", report.duration)


def pytest_sessionfinish(session):
    target = os.environ.get("TTFLEET_ATTACK_SUMMARY")
    if not target:
        return
    lines = [f"# attacker suite against {CHECKOUT}"]
    for nodeid, case in sorted(_CASES.items(), key=lambda kv: (kv[1], kv[0])):
        outcome, reason, seconds = _OUTCOMES.get(nodeid, ("NOT RUN", "", 0.0))
        name = nodeid.split("::", 1)[1]
        lines.append(f"{case:9} {outcome:7} {seconds:5.1f}s  {name}" + (f"\n{'':25}{reason}" if reason else ""))
    counts = {}
    for outcome, _reason, _seconds in _OUTCOMES.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    lines.append("totals: " + ", ".join(f"{n} {o.lower()}" for o, n in sorted(counts.items())))
    Path(target).write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session", autouse=True)
def _preconditions():
    if os.geteuid() != 0:
        pytest.fail("the attacker suite runs the modules as root: run it as root (CI does)")
    if not (COLLECTIONS / "ansible_collections" / "ttfleet" / "inference" / "plugins").is_dir():
        pytest.fail(f"{COLLECTIONS} lacks ansible_collections/ttfleet/inference: run tests/lab/bootstrap.sh tools")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing")
    if shutil.which("zstd") is None:
        # Kernel caches are .tar.zst; tests/run-tests.sh installs zstd on a machine that lacks it.
        pytest.fail("zstd is missing: apt-get install zstd (tests/run-tests.sh attacks does)")


# ---------------------------------------------------------------------------
# Running modules (root) and the attacker (uid 1000)


class Result(dict):
    """A module's JSON result, plus ``rc``, ``stdout``, ``stderr``, ``seconds`` and ``timed_out``."""

    @property
    def failed(self):
        return bool(self.get("failed")) or self.rc != 0

    def __repr__(self):
        shown = {k: v for k, v in self.items() if k != "invocation"}
        return f"Result(rc={self.rc}, timed_out={self.timed_out}, {shown!r}, stderr={self.stderr[-600:]!r})"


def _kill_group(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def start_module(name, args, workdir, check_mode=False, hold=False):
    """Start a module as root; returns the Popen (stdout/stderr piped) of ``python <module>.py <args file>``.

    With ``hold``, the process waits for a line on its stdin before it execs the module, so its pid (which the
    module keeps) is known before the module runs: ``release(proc)`` lets it go.
    """
    module_args = dict(args)
    if check_mode:
        module_args["_ansible_check_mode"] = True
    fd, args_file = tempfile.mkstemp(prefix=f"{name}-", suffix=".json", dir=workdir)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": module_args}, handle)
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(workdir),
        "PYTHONPATH": str(COLLECTIONS),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = [PYTHON, str(CHECKOUT / "plugins" / "modules" / f"{name}.py"), args_file]
    if hold:
        argv = ["sh", "-c", 'read _ && exec "$@"', "sh", *argv]
    return subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def release(proc):
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush it again


def finish_module(proc, timeout=TIMEOUT, started=None):
    """Wait for a module started by start_module; kills it (and its group) past ``timeout`` seconds."""
    started = time.monotonic() if started is None else started
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    text = out.decode("utf-8", "replace")
    result = Result()
    for line in reversed(text.strip().splitlines() or [""]):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                result.update(data)
                break
    else:
        with contextlib.suppress(ValueError):
            data = json.loads(text)
            if isinstance(data, dict):
                result.update(data)
    result.rc = proc.returncode
    result.stdout = text
    result.stderr = err.decode("utf-8", "replace")
    result.timed_out = timed_out
    result.seconds = time.monotonic() - started
    return result


def run_module(name, args, workdir, timeout=TIMEOUT, check_mode=False):
    started = time.monotonic()
    return finish_module(start_module(name, args, workdir, check_mode), timeout, started)


def attacker_python():
    """A Python uid 1000 can run: the system's (the checkout's venv may sit under a root-only directory)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", PYTHON):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no python3 for the attacker")


def as_attacker(argv):
    return ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", *argv]


def attacker(*argv, cwd="/", timeout=TIMEOUT, check=True):
    """Run a command as uid 1000 and wait for it."""
    proc = subprocess.run(
        as_attacker([str(a) for a in argv]), cwd=cwd, capture_output=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"attacker command {argv} failed: {proc.stderr.decode(errors='replace')}")
    return proc


def attacker_script(command, *args, cwd="/", timeout=TIMEOUT):
    """Run a command of attacker.py as uid 1000 and wait for it."""
    return attacker(attacker_python(), "-I", "-c", ATTACKER_SOURCE, command, *args, cwd=cwd, timeout=timeout)


@contextlib.contextmanager
def attacker_loop(command, *args, cwd="/"):
    """A command of attacker.py running as uid 1000 in the background; stopped (killed) on exit."""
    proc = subprocess.Popen(
        as_attacker([attacker_python(), "-I", "-c", ATTACKER_SOURCE, command, *[str(a) for a in args]]),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        proc.communicate()


def uid1000_reads(path):
    """What uid 1000 gets reading ``path`` (None when it cannot)."""
    proc = attacker("cat", path, check=False)
    return proc.stdout if proc.returncode == 0 else None


# ---------------------------------------------------------------------------
# The arena


def _stat_tuple(path):
    st = os.lstat(path)
    # The link count too: a hardlink of a root-only file inside a volume is a name uid 1000 can hand back to root.
    return (st.st_uid, st.st_gid, st.st_mode, st.st_ino, st.st_nlink)


class Arena:
    """A fresh tree under /var/tmp for one test; see the module docstring."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="ttfleet-attack-", dir="/var/tmp"))
        os.chmod(self.path, 0o755)
        self.secret = f"VICTIM-{secrets.token_hex(12)}"
        self.victim = self.path / "victim"
        self._write_root(self.victim, f"{self.secret} root-only file\n".encode(), 0o600)
        self.victim_dir = self.path / "victim-dir"
        self.victim_dir.mkdir(mode=0o700)
        os.chmod(self.victim_dir, 0o700)
        self._write_root(self.victim_dir / "config.json", f'{{"{self.secret}": "root config"}}\n'.encode(), 0o600)
        self._write_root(self.victim_dir / "secret.txt", f"{self.secret} root-only dir\n".encode(), 0o600)
        self.private = self.path / "private"
        self.private.mkdir(mode=0o700)
        os.chmod(self.private, 0o700)
        self.root = self.path / "tt-cache"
        self.volume = self.root / VOLUME_NAME
        self.home = self.path / "home"  # uid 1000's own directory, for its logs
        for directory in (self.root, self.volume, self.home):
            directory.mkdir(mode=0o755)
            self.give(directory)
        self._victim_state = self.victim_snapshot()
        self.cleanups = []

    @staticmethod
    def _write_root(path, data, mode):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)

    @staticmethod
    def give(path):
        """Hand ``path`` and everything below it to uid 1000 (links themselves, never their targets)."""
        path = str(path)
        os.lchown(path, UID, GID)
        if os.path.isdir(path) and not os.path.islink(path):
            for current, dirs, files in os.walk(path):
                for name in dirs + files:
                    os.lchown(os.path.join(current, name), UID, GID)

    def mkdirs(self, path, owner=UID, mode=0o755):
        """Create ``path`` and its missing parents, owned by ``owner`` (1000: the hostile layout)."""
        path = Path(path)
        missing = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for directory in reversed(missing):
            directory.mkdir(mode=mode)
            os.chmod(directory, mode)
            os.lchown(directory, owner, owner)
        return Path(missing[0]) if missing else path

    def write(self, path, data, owner=UID, mode=0o644):
        path = Path(path)
        self.mkdirs(path.parent, owner)
        if isinstance(data, str):
            data = data.encode()
        path.write_bytes(data)
        os.chmod(path, mode)
        os.lchown(path, owner, owner)
        return path

    def victim_snapshot(self):
        entries = {}
        for path in [self.victim, self.victim_dir, *sorted(self.victim_dir.iterdir())]:
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            entries[path.name] = (_stat_tuple(path), data)
        return entries

    def assert_victims_intact(self):
        now = self.victim_snapshot()
        changed = {
            name: {"before": self._victim_state.get(name), "after": now.get(name)}
            for name in sorted(set(now) | set(self._victim_state))
            if now.get(name) != self._victim_state.get(name)
        }
        assert not changed, f"the victims changed ((uid, gid, mode, inode, links), content): {changed!r}"

    def leaked_to_attacker(self, top):
        """Files under ``top`` that uid 1000 can read and that hold the victims' secret."""
        leaks = []
        for current, _dirs, files in os.walk(top):
            for name in files:
                full = os.path.join(current, name)
                if os.path.islink(full):
                    continue
                try:
                    with open(full, "rb") as handle:
                        if self.secret.encode() not in handle.read(1 << 20):
                            continue
                except OSError:
                    continue
                if uid1000_reads(full) is not None:
                    leaks.append(full)
        return leaks

    def module(self, name, args, timeout=TIMEOUT, check_mode=False):
        return run_module(name, args, self.private, timeout, check_mode)

    def close(self):
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                cleanup()
        _kill_leftovers(str(self.path))
        shutil.rmtree(self.path, ignore_errors=True)


def _kill_leftovers(marker):
    """Kill processes this test started indirectly (a server daemon) whose command line names its arena."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if marker.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


@pytest.fixture
def arena():
    made = Arena()
    try:
        yield made
    finally:
        made.close()


# ---------------------------------------------------------------------------
# Shared builders


def kernel_key(**extra):
    return {
        "model_name": MODEL,
        "mesh": MESH,
        "impl_id": "tt_transformers",
        "tt_metal_commit": "8c48a10",
        "vllm_commit": "f52987a",
        **extra,
    }


def cache_dir(arena):
    return arena.volume / "tt_metal_cache" / f"cache_{MODEL}" / MESH


def weights_manifest(files, repo_id="Qwen/Qwen3-32B", revision="0" * 40):
    """A .ttfleet-manifest.json body as model_weights writes it (schema 1), for ``{relpath: bytes}``."""
    return {
        "schema": 1,
        "repo_id": repo_id,
        "revision": revision,
        "source": "hf",
        "endpoint": None,
        "verified_at": None,
        "files": {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()},
    }


@contextlib.contextmanager
def weights_server(arena, path, name="attack", **extra):
    """Start ttfleet.inference.weights_server on 127.0.0.1 as root; yields its result; always stops it."""
    run_dir = arena.private / "run"
    args = {"state": "started", "name": name, "path": str(path), "bind": "127.0.0.1", "port": 0, "ttl": 120}
    args.update(run_dir=str(run_dir), **extra)

    # Stopped through the module; Arena.close kills the daemon should that fail (its command line names the arena).
    arena.cleanups.append(
        lambda: arena.module("weights_server", {"state": "stopped", "name": name, "run_dir": str(run_dir)})
    )
    yield arena.module("weights_server", args)


class _StaticHandler(http.server.BaseHTTPRequestHandler):
    files: typing.ClassVar[dict] = {}
    token: typing.ClassVar[str | None] = None
    seen: typing.ClassVar[list] = []

    def log_message(self, *_args):
        return

    def _answer(self, code, body=b"", headers=()):
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        self.seen.append((path, self.headers.get("Authorization")))
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self._answer(401)
            return
        body = self.files.get(path)
        if body is None:
            self._answer(404)
        elif isinstance(body, str):  # a redirect
            self._answer(302, headers=[("Location", body)])
        else:
            self._answer(200, body)


class ServedAt(str):
    """The base URL of a static_server; ``seen`` lists ``(path, Authorization header)`` of every request."""

    seen: list


@contextlib.contextmanager
def static_server(files, token=None):
    """A plain HTTP server on 127.0.0.1 in this process serving ``{url path: bytes, or a str to redirect to}``.

    With ``token``, requests without ``Authorization: Bearer <token>`` get 401 (a gated repository).
    """
    seen = []
    handler = type("Handler", (_StaticHandler,), {"files": dict(files), "token": token, "seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = ServedAt(f"http://127.0.0.1:{server.server_address[1]}")
        url.seen = seen
        yield url
    finally:
        server.shutdown()
        server.server_close()


def fake_peer(arena, files, manifest=None, **manifest_args):
    """A stand-in for a fleet peer's weights_server: the manifest and ``{relpath: bytes}`` under /tok/."""
    body = manifest if manifest is not None else weights_manifest(files, **manifest_args)
    served = {f"/tok/{rel}": data for rel, data in files.items()}
    served["/tok/.ttfleet-manifest.json"] = json.dumps(body).encode()
    return static_server(served)


def build_kernel_entry(store, key, members, files=None, size=None, **manifest_extra):
    """Write a kernel store entry ``<store>/<model>/<mesh>/<impl>/<tmc>/<vllm>/`` whose archive holds ``members``.

    ``members`` is a list of ``(TarInfo, bytes or None)``. The manifest states the archive's real sha256 and size
    and, unless ``files``/``size`` are given, the regular files and bytes it holds: what a hostile store owner who
    controls the whole entry would write.
    """
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    packed = subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True).stdout
    regular = [info for info, _data in members if info.isfile()]
    entry = Path(store, key["model_name"], key["mesh"], key["impl_id"], key["tt_metal_commit"], key["vllm_commit"])
    entry.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(packed).hexdigest()
    (entry / "kernels.tar.zst").write_bytes(packed)
    (entry / "kernels.tar.zst.sha256").write_text(f"{sha}  kernels.tar.zst\n")
    manifest = {
        "schema": 1,
        "kind": "ttfleet.kernel_cache",
        "key": dict(key),
        "archive": "kernels.tar.zst",
        "compression": "zstd",
        "sha256": sha,
        "archive_bytes": len(packed),
        "files": len(regular) if files is None else files,
        "bytes": sum(info.size for info in regular) if size is None else size,
        "host": "attacker",
        "evidence": "operator flag warmed",
        "created_at": "2025-01-01T00:00:00Z",
        **manifest_extra,
    }
    (entry / "manifest.json").write_text(json.dumps(manifest))
    return entry


def tar_member(name, kind="file", data=b"kernel\n", target=None, mode=0o644):
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        return info, None
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, target
        return info, None
    if kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, target
        return info, None
    if kind == "chardev":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 1
        return info, None
    if kind == "fifo":
        info.type = tarfile.FIFOTYPE
        return info, None
    return info, data


def kernel_args(arena, state, **extra):
    return {"state": state, "volume": str(arena.volume), **kernel_key(), **extra}
