"""Issue 31, item 4: a proxy password (tt_proxy_env) and a token in the git URL never reach a command line while the
release installs.

Ansible writes a task's ``environment:`` onto the remote command line (``http_proxy=... /bin/sh -c ...``), and git
hands the URL it fetches from to its remote helper's command line (``git remote-http origin http://user:TOKEN@...``):
both were readable by every local user in /proc/*/cmdline while the release installed, and the first was shown at
-vvv. Now git and pip read the variables from a root-only 0600 file and git the URL's credentials from a root-only
credential store.

Each test runs the real inference_server role (``tasks_from: install``) with ansible-playbook -vvv against localhost as
root, while uid 1000 (setpriv, a real unprivileged process) reads every /proc/*/cmdline as fast as it can. A real HTTP
server on 127.0.0.1 is the proxy (and, for git, the origin behind it): it asks for the proxy password (407) and the
git token (401), checks what arrives, then holds the request a few seconds so that the fetching processes live long
enough to be seen, and drops it; the install then fails, which is all the test needs. The test asserts that the
poller saw the fetching process (the window was covered), that no command line and no -vvv output held a secret, that
the proxy received the password and the token exactly (quotes, ``$`` and spaces are data, not shell), and that no
environment file was left behind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import socketserver
import subprocess
import threading
import urllib.parse
from pathlib import Path

from conftest import COLLECTIONS, PYTHON, as_attacker, attacker_python

HOLD = 2.0  # seconds the proxy holds an authenticated request: the fetching process lives at least this long
PLAY_TIMEOUT = 240

# uid 1000's side: read every /proc/<pid>/cmdline until the stop file appears. The secrets come on stdin (on argv they
# would be found in the poller's own command line). Prints {"leaks": [...], "seen": [...]}: the command lines that held
# a secret, and those that held one of the words of interest (the processes the test must have seen).
POLLER = r"""
import json, os, sys, time
secrets = [s.encode() for s in json.loads(sys.stdin.readline())]
words = [w.encode() for w in sys.argv[2:]]
stop, me = sys.argv[1], str(os.getpid())
leaks, seen, deadline = set(), set(), time.monotonic() + 600
while time.monotonic() < deadline and not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                line = handle.read()
        except OSError:
            continue
        if any(s in line for s in secrets):
            leaks.add(line.replace(b"\0", b" ").decode("utf-8", "replace"))
        if any(w in line for w in words):
            seen.add(line.replace(b"\0", b" ").decode("utf-8", "replace")[:300])
    time.sleep(0.002)
print(json.dumps({"leaks": sorted(leaks), "seen": sorted(seen)}))
"""


def _basic(value):
    """The user:password of a Basic credential header value (None when it is not one)."""
    if not value or not value.startswith("Basic "):
        return None
    return base64.b64decode(value[6:]).decode("utf-8", "replace")


class ProxyOrigin(socketserver.ThreadingTCPServer):
    """An HTTP proxy on 127.0.0.1 that is also the git origin behind it (plain HTTP requests) and a CONNECT endpoint.

    It answers 407 until the expected proxy credential arrives, then (for a plain request) 401 until the expected
    origin credential arrives; a request that has them all is recorded and held for HOLD seconds, then dropped.
    """

    daemon_threads = True

    def __init__(self, proxy_auth, origin_auth=None):
        super().__init__(("127.0.0.1", 0), _ProxyOriginHandler)
        self.proxy_auth, self.origin_auth = proxy_auth, origin_auth
        self.heads = []  # (request line, Proxy-Authorization user:password, Authorization user:password)
        self.held = []
        self.stop = threading.Event()
        self.port = self.server_address[1]


class _ProxyOriginHandler(socketserver.StreamRequestHandler):
    timeout = 10

    def handle(self):
        server = self.server
        with contextlib.suppress(OSError):
            lines = []
            while len(lines) < 100:
                line = self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")
                if not line:
                    break
                lines.append(line)
            if not lines:
                return
            headers = {}
            for line in lines[1:]:
                name, _sep, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            proxy = _basic(headers.get("proxy-authorization"))
            origin = _basic(headers.get("authorization"))
            server.heads.append((lines[0], proxy, origin))
            if proxy != server.proxy_auth:
                answer = b'HTTP/1.1 407 X\r\nProxy-Authenticate: Basic realm="lab"\r\n'
            elif not lines[0].startswith("CONNECT") and server.origin_auth and origin != server.origin_auth:
                answer = b'HTTP/1.1 401 X\r\nWWW-Authenticate: Basic realm="lab"\r\n'
            else:
                server.held.append(lines[0])
                server.stop.wait(HOLD)
                return
            self.wfile.write(answer + b"Content-Length: 0\r\nConnection: close\r\n\r\n")


@contextlib.contextmanager
def proxy_origin(proxy_auth, origin_auth=None):
    server = ProxyOrigin(proxy_auth, origin_auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _proxy_env(password, server, *names):
    """tt_proxy_env with ``names`` set to the proxy URL of ``server`` (user fleet, ``password``) and nothing exempt.

    Only the space is encoded: ', $, ; and parentheses are allowed as they are in the user information of a URL, so
    the value handed to the role holds them raw.
    """
    url = f"http://fleet:{urllib.parse.quote(password, safe=chr(39) + '$;()')}@127.0.0.1:{server.port}"
    return {**dict.fromkeys(names, url), "no_proxy": "", "NO_PROXY": ""}


def _secret_password():
    """A proxy password with a quote, $, a space, ; and a command substitution, and a unique marker to search for."""
    marker = f"S3KRET-{secrets.token_hex(8)}"
    return marker, f"It's $HOME; $(touch PWNED) {marker}"


def _install_play(arena, poll_words, secret_values, host_vars, role="inference_server", start_at=None):
    """Run a role's install tasks (-vvv) while uid 1000 polls every command line; returns (play, poller result)."""
    private = arena.private
    tmpdir = private / "tmp"
    tmpdir.mkdir()
    inventory = private / "inventory.json"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": PYTHON,
        "tt_device": "p300x2",
        "tt_models": [],
        "tt_release_root": str(private / "tt-inference-server"),
        "inference_server_packages": [],
        "inference_server_python_interpreter": PYTHON,
        "inference_server_fetch_timeout": 60,
        **host_vars,
    }
    inventory.write_text(json.dumps({"all": {"hosts": {"target": host}}}))
    play = private / "play.yml"
    # import_role, so that --start-at-task can enter it.
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.import_role:\n        name: ttfleet.inference.{role}\n"
        "        tasks_from: install\n"
    )
    env = {
        name: value
        for name, value in os.environ.items()
        if name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOME=str(private / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(private / "ansible-tmp"),
        ANSIBLE_REMOTE_TMP=str(private / "ansible-remote-tmp"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        HOME=str(private),
        # tt_host makes its venv with the python3 in PATH: this one has venv and ensurepip on any machine.
        PATH=f"{Path(PYTHON).parent}:{os.environ['PATH']}",
        TMPDIR=str(tmpdir),
        LANG="C.UTF-8",
        LC_ALL="C.UTF-8",
    )
    stop = arena.home / "stop"
    poller = subprocess.Popen(
        as_attacker([attacker_python(), "-I", "-c", POLLER, str(stop), *poll_words]),
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        poller.stdin.write(json.dumps(secret_values) + "\n")
        poller.stdin.flush()
        playbook = Path(PYTHON).with_name("ansible-playbook")
        proc = subprocess.run(
            [str(playbook), "-vvv", "-i", str(inventory), str(play)]
            + ([f"--start-at-task={start_at}"] if start_at else []),
            cwd=private,
            env=env,
            capture_output=True,
            text=True,
            timeout=PLAY_TIMEOUT,
            check=False,
        )
    finally:
        stop.touch()
        out, err = poller.communicate(timeout=30)
    assert poller.returncode == 0, err
    return proc, json.loads(out), tmpdir


def _assert_no_leak(proc, polled, secret_values, tmpdir):
    output = proc.stdout + proc.stderr
    assert polled["leaks"] == [], f"uid 1000 read a secret in a command line: {polled['leaks']}"
    shown = [value for value in secret_values if value in output]
    assert not shown, f"ansible-playbook -vvv showed {shown}"
    assert list(tmpdir.iterdir()) == [], f"environment files left behind: {list(tmpdir.iterdir())}"


def _assert_pip_was_held(proc, polled, marker, tmpdir, server, task, pin):
    """pip ran (``pin`` on its command line) in ``task``, reached the proxy with the password, and nothing leaked."""
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, "the held pip install should have failed"
    assert task in output, output[-3000:]
    _assert_no_leak(proc, polled, [marker], tmpdir)
    assert any("install" in line and pin in line for line in polled["seen"]), f"never saw pip: {polled['seen']}"
    assert server.held, f"pip never reached the proxy with its password: {server.heads}"
    assert all(line.startswith("CONNECT pypi.lab.invalid:443 ") for line in server.held), server.held


def test_git_fetch_hides_the_proxy_password_and_the_url_token(arena):
    marker, password = _secret_password()
    token = f"T0KEN-{secrets.token_hex(8)}"
    with proxy_origin(f"fleet:{password}", f"deploy:{token}") as server:
        proc, polled, tmpdir = _install_play(
            arena,
            ["remote-http", "fetch"],
            [marker, token],
            {
                "inference_server_source": "git",
                "inference_server_git_url": f"http://deploy:{token}@git.lab.invalid/tt-inference-server.git",
                # libcurl (git) reads only the lowercase name for plain-http URLs.
                "tt_proxy_env": _proxy_env(password, server, "http_proxy"),
            },
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, "the held fetch should have failed the install"
    assert "Installing tt-inference-server v0.20.0 from the git source failed" in output, output[-3000:]
    _assert_no_leak(proc, polled, [marker, token], tmpdir)
    assert any("remote-http" in line for line in polled["seen"]), f"never saw git's remote helper: {polled['seen']}"
    # git had both: the proxy password and the token arrived exactly as configured.
    assert server.held, f"the proxy never got both credentials: {server.heads}"
    assert all(line.startswith("GET http://git.lab.invalid/") for line in server.held), server.held


def test_pip_install_hides_the_proxy_password(arena):
    marker, password = _secret_password()
    release = arena.private / "release"
    release.mkdir()
    (release / "VERSION").write_text("0.20.0\n")
    with proxy_origin(f"fleet:{password}") as server:
        proc, polled, tmpdir = _install_play(
            arena,
            ["pip", "install"],
            [marker],
            {
                "inference_server_source": "path",
                "inference_server_path": str(release),
                "inference_server_pip_extra_args": [
                    "--retries",
                    "0",
                    "--index-url",
                    "https://pypi.lab.invalid/simple/",
                ],
                "tt_proxy_env": _proxy_env(password, server, "HTTPS_PROXY", "https_proxy"),
            },
        )
    _assert_pip_was_held(
        proc, polled, marker, tmpdir, server, "Install the pinned PyYAML into the release venv", "PyYAML=="
    )


def test_tt_host_pip_install_hides_the_proxy_password(arena):
    """tt_host's tools venv (tt-smi, tt-flash): its tasks from the venv on (the APT tasks before them need a host)."""
    marker, password = _secret_password()
    with proxy_origin(f"fleet:{password}") as server:
        proc, polled, tmpdir = _install_play(
            arena,
            ["pip", "install"],
            [marker],
            {
                "tt_host_tools_venv": str(arena.private / "tools-venv"),
                "tt_host_pip_extra_args": "--retries 0 --index-url https://pypi.lab.invalid/simple/",
                "tt_proxy_env": _proxy_env(password, server, "HTTPS_PROXY", "https_proxy"),
            },
            role="tt_host",
            start_at="Create the tools venv",
        )
    _assert_pip_was_held(
        proc, polled, marker, tmpdir, server, "Install tt-smi and tt-flash at their pinned versions", "tt-smi=="
    )
