# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The time limits of one network operation: a stall limit and an overall limit, and the watchdog that holds a socket
to the overall one.

``Deadline`` carries a stall limit (no byte for ``stall`` seconds: the per-read socket timeout) and an overall limit.
``watch`` arms a watchdog that shuts the socket down when the overall limit passes (``http.connection`` and
``http.open_url`` do it for every connection), so a peer that drips one byte a second, or sends its headers that way,
cannot hold a call past it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import (
    DEFAULT_STALL,
    DEFAULT_TOTAL,
    MIN_RATE,
)

if TYPE_CHECKING:
    from collections.abc import Callable


def seconds(value: float) -> str:
    """``value`` seconds for a message: whole seconds, tenths below one (``0.3``), never ``2.0``."""
    return f"{value:.0f}" if value >= 1 else f"{value:.1f}"


class Deadline:
    """A stall limit and an overall limit for one network operation (a request, a listing, one file)."""

    def __init__(
        self,
        total: float = DEFAULT_TOTAL,
        stall: float = DEFAULT_STALL,
        what: str = "the request",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.start = clock()
        self.total = float(total)
        self.stall = float(stall)
        self.what = what
        self.expired = False
        # The operation this one is part of, when its limit cut this one's short (within()): its limit is then named.
        self.parent: Deadline | None = None
        # Whether the last socket timeout handed out was cut short by the overall limit: a timeout then is that limit.
        self.capped = False
        # The proxy (masked) the last connection of this operation went through; describe() names it.
        self.via: str | None = None

    @classmethod
    def for_size(
        cls,
        size: int | None,
        stall: float = DEFAULT_STALL,
        what: str = "the transfer",
        floor: float = DEFAULT_TOTAL,
        rate: float = MIN_RATE,
    ) -> Deadline:
        """A transfer of ``size`` bytes: ``floor`` seconds plus the time it takes at ``rate`` bytes/s."""
        return cls(total=floor + max(0, size or 0) / rate, stall=stall, what=what)

    @classmethod
    def within(cls, parent: Deadline, total: float, stall: float, what: str) -> Deadline:
        """One step (a page, a request) of ``parent``'s operation: ``total`` seconds at most, never past ``parent``'s
        limit; when that limit is what ends the step, the error names it."""
        left = parent.remaining()
        step = cls(total=min(total, left), stall=stall, what=what, clock=parent.clock)
        if left < total:
            step.parent = parent
        return step

    def remaining(self) -> float:
        return self.total - (self.clock() - self.start)

    def timeout(self) -> float:
        """The socket timeout for the next operation: the stall limit, never past the overall limit."""
        left = self.remaining()
        if left <= 0:
            raise self.error()
        self.capped = left < self.stall
        return max(0.05, min(self.stall, left))

    def check(self) -> None:
        if self.remaining() <= 0:
            raise self.error()

    def error(self) -> NetError:
        self.expired = True
        if self.parent is not None:
            return self.parent.error()
        return NetError(f"{self.what} did not finish within its {seconds(self.total)} s limit")

    def stalled(self, where: str = "") -> NetError:
        return NetError(f"{self.what} stalled: no data for {seconds(self.stall)} s{where}")


class Watchdog:
    """Shuts a socket down when its deadline passes, whatever read or write it is blocked in."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        # A descriptor of its own for the connection: the TLS socket that wraps ``sock`` after the handshake (or after
        # a proxy's CONNECT) detaches ``sock``, whose shutdown would then reach nothing.
        self.sock: socket.socket | None = sock.dup()
        self.deadline = deadline
        self.lock = threading.Lock()
        self.timer = threading.Timer(max(0.0, deadline.remaining()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.deadline.expired = True
        with self.lock, contextlib.suppress(OSError):
            if self.sock is not None:
                self.sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()
        with self.lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None


def watch(sock: socket.socket, deadline: Deadline) -> Watchdog:
    """Arm the overall limit of ``deadline`` on ``sock`` and set its per-read timeout to the stall limit."""
    sock.settimeout(deadline.timeout())
    return Watchdog(sock, deadline)
