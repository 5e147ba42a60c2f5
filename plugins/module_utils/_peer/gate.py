# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer daemon's connections, bounded so that a peer keeps being served under a flood of idle or dripping
connections.

One thread, the *gate*, accepts connections and reads request heads without blocking; a connection that sends no
byte for ``IDLE_TIMEOUT`` seconds, or not its whole head (at most ``MAX_HEAD_BYTES``) within ``HEADER_TIMEOUT``
seconds of its accept, is closed. At most ``cap`` connections are open at once, ``cap`` derived from the open-file
limit (two descriptors a connection: its socket and the file it is sent, ``FD_RESERVE`` kept for the daemon) and at
most ``MAX_CONNECTIONS``; when the cap is reached, the connection still sending its head that was accepted first is
closed for the new one, and when every connection is being answered new ones wait in the listen backlog. An accept
that fails for want of descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM) closes the oldest waiting connection
and pauses accepting (``ACCEPT_BACKOFF``, doubling), never spinning; EMFILE also lowers the cap to what fits. A head
that is complete goes to a thread of its own that answers it and closes the connection (``Connection: close``); a
client that takes no byte of the answer for ``WRITE_STALL`` seconds is dropped.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import resource
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._peer.errors import SHORT_OF

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # What socket.accept returns beside the socket: (host, port) or (host, port, flowinfo, scope_id)
    Address = Any
    # Answers one request head on a connection: handler(sock, address, head)
    RequestHandler = Callable[[socket.socket, Address, bytes], object]

# Bounds of the daemon's connections (module constants: the hostile tests set small ones in the process that
# starts the daemon, which inherits them).
IDLE_TIMEOUT = 10.0  # seconds without a byte from a client still sending its request head: closed
HEADER_TIMEOUT = 20.0  # seconds from the accept for the whole request head: closed
WRITE_STALL = 60.0  # seconds without the client taking a byte of the answer: dropped
MAX_HEAD_BYTES = 16384  # a longer request head is answered 431 and closed
MAX_CONNECTIONS = 512  # open connections at most, whatever the open-file limit
FD_RESERVE = 16  # descriptors kept for the daemon itself (listener, directories, selector, state files)
FDS_PER_CONNECTION = 2  # its socket and the file it is sent
CONNECTION_CAP: int | None = None  # None: from the open-file limit (see connection_cap); tests force one
ACCEPT_BACKOFF = (0.05, 1.0)  # first and longest pause of accepting after EMFILE, ENFILE, ENOBUFS or ENOMEM
ACCEPT_BATCH = 64  # connections accepted in a row before pending heads are read again


def connection_cap() -> int:
    """How many connections the daemon keeps open at once: ``CONNECTION_CAP`` when set, else what the open-file
    limit holds at ``FDS_PER_CONNECTION`` descriptors each beside ``FD_RESERVE``, at most ``MAX_CONNECTIONS``. The
    soft limit is raised first towards the hard one as far as ``MAX_CONNECTIONS`` needs (the daemon waits with
    epoll, not select, so it has no use for a low soft limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_RESERVE + FDS_PER_CONNECTION * MAX_CONNECTIONS
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if raised > soft:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
    if CONNECTION_CAP:
        return CONNECTION_CAP
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, (soft - FD_RESERVE) // FDS_PER_CONNECTION))


class _Waiting:
    """A connection whose request head is still coming."""

    __slots__ = ("accepted", "address", "head", "heard")

    def __init__(self, address: Address, now: float) -> None:
        self.address = address
        self.accepted = self.heard = now
        self.head = b""


def _head_end(data: bytes) -> int:
    """The length of the request head at the start of ``data`` (through its empty line), or -1."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
    return min(ends) if ends else -1


class Gate:
    """The daemon's accept loop: it accepts connections, reads their request heads without blocking under the
    idle and header timeouts, keeps at most ``cap`` connections open, backs off when accept fails for want of
    descriptors, and hands each complete head to a thread of its own running ``handler(sock, address, head)``."""

    def __init__(self, listener: socket.socket, handler: RequestHandler, cap: int | None = None) -> None:
        self.listener = listener
        self.handler = handler
        self.cap = cap or connection_cap()
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        # waiting sockets, first accepted first
        self.by_accept: collections.OrderedDict[socket.socket, _Waiting] = collections.OrderedDict()
        # the same, longest silent first
        self.by_quiet: collections.OrderedDict[socket.socket, _Waiting] = collections.OrderedDict()
        self.busy = 0  # connections being answered by a thread
        self.lock = threading.Lock()
        self.listening = False
        self.paused_until = 0.0
        self.backoff = 0.0

    # -- bookkeeping

    def _open(self) -> int:
        with self.lock:
            return len(self.by_accept) + self.busy

    def _forget(self, sock: socket.socket) -> _Waiting | None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        self.by_quiet.pop(sock, None)
        return self.by_accept.pop(sock, None)

    def _drop(self, sock: socket.socket, answer: bytes | None = None) -> None:
        self._forget(sock)
        if answer:
            with contextlib.suppress(OSError):
                sock.send(answer)
        with contextlib.suppress(OSError):
            sock.close()

    def _drop_oldest(self) -> None:
        """Close waiting connections, first accepted first, until no more than the cap are open."""
        while self.by_accept and self._open() > self.cap:
            self._drop(next(iter(self.by_accept)))

    def _room(self) -> bool:
        """Whether a new connection fits: below the cap, or at it with a waiting connection to close for it (not
        when the connections being answered fill the cap alone: then new ones wait in the listen backlog)."""
        with self.lock:
            waiting, busy = len(self.by_accept), self.busy
        return waiting + busy < self.cap or (waiting > 0 and busy < self.cap)

    def _listen(self, on: bool) -> None:
        if on != self.listening:
            if on:
                self.selector.register(self.listener, selectors.EVENT_READ)
            else:
                self.selector.unregister(self.listener)
            self.listening = on

    # -- the loop

    def run(self, stop: threading.Event, deadline: float) -> None:
        """Serve until ``stop`` is set or ``time.monotonic()`` passes ``deadline``."""
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                self._expire(now)
                self._listen(now >= self.paused_until and self._room())
                ready = False
                for key, _events in self.selector.select(self._wait(now, deadline)):
                    if key.fileobj is self.listener:
                        ready = True
                    else:
                        self._read(cast("socket.socket", key.fileobj))  # only sockets are registered
                if ready:
                    self._accept()
        finally:
            self._listen(False)
            for sock in list(self.by_accept):
                self._drop(sock)
            self.selector.close()

    def _wait(self, now: float, deadline: float) -> float:
        wait = min(0.5, deadline - now)
        if self.by_accept:
            first = self.by_accept[next(iter(self.by_accept))]
            quiet = self.by_quiet[next(iter(self.by_quiet))]
            wait = min(wait, first.accepted + HEADER_TIMEOUT - now, quiet.heard + IDLE_TIMEOUT - now)
        if now < self.paused_until:
            wait = min(wait, self.paused_until - now)
        elif not self.listening:
            wait = min(wait, 0.05)  # at the cap, every connection answered: look again soon
        return max(wait, 0.0)

    def _expire(self, now: float) -> None:
        while self.by_accept:
            sock = next(iter(self.by_accept))
            if now - self.by_accept[sock].accepted < HEADER_TIMEOUT:
                break
            self._drop(sock)
        while self.by_quiet:
            sock = next(iter(self.by_quiet))
            if now - self.by_quiet[sock].heard < IDLE_TIMEOUT:
                break
            self._drop(sock)

    def _pause(self) -> None:
        first, longest = ACCEPT_BACKOFF
        self.backoff = min(longest, self.backoff * 2 or first)
        self.paused_until = time.monotonic() + self.backoff
        self._listen(False)

    def _accept(self) -> None:
        for accepted in range(ACCEPT_BATCH):
            if not self._room():
                return
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that connection's own trouble
                if accepted and exc.errno in SHORT_OF:
                    # The kernel takes the descriptor before it looks at the queue: this may be the end of the
                    # queue. Read the heads just accepted first; the next round tells.
                    return
                if exc.errno == errno.EMFILE:
                    # The limit is reached at this many connections: keep the cap to what fits.
                    self.cap = max(1, min(self.cap, self._open() // FDS_PER_CONNECTION))
                if exc.errno in SHORT_OF and self.by_accept:
                    self._drop(next(iter(self.by_accept)))
                self._drop_oldest()
                self._pause()
                return
            self.backoff = 0.0
            try:
                sock.setblocking(False)
                self.selector.register(sock, selectors.EVENT_READ)
            except (OSError, ValueError):  # out of memory for epoll: like out of descriptors
                sock.close()
                self._pause()
                return
            waiting = _Waiting(address, time.monotonic())
            self.by_accept[sock] = waiting
            self.by_quiet[sock] = waiting
            # Above the cap: the connection accepted first that is still sending its head makes room.
            self._drop_oldest()

    def _read(self, sock: socket.socket) -> None:
        waiting = self.by_accept.get(sock)
        if waiting is None:
            return
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        waiting.head += data
        waiting.heard = time.monotonic()
        self.by_quiet.move_to_end(sock)
        end = _head_end(waiting.head)
        if end < 0 and len(waiting.head) <= MAX_HEAD_BYTES:
            return
        if end < 0 or end > MAX_HEAD_BYTES:
            self._drop(
                sock, b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return
        self._forget(sock)
        with self.lock:
            self.busy += 1
        try:
            threading.Thread(target=self._answer, args=(sock, waiting.address, waiting.head[:end]), daemon=True).start()
        except RuntimeError:  # no thread to be had: the peer retries
            with self.lock:
                self.busy -= 1
            self._drop(sock)
            self._pause()

    def _answer(self, sock: socket.socket, address: Address, head: bytes) -> None:
        try:
            sock.settimeout(WRITE_STALL)
            self.handler(sock, address, head)
        # A client gone, stalled or sending garbage ends its own connection only.
        except Exception:  # nosec B110
            pass
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with self.lock:
                self.busy -= 1
