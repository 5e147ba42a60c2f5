"""The peer server (plugins/module_utils/_peer/, module weights_server) against hostile clients: the real detached
daemon, started by a child process whose open-file limit is 64 (the limit it inherits), flooded with connections that
never send a byte, with heads dripped a byte a second, with a client that stops reading mid-file. A peer with the
token must still get its files within seconds, the daemon must not spin, and what was held stays held: the 128-bit
path token, traversal answered 404, sane ranges, 200 slow clients served, exit on time.

Small timeouts are set through the module constants of ``_peer.gate`` in the child that starts the daemon (the daemon
is forked from it and inherits them); the flood test runs the shipped defaults."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import COLLECTIONS, ROOT, SLACK, limit_nofile

from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import stop_server
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.gate import (
    FD_RESERVE,
    FDS_PER_CONNECTION,
    MAX_HEAD_BYTES,
    Gate,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import alive

sys.path.append(os.path.join(ROOT, "tests", "unit"))
sys.path.append(os.path.join(ROOT, "tests", "unit", "plugins", "module_utils", "_peer"))
from test_peer_daemon import _weights_dir  # the weights directory of the unit tests of the peer server

MIB = 1 << 20
CLK_TCK = os.sysconf("SC_CLK_TCK")

_START = """
import json, sys
from ansible_collections.ttfleet.inference.plugins.module_utils._peer import gate
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import start_server
constants, root, run_dir, name, ttl = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
for key, value in constants.items():
    assert hasattr(gate, key), key
    setattr(gate, key, value)
print(json.dumps(start_server(root, "127.0.0.1", 0, ttl=ttl, run_dir=run_dir, name=name)))
"""


@pytest.fixture
def daemon(tmp_path):
    """``daemon(root, nofile=64, ttl=60, **constants)`` starts the real peer server from a child process whose
    RLIMIT_NOFILE is ``nofile`` (soft and hard), with ``constants`` of ``_peer.gate`` set; returns its state."""
    started = []

    def start(root, nofile=64, ttl=60, **constants):
        run_dir, name = str(tmp_path / "run"), f"s{len(started)}"
        proc = subprocess.run(
            [sys.executable, "-c", _START, json.dumps(constants), str(root), run_dir, name, str(ttl)],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, PYTHONPATH=COLLECTIONS),
            preexec_fn=limit_nofile(nofile),
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        state = json.loads(proc.stdout)
        started.append((run_dir, name))
        state["run_dir"], state["name"] = run_dir, name
        return state

    yield start
    for run_dir, name in started:
        stop_server(run_dir, name)


@pytest.fixture
def files(tmp_path):
    data = {"a.bin": os.urandom(MIB), "sub/b.bin": os.urandom(4096), "big.bin": os.urandom(32 * MIB)}
    root = _weights_dir(tmp_path / "w" / "Tiny", data)
    return root, data


def cpu_seconds(pid):
    """utime + stime of ``pid`` (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def sockets(pid):
    fds = f"/proc/{pid}/fd"
    count = 0
    for name in os.listdir(fds):
        with contextlib.suppress(OSError):
            count += os.readlink(os.path.join(fds, name)).startswith("socket:")
    return count


def threads(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def get(state, rel, headers=None, method="GET", timeout=5):
    """``(status, headers, body, seconds)`` of one request to the daemon of ``state``."""
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", state["port"], timeout=timeout)
    try:
        conn.request(method, f"/{state['token']}/{rel}", headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.getheaders()), body, time.monotonic() - began
    finally:
        conn.close()


def connect(state, count):
    return [socket.create_connection(("127.0.0.1", state["port"]), timeout=10) for _i in range(count)]


def closed_within(sock, limit):
    """Seconds until the server closes ``sock`` (reading it), None when it stays open for ``limit`` seconds."""
    began = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def drip(socks, stop, every=1.0, data=b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 4096):
    """Slowloris: one byte of a never-ending head to each socket every ``every`` seconds."""
    sent = 0
    while not stop.is_set() and sent < len(data):
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(data[sent : sent + 1])
        sent += 1
        stop.wait(every)


def close_all(socks):
    for sock in socks:
        sock.close()


# ---------------------------------------------------------------------------
# The flood of the issue, with the shipped timeouts


def test_idle_and_dripping_connections_do_not_lock_peers_out(daemon, files):
    """Broke: 66 connections that never sent a byte, with the open-file limit at 64, locked peers out, and the
    accept loop spun on EMFILE. Now the cap (from the limit) and oldest-first reaping keep the peer served, and the
    daemon sleeps while it waits."""
    root, data = files
    state = daemon(root, nofile=64)
    pid = state["pid"]
    idle = connect(state, 66)
    slow = connect(state, 30)
    stop = threading.Event()
    dripper = threading.Thread(target=drip, args=(slow, stop), daemon=True)
    dripper.start()
    try:
        time.sleep(0.5)
        cpu_before, began = cpu_seconds(pid), time.monotonic()
        answers = []
        while time.monotonic() - began < 5:
            # Locked out, an answer waits for the 10 s idle timeout to free a place.
            status, _headers, body, seconds = get(state, "a.bin", timeout=30)
            answers.append((status, seconds))
            assert status == 200 and body == data["a.bin"], (status, len(body))
            assert seconds < SLACK, seconds
            time.sleep(0.5)
        cpu = cpu_seconds(pid) - cpu_before
        wall = time.monotonic() - began
        held = sockets(pid) - 1  # the listener
    finally:
        stop.set()
        dripper.join(5)
        close_all(idle + slow)
    print(
        f"flood: {len(answers)} answers, slowest {max(s for _c, s in answers):.3f} s; cpu {cpu:.2f} s in {wall:.1f} s; "
        f"{held} connections held"
    )
    # The cap from the limit: two descriptors a connection beside the reserve.
    assert held <= (64 - FD_RESERVE) // FDS_PER_CONNECTION, held
    # A spinning accept loop burns a whole core (about 5 s here); serving the peer's 1 MiB files takes little.
    assert cpu < 0.5 * wall / 5, cpu
    # Served again and again through the flood (ten times on an idle machine, fewer when it is loaded).
    assert len(answers) >= 4, answers


def test_accept_backs_off_on_emfile_and_keeps_serving(daemon, files):
    """With the cap forced above what the open-file limit holds, accept fails with EMFILE: the daemon pauses
    instead of spinning, closes the oldest waiting connection, lowers its cap, and the peer is still served."""
    root, data = files
    state = daemon(root, nofile=64, CONNECTION_CAP=1000)
    pid = state["pid"]
    idle = connect(state, 90)
    try:
        time.sleep(0.5)
        cpu_before, began = cpu_seconds(pid), time.monotonic()
        slowest = 0.0
        while time.monotonic() - began < 3:
            status, _headers, body, seconds = get(state, "sub/b.bin")
            assert (status, body) == (200, data["sub/b.bin"])
            slowest = max(slowest, seconds)
            time.sleep(0.3)
        # More connections while it is at the limit: accepted one by one as the oldest make room.
        idle += connect(state, 40)
        assert get(state, "sub/b.bin")[:3:2] == (200, data["sub/b.bin"])
        time.sleep(1)
        cpu = cpu_seconds(pid) - cpu_before
        wall = time.monotonic() - began
        # Below the open-file limit again: the daemon holds no more descriptors than 64 allow.
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        close_all(idle)
    print(f"emfile: slowest answer {slowest:.3f} s; cpu {cpu:.2f} s in {wall:.1f} s; {fds} descriptors")
    assert slowest < SLACK and cpu < 0.5, (slowest, cpu)
    assert fds < 64


def test_accept_backs_off_while_answered_connections_hold_every_descriptor(daemon, files):
    """Every descriptor held by connections being answered (readers that stopped reading, the cap forced above the
    limit): nothing can be closed to make room, so accept fails again and again; the daemon pauses between tries
    rather than spinning, and serves the peer once the stall limit has dropped the readers."""
    root, data = files
    state = daemon(root, nofile=64, CONNECTION_CAP=1000, WRITE_STALL=3.0)
    pid = state["pid"]
    readers = []
    for _i in range(40):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", state["port"]))
        sock.sendall(f"GET /{state['token']}/big.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        readers.append(sock)
    began = time.monotonic()
    try:
        time.sleep(0.3)
        cpu_before = cpu_seconds(pid)
        time.sleep(2)
        cpu = cpu_seconds(pid) - cpu_before
        assert cpu < 0.3, cpu
        # The peer retries as model_weights and kernel_cache do: refused (503, reset) while the descriptors are
        # held, served once the readers are dropped.
        tries = []
        while time.monotonic() - began < 30:
            try:
                status, _headers, body, _s = get(state, "sub/b.bin", timeout=10)
            except OSError as exc:
                status, body = repr(exc), b""
            tries.append(status)
            if status == 200:
                break
            time.sleep(0.5)
        served = time.monotonic() - began
    finally:
        close_all(readers)
    print(f"exhausted: cpu {cpu:.2f} s in 2 s; the peer served {served:.1f} s after the readers stalled: {tries}")
    # Once the 3 s stall limit has dropped the readers; while they hold every descriptor, never.
    assert (status, body) == (200, data["sub/b.bin"]) and served < 3 + SLACK, tries


class _Exhausted(socket.socket):
    """A listener whose accept fails as a process or host out of descriptors or buffers does."""

    code = errno.ENFILE
    tries = 0

    def accept(self):
        self.tries += 1
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_accept_errors_back_off_and_never_spin(code):
    """The gate itself (in this process): a listener that stays readable while every accept fails is tried again
    after 0.05, 0.1, 0.2 ... 1 s, a handful of times in 2 s, not thousands."""
    listener = _Exhausted(socket.AF_INET, socket.SOCK_STREAM)
    listener.code = code
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    client = socket.create_connection(listener.getsockname(), timeout=5)
    gate = Gate(listener, handler=None, cap=10)
    cpu, began = time.process_time(), time.monotonic()
    try:
        gate.run(threading.Event(), time.monotonic() + 2)
    finally:
        client.close()
        listener.close()
    cpu = time.process_time() - cpu
    assert 1.9 < time.monotonic() - began < 2 + SLACK
    assert 3 <= listener.tries <= 8 and cpu < 0.2, (listener.tries, cpu)


# ---------------------------------------------------------------------------
# Timeouts (small ones set through the module constants)


def test_idle_header_and_head_size_limits(daemon, files):
    root, _data = files
    # The header timeout lies beyond the idle timeout and its slack: the two closes cannot be told apart otherwise.
    idle_timeout, header_timeout = 2.0, 2.0 + SLACK + 1
    state = daemon(root, IDLE_TIMEOUT=idle_timeout, HEADER_TIMEOUT=header_timeout)
    # No byte at all: closed after the idle timeout.
    (idle,) = connect(state, 1)
    seconds = closed_within(idle, 30)
    assert seconds is not None and idle_timeout - 0.5 < seconds < idle_timeout + SLACK, seconds
    idle.close()
    # A byte every 0.2 s (a tenth of the idle timeout) never trips it, but the whole head is due within the header
    # timeout; the head would take a minute to send.
    (slow,) = connect(state, 1)
    began, sent, closed = time.monotonic(), 0, None
    head = b"GET /" + state["token"].encode() + b"/a.bin HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 300
    while time.monotonic() - began < 30 and sent < len(head):
        readable, _w, _x = select.select([slow], [], [], 0.2)
        if readable and not slow.recv(1):
            closed = time.monotonic() - began
            break
        try:
            slow.send(head[sent : sent + 1])
        except OSError:
            closed = time.monotonic() - began
            break
        sent += 1
    slow.close()
    assert closed is not None and header_timeout - 0.5 < closed < header_timeout + SLACK, (closed, sent)
    # A head that never ends within MAX_HEAD_BYTES: answered 431 and closed at once.
    (big,) = connect(state, 1)
    big.sendall(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES + 10))
    big.settimeout(5)
    assert big.recv(100).startswith(b"HTTP/1.1 431 ")
    assert closed_within(big, 5) is not None
    big.close()


def test_a_client_that_stops_reading_is_dropped_after_the_stall_limit(daemon, files):
    root, data = files
    state = daemon(root, WRITE_STALL=1.0)
    pid = state["pid"]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", state["port"]))
    sock.sendall(f"GET /{state['token']}/big.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    began = time.monotonic()
    sock.settimeout(5)
    received = len(sock.recv(4096))
    # Answering: the gate and one thread. The client reads no more.
    assert threads(pid) == 2
    while threads(pid) > 1 and time.monotonic() - began < 30:
        time.sleep(0.1)
    dropped = time.monotonic() - began
    assert threads(pid) == 1 and dropped < 1 + SLACK, dropped
    # The socket is closed: what the buffers held, then the end, far short of the file.
    sock.settimeout(5)
    while part := sock.recv(MIB):
        received += len(part)
    sock.close()
    print(f"stalled reader dropped after {dropped:.2f} s with {received} of {len(data['big.bin'])} bytes")
    assert received < len(data["big.bin"]) // 2
    # The peer that reads is served whole afterwards.
    status, _headers, body, _s = get(state, "big.bin", timeout=30)
    assert status == 200 and hashlib.sha256(body).digest() == hashlib.sha256(data["big.bin"]).digest()


# ---------------------------------------------------------------------------
# Held


def test_token_traversal_and_ranges_stay_sane(daemon, files):
    root, data = files
    state = daemon(root)
    a = data["a.bin"]
    assert len(state["token"]) == 32 and int(state["token"], 16) >= 0  # 128 bits, hex
    assert get(state, "a.bin")[::2] == (200, a)
    wrong = dict(state, token="0" * 32)
    assert get(wrong, "a.bin")[0] == 404
    for rel in ("../w/Tiny/a.bin", "%2e%2e/Tiny/a.bin", "sub/../a.bin", "..%2F..%2Fetc%2Fpasswd", "/etc/passwd"):
        assert get(state, rel)[0] == 404, rel
    size = len(a)
    cases = [
        ("bytes=10-19", 206, a[10:20], f"bytes 10-19/{size}"),
        (f"bytes={size - 5}-", 206, a[-5:], f"bytes {size - 5}-{size - 1}/{size}"),
        ("bytes=0-" + "9" * 5000, 206, a, f"bytes 0-{size - 1}/{size}"),  # the end is clamped to the file
        ("bytes=" + "9" * 5000 + "-", 416, b"", f"bytes */{size}"),  # a start past any file: refused, not a crash
        (f"bytes={size}-", 416, b"", f"bytes */{size}"),
        ("bytes=20-10", 416, b"", f"bytes */{size}"),
        ("bytes=-10", 200, a, None),  # other forms are ignored, as HTTP allows
        ("bytes=0-1,5-6", 200, a, None),
    ]
    for header, code, body, content_range in cases:
        status, headers, got, _s = get(state, "a.bin", {"Range": header})
        assert (status, got, headers.get("Content-Range")) == (code, body, content_range), header[:40]
    status, headers, body, _s = get(state, "a.bin", method="HEAD")
    assert (status, headers["Content-Length"], body) == (200, str(size), b"")
    # Another method: 501; not HTTP at all (a TLS hello): an error page and the connection closed.
    with socket.create_connection(("127.0.0.1", state["port"]), timeout=5) as sock:
        sock.sendall(f"BREW /{state['token']}/a.bin HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 501 ")
    with socket.create_connection(("127.0.0.1", state["port"]), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 x\r\n\r\n")
        assert b"Bad request" in sock.recv(4096)
        assert closed_within(sock, 5) is not None


def test_two_hundred_slow_clients_are_served(daemon, files):
    """With the common default limit (1024 descriptors), 200 peers reading slowly at once all get their file."""
    root, data = files
    state = daemon(root, nofile=1024)
    want = data["a.bin"]
    results = []
    barrier = threading.Barrier(200)

    def slow_client():
        barrier.wait()
        try:
            sock = socket.create_connection(("127.0.0.1", state["port"]), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
            with sock:
                sock.sendall(f"GET /{state['token']}/a.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                got = b""
                while part := sock.recv(32768):
                    got += part
                    time.sleep(0.02)
            results.append(got.partition(b"\r\n\r\n")[2] == want and got.startswith(b"HTTP/1.1 200 "))
        except OSError as exc:
            results.append(repr(exc))

    began = time.monotonic()
    clients = [threading.Thread(target=slow_client, daemon=True) for _i in range(200)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)
    seconds = time.monotonic() - began
    print(f"200 slow clients served in {seconds:.1f} s")
    assert results == [True] * 200, [r for r in results if r is not True][:3]


def test_exits_on_time_under_a_flood(daemon, files):
    root, _data = files
    state = daemon(root, ttl=2)
    idle = connect(state, 40)
    sock = socket.create_connection(("127.0.0.1", state["port"]), timeout=5)
    sock.sendall(f"GET /{state['token']}/big.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # and never read
    try:
        deadline = time.monotonic() + 30
        while alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(state), "the daemon outlived its ttl"
        assert time.time() - state["expires"] < SLACK
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", state["port"]), timeout=2).close()
    finally:
        sock.close()
        close_all(idle)
