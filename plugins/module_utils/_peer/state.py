# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer daemon's records: its state (``<name>.json``, holding the token URL) and the bytes it served
(``<name>.json.stats``), mode 0600 files in a root-only 0700 run directory, written atomically through
``_fs``; and whether the daemon a state names still runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path, open_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import PeerError, reason

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

# Where the peer daemons keep their records unless told otherwise (weights_server's run_dir default).
RUN_DIR = "/run/ttfleet-weights"
RUN_DIR_MODE = 0o700
STATE_MODE = 0o600
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Counter:
    """Bytes served, written to ``<name>.json.stats`` in the run directory at most every second and at exit."""

    def __init__(self, run_fd: int, name: str) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        self.run_fd = run_fd
        self.stats_name = stats_file(name)
        self.written = 0.0

    def add(self, count: int) -> None:
        with self.lock:
            self.bytes += count
            if time.monotonic() - self.written >= 1.0:
                self._write("serving")

    def flush(self, state: str = "serving") -> None:
        with self.lock:
            self._write(state)

    def _write(self, state: str) -> None:
        self.written = time.monotonic()
        with contextlib.suppress(OSError, SafeFileError):
            write_json(self.run_fd, self.stats_name, {"served_bytes": self.bytes, "state": state}, mode=STATE_MODE)


def default_address() -> str:
    """The address of the interface that holds the default route, else the one the host name resolves to.

    Connecting a UDP socket sends nothing; it only makes the kernel choose the source address.
    """
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))
        address = sock.getsockname()[0]
        if address and not address.startswith("0."):
            return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        raise PeerError("cannot find this host's address; set bind to the address peers reach it at") from None


def state_file(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise PeerError(f"name {name!r} must be letters, digits, '.', '_' or '-' (it names the state file)")
    return f"{name}.json"


def stats_file(name: str) -> str:
    return state_file(name) + ".stats"


def state_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, state_file(name))


def open_run_dir(run_dir: str, create: bool) -> int | None:
    """Descriptor of the run directory, which must be this user's and closed to others (its state names a pid
    that stop_server signals); None when it does not exist and ``create`` is false."""
    run_dir = os.path.normpath(run_dir)
    try:
        fd = make_path(run_dir, mode=RUN_DIR_MODE) if create else open_dir(run_dir)
    except FileNotFoundError:
        if create:
            raise PeerError(f"cannot create run_dir {run_dir}: a parent vanished; run again") from None
        return None
    except (OSError, SafeFileError) as exc:
        raise PeerError(f"cannot use run_dir {run_dir}: {reason(exc)}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or (not create and st.st_mode & 0o022):
        os.close(fd)
        raise PeerError(
            f"run_dir {run_dir} belongs to uid {st.st_uid} or others can write it; give a directory only this "
            "user owns (the default /run/ttfleet-weights)"
        )
    if create:
        set_attrs(fd, RUN_DIR_MODE)
    return fd


def read_state_at(run_fd: int, name: str) -> JSON | None:
    try:
        return read_json(run_fd, state_file(name))
    except (OSError, SafeFileError):
        return None


def read_state(run_dir: str, name: str) -> JSON | None:
    """The state recorded for ``name`` (None when there is none or it is unreadable)."""
    fd = open_run_dir(run_dir, create=False)
    if fd is None:
        return None
    try:
        return read_state_at(fd, name)
    finally:
        os.close(fd)


def alive(state: Mapping[str, Any] | None) -> bool:
    """Whether the daemon of ``state`` still runs (same pid and the start time it recorded)."""
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or pid <= 1:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        # state is not None here: the pid came from it.
        return fields[0] != "Z" and int(fields[19]) == cast("Mapping[str, Any]", state).get("starttime")
    except (OSError, IndexError, ValueError):
        return False


def starttime(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def live_states(run_dir: str = RUN_DIR) -> list[JSON]:
    """The states of the daemons recorded in ``run_dir`` that still run (none when it is missing or not root's)."""
    try:
        fd = open_run_dir(run_dir, create=False)
    except PeerError:
        return []
    if fd is None:
        return []
    try:
        with os.scandir(fd) as entries:
            names = sorted(entry.name[: -len(".json")] for entry in entries if entry.name.endswith(".json"))
        states = [read_state_at(fd, name) for name in names if _NAME_RE.match(name)]
    finally:
        os.close(fd)
    return [state for state in states if state is not None and alive(state)]
