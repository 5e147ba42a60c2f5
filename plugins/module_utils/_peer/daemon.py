# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer daemon's life cycle.

``start_server`` binds the socket in the caller (so the port is known and errors surface there), then detaches a
daemon (double fork, new session, stdio on /dev/null) that serves until ``stop_server`` signals it or ``ttl``
seconds pass, so a play that dies never leaves it behind for long. Its records are in ``state``, what it serves in
``catalog``, its connections in ``gate`` and its HTTP in ``server``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import unlink, write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.catalog import Catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import PeerError
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.gate import Gate
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.server import make_handler
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import (
    RUN_DIR,
    STATE_MODE,
    Counter,
    alive,
    default_address,
    open_run_dir,
    read_state,
    read_state_at,
    starttime,
    state_file,
    stats_file,
)

if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]

LISTEN_BACKLOG = 128


def _bind(bind: str, port: int) -> socket.socket:
    """A listening TCP socket on ``bind:port``."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        listener = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise PeerError(f"cannot open a socket for {bind}: {exc.strerror or exc}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(LISTEN_BACKLOG)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise PeerError(
                f"cannot bind {bind}: not an address of this host; set the fleet address to one it has"
            ) from None
        raise PeerError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}; pick another port or 0") from None
    except BaseException:
        listener.close()
        raise
    return listener


def start_server(
    directory: str,
    bind: str,
    port: int = 0,
    ttl: float = 3600,
    run_dir: str = RUN_DIR,
    name: str = "weights",
    kind: str = "weights",
    pinned: Catalog | None = None,
) -> JSON:
    """Start serving ``directory`` (a weights directory or, with ``kind="kernels"``, a kernel-store spool) on
    ``bind:port`` (0 picks a free port); returns the state dict, also written to ``<run_dir>/<name>.json``
    (mode 0600). ``pinned`` is a Catalog of ``directory`` already built by the caller (it is closed here)."""
    state_name = state_file(name)
    cat = pinned or Catalog(directory, kind)
    run_fd = server = None
    try:
        # With create, a descriptor or PeerError: never None.
        run_fd = cast("int", open_run_dir(run_dir, create=True))
        server = _bind(bind, port)
        token = secrets.token_hex(16)
        real_port = server.getsockname()[1]
        host = f"[{bind}]" if ":" in bind else bind
        state = {
            "path": cat.directory,
            "kind": cat.kind,
            "bind": bind,
            "port": real_port,
            "token": token,
            "url": f"http://{host}:{real_port}/{token}/",
            "expires": int(time.time() + ttl),
            "files": len(cat.files),
            "catalog": cat.digest,
        }
        read_end, write_end = os.pipe()
        first = os.fork()
        if first == 0:  # pragma: no cover - runs in the detached daemon
            try:
                os.close(read_end)
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                os.write(write_end, str(os.getpid()).encode())
                os.close(write_end)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                # Keep only the socket and the two directory descriptors: the caller's pipes must close.
                low = 3
                for keep in sorted({server.fileno(), cat.fd, run_fd}):
                    os.closerange(low, keep)
                    low = keep + 1
                os.closerange(low, 65536)
                os.chdir("/")
                _serve_until(server, cat, token, run_fd, name, ttl)
            finally:
                os._exit(0)
        os.close(write_end)
        os.waitpid(first, 0)
        with os.fdopen(read_end, "rb") as handle:
            pid_text = handle.read().decode() or "0"
        state["pid"] = int(pid_text)
        try:
            state["starttime"] = starttime(state["pid"])
        except (OSError, IndexError, ValueError):
            raise PeerError(f"the peer server for {cat.directory} exited right after starting") from None
        write_json(run_fd, state_name, state, mode=STATE_MODE)
        return state
    finally:
        if server is not None:
            server.close()
        if run_fd is not None:
            os.close(run_fd)
        cat.close()


def ensure_server(
    path: str,
    name: str,
    bind: str | None = None,
    port: int = 0,
    ttl: int = 3600,
    run_dir: str = RUN_DIR,
    kind: str = "weights",
    check_mode: bool = False,
) -> tuple[bool, JSON | None]:
    """A server of ``path`` recorded under ``name``: the one running is kept when it serves the same files (paths,
    inodes and sizes), kind and ``bind`` with at least half of ``ttl`` left, else a new one is started (the old one
    stopped). ``bind`` None: the default-route address. Returns ``(changed, state)``, with ``state`` None in check
    mode when a server would start. What weights_server state=started and model_weights serve do."""
    if not 0 <= port <= 65535 or ttl < 1:
        raise PeerError(f"port must be 0-65535 and ttl at least 1 (got {port}, {ttl})")
    bind = bind or default_address()
    current = read_state(run_dir, name)
    running = alive(current)
    pinned = Catalog(path, kind)
    try:
        # A server about to expire is not kept: the pull that follows could outlive it. (current is not None
        # when running is true: alive(None) is False, which mypy cannot follow.)
        fresh = running and current.get("expires", 0) - time.time() >= ttl / 2  # type: ignore[union-attr]
        if fresh and (current.get("catalog"), current.get("bind")) == (pinned.digest, bind):  # type: ignore[union-attr]
            pinned.close()
            return False, dict(current, bind=bind)  # type: ignore[arg-type]
        if check_mode:
            pinned.close()
            return True, None
        if running:
            stop_server(run_dir, name)
    except BaseException:
        pinned.close()
        raise
    return True, start_server(path, bind, port, ttl, run_dir, name, kind, pinned=pinned)


def server_facts(state: JSON) -> JSON:
    """What a module returns of a running server (its state without the token and the catalog)."""
    return {
        "url": state["url"],
        "port": state["port"],
        "pid": state["pid"],
        "files": state["files"],
        "address": state["bind"],
    }


def _serve_until(  # pragma: no cover - daemon side
    server: socket.socket, cat: Catalog, token: str, run_fd: int, name: str, ttl: float
) -> None:
    counter = Counter(run_fd, name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    gate = Gate(server, make_handler(cat.fd, token, cat.files, counter))
    gate.run(stop, time.monotonic() + ttl)
    server.close()
    counter.flush("stopped")


def stop_server(run_dir: str, name: str, wait: float = 10.0) -> tuple[bool, int]:
    """Stop the daemon recorded for ``name``; returns ``(was_running, served_bytes)``. Missing state is fine."""
    state_name = state_file(name)
    run_fd = open_run_dir(run_dir, create=False)
    if run_fd is None:
        return False, 0
    try:
        state = read_state_at(run_fd, name)
        if state is None:
            return False, 0
        running = alive(state)
        if running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state["pid"], signal.SIGTERM)
            deadline = time.monotonic() + wait
            while alive(state) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive(state):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state["pid"], signal.SIGKILL)
        served = 0
        with contextlib.suppress(OSError, SafeFileError, ValueError, TypeError, AttributeError):
            served = int(read_json(run_fd, stats_file(name), missing={}).get("served_bytes", 0))
        for leftover in (state_name, stats_file(name)):
            unlink(run_fd, leftover)
        return running, served
    finally:
        os.close(run_fd)
