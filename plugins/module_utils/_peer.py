# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The one peer server of the fleet: a temporary read-only HTTP server that hands a directory's listed files to
fleet peers, for the weights of one model (``kind="weights"``) and for the kernel caches of a kernel-store
spool (``kind="kernels"``). One code path for both.

What is served is fixed when the server starts (the *catalog*):

- ``weights``: the files that the directory's ``.ttfleet-manifest.json`` lists, and the manifest;
- ``kernels``: the three files of every complete store entry, ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/
  <vllm_commit>/{manifest.json, kernels.tar.zst, kernels.tar.zst.sha256}`` (the layout of
  ``_kernels.stores.PathStore``).

The directory may be writable by a non-root user, so the catalog is found by a walk that never follows a link,
and each file is pinned by ``(st_dev, st_ino, size)``. The daemon keeps a descriptor of the directory and opens
a requested file per request component by component relative to it with ``O_NOFOLLOW``; a link, a special file
or any other inode or size than the pinned one is refused (403), a name outside the catalog is 404. A file
swapped for a link to an outside file is therefore never served. A file with several hard links is served only
when every local user could read it anyway (a planted hard link to a root-only file is refused).

Requests are ``GET``/``HEAD`` of ``/<token>/<relative path>`` with ``Range`` support so a puller resumes; the
token is a random 128-bit path element that keeps other clients on the network out (it travels over plain HTTP:
serve only on the site network). ``start_server`` binds the socket in the caller (so the port is known and errors
surface there), then detaches a daemon (double fork, new session, stdio on /dev/null) that serves until
``stop_server`` signals it or ``ttl`` seconds pass, so a play that dies never leaves it behind for long. Its state
(``<name>.json``, holding the token URL) and the bytes it served (``<name>.json.stats``) are mode 0600 files in a
root-only 0700 run directory, written atomically through ``_safefile``.

The daemon's connections are bounded (a peer keeps being served under a flood of idle or dripping connections):
one thread, the *gate*, accepts connections and reads request heads without blocking; a connection that sends no
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
import hashlib

# The request parser of the standard library only; files are served by the handler below, never by
# SimpleHTTPRequestHandler (which would serve a whole tree and follow links).
import http.server
import io
import json
import os
import re
import resource
import secrets
import selectors
import signal
import socket
import stat
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import ARCHIVE_NAME, SHA_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    MANIFEST_NAME as KERNEL_MANIFEST_NAME,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    SafeFileError,
    make_path,
    open_dir,
    open_file,
    open_path,
    open_relative,
    read_json,
    set_attrs,
    unlink,
    walk,
    write_json,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes import MANIFEST_NAME

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]
    # (st_dev, st_ino, size) of a catalog file
    Pin = tuple[int, int, int]
    # What socket.accept returns beside the socket: (host, port) or (host, port, flowinfo, scope_id)
    Address = Any
    # Answers one request head on a connection: handler(sock, address, head)
    RequestHandler = Callable[[socket.socket, Address, bytes], object]

KINDS = ("weights", "kernels")
CHUNK = 1 << 20
KERNEL_ENTRY_FILES = (KERNEL_MANIFEST_NAME, ARCHIVE_NAME, SHA_NAME)
# model/mesh/impl_id/tt_metal_commit/vllm_commit
KERNEL_ENTRY_DEPTH = 5
RUN_DIR_MODE = 0o700
STATE_MODE = 0o600
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
LISTEN_BACKLOG = 128
_SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")
# A range bound of more digits is past the end of any file (and int() of thousands of digits raises).
_RANGE_DIGITS = 18


class PeerError(Exception):
    """A server that cannot start or stop; the message names the input and the fix."""


# ---------------------------------------------------------------------------
# What is served


def _disclosable(st: os.stat_result) -> bool:
    """Whether a regular file may go to a peer: a file with several hard links could be a link to a root-only
    file that a user placed here (where ``fs.protected_hardlinks`` is off), so it is served only when every
    local user could read it anyway."""
    return st.st_nlink <= 1 or bool(st.st_mode & stat.S_IROTH)


def _pin_file(dirfd: int, name: str) -> Pin | None:
    """``(st_dev, st_ino, size)`` of the regular file ``name`` in ``dirfd``; None when it is missing, a link,
    a special file or not disclosable."""
    try:
        fd, st = open_file(dirfd, name)
    except (OSError, SafeFileError):
        return None
    os.close(fd)
    return (st.st_dev, st.st_ino, st.st_size) if _disclosable(st) else None


def _pin_path(rootfd: int, rel: str) -> Pin | None:
    head, _sep, name = rel.rpartition("/")
    try:
        dirfd = open_relative(rootfd, head)
    except (OSError, SafeFileError):
        return None
    try:
        return _pin_file(dirfd, name)
    finally:
        os.close(dirfd)


class Catalog:
    """The files a server hands out, ``{relative path: (st_dev, st_ino, size)}``, pinned below the directory
    descriptor ``fd`` (which the daemon keeps and serves from)."""

    def __init__(self, directory: str, kind: str = "weights") -> None:
        if kind not in KINDS:
            raise PeerError(f"kind {kind!r} must be one of {', '.join(KINDS)}")
        self.directory = os.path.normpath(directory)
        self.kind = kind
        try:
            self.fd = open_dir(self.directory)
        except (OSError, SafeFileError) as exc:
            raise PeerError(f"cannot open {self.directory}: {_reason(exc)}") from None
        try:
            self.files = self._weights() if kind == "weights" else self._kernels()
        except BaseException:
            os.close(self.fd)
            raise

    def _weights(self) -> dict[str, Pin]:
        try:
            manifest = read_json(self.fd, MANIFEST_NAME, where=self.directory)
        except (OSError, SafeFileError) as exc:
            raise PeerError(self._unreadable(_reason(exc))) from None
        if manifest is None:
            raise PeerError(self._unreadable("it is missing"))
        listed = manifest.get("files")
        if not isinstance(listed, dict) or not listed:
            raise PeerError(
                f"{os.path.join(self.directory, MANIFEST_NAME)} lists no files; only complete weights can be served"
            )
        files: dict[str, Pin] = {}
        for rel in [MANIFEST_NAME, *listed]:
            if not isinstance(rel, str) or rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
                continue
            pin = _pin_path(self.fd, rel)
            if pin is not None:
                files[rel] = pin
        return files

    def _unreadable(self, problem: str) -> str:
        return (
            f"{self.directory} has no readable {MANIFEST_NAME} ({problem}); only weights this collection placed "
            "can be served"
        )

    def _kernels(self) -> dict[str, Pin]:
        files: dict[str, Pin] = {}
        for rel, dirfd, entries in walk(self.fd, self.directory, onerror=lambda _exc: None):
            if not rel or rel.count("/") != KERNEL_ENTRY_DEPTH - 1:
                continue
            regular = {name for name, st in entries if stat.S_ISREG(st.st_mode)}
            # manifest.json is written last: an entry without it (or without its archive) is incomplete.
            if not regular.issuperset(KERNEL_ENTRY_FILES):
                continue
            pins = {name: _pin_file(dirfd, name) for name in KERNEL_ENTRY_FILES}
            if all(pins.values()):
                # all() above: every pin is a tuple, none is None
                files.update({f"{rel}/{name}": cast("Pin", pin) for name, pin in pins.items()})
        if not files:
            raise PeerError(
                f"{self.directory} holds no complete kernel store entry (<model>/<mesh>/<impl_id>/<tt_metal_commit>/"
                f"<vllm_commit>/ with {', '.join(KERNEL_ENTRY_FILES)}); pack a cache into it first"
            )
        return files

    @property
    def digest(self) -> str:
        """A digest of what is served: a server started for another catalog is restarted."""
        body = json.dumps([self.kind, self.directory, sorted(self.files.items())])
        return hashlib.sha256(body.encode()).hexdigest()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(exc: OSError | SafeFileError) -> str:
    if isinstance(exc, SafeFileError):
        return str(exc)
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if getattr(exc, "filename", None) else "")


class _Refused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def open_pinned(rootfd: int, rel: str, pin: Pin) -> tuple[int, int]:
    """``(fd, size)`` of the catalog file ``rel``, opened relative to ``rootfd`` without following a link;
    _Refused(404) when it is gone, _Refused(403) when it is not the very file pinned at start."""
    try:
        fd, st = open_path(rel, rootfd)
    except FileNotFoundError:
        raise _Refused(404) from None
    except OSError as exc:
        # Out of descriptors or memory is the server's state, not the file's: the peer retries.
        raise _Refused(503 if exc.errno in _SHORT_OF else 403) from None
    except SafeFileError:
        raise _Refused(403) from None
    if (st.st_dev, st.st_ino, st.st_size) != pin or not _disclosable(st):
        os.close(fd)
        raise _Refused(403)
    return fd, st.st_size


# ---------------------------------------------------------------------------
# HTTP


class _StallWriter:
    """The ``wfile`` of a handler: writes to a socket whose timeout is ``WRITE_STALL``, so a client that takes no
    byte for that long raises TimeoutError (each ``send`` waits for room for at least one byte, not for all)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[self.sock.send(view) :]
        return len(data)

    def flush(self) -> None:
        return


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` of a ``Range`` header for a file of ``size`` bytes; None for the whole file (no or another
    form of range, which HTTP lets a server ignore); _Refused(416) when it is not satisfiable."""
    match = _RANGE_RE.match(header or "")
    if not match:
        return None
    first, last = match.groups()
    if len(first) > _RANGE_DIGITS or int(first) >= size:
        raise _Refused(416)
    start, end = int(first), size - 1
    if last and len(last) <= _RANGE_DIGITS:
        end = min(int(last), end)
    if start > end:
        raise _Refused(416)
    return start, end


def make_handler(rootfd: int, token: str, files: Mapping[str, Pin], counter: Counter) -> RequestHandler:
    """A request handler class serving the catalog ``files`` below ``rootfd`` under ``/<token>/``.

    It answers one request whose head the gate has read whole, ``Handler(sock, client_address, head)``, and leaves
    the socket open for the caller to close."""
    prefix = f"/{token}/"

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "ttfleet-peer/2"
        protocol_version = "HTTP/1.1"

        def __init__(self, sock: socket.socket, client_address: Address, head: bytes) -> None:
            self.head = head
            # No server object: the gate read the head and owns the socket.
            super().__init__(sock, client_address, cast("Any", None))

        def setup(self) -> None:
            self.connection = self.request
            self.rfile = io.BytesIO(self.head)
            # Only write() and flush() of the handler's wfile are used.
            self.wfile = cast("io.BufferedIOBase", _StallWriter(self.connection))

        def finish(self) -> None:
            return

        def log_message(self, *_args: Any) -> None:
            return

        def _empty(self, code: int, headers: Iterable[tuple[str, str]] = ()) -> None:
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()

        def _serve(self, body: bool) -> None:
            path = urllib.parse.urlsplit(self.path).path
            # None (outside the prefix) is no catalog key: answered 404 below, so rel is a str past that.
            rel = cast("str", urllib.parse.unquote(path[len(prefix) :]) if path.startswith(prefix) else None)
            pin = files.get(rel)
            if pin is None:
                self._empty(404)
                return
            try:
                fd, size = open_pinned(rootfd, rel, pin)
            except _Refused as refused:
                self._empty(refused.code)
                return
            with os.fdopen(fd, "rb") as handle:
                try:
                    wanted = _range(self.headers.get("Range"), size)
                except _Refused as refused:
                    self._empty(refused.code, [("Content-Range", f"bytes */{size}")])
                    return
                if wanted:
                    start, end = wanted
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    start, end = 0, size - 1
                    self.send_response(200)
                length = max(end - start + 1, 0)
                self.send_header("Content-Length", str(length))
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Connection", "close")
                self.end_headers()
                if not body:
                    return
                done = 0
                while done < length:
                    # sendfile waits at most the socket's timeout (WRITE_STALL) for room for each piece.
                    sent = self.connection.sendfile(handle, start + done, min(CHUNK, length - done))
                    if not sent:  # the file shrank below its pinned size: the peer sees a short body
                        break
                    done += sent
                    counter.add(sent)

        def do_GET(self) -> None:
            self._serve(True)

        def do_HEAD(self) -> None:
            self._serve(False)

    return Handler


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
                if accepted and exc.errno in _SHORT_OF:
                    # The kernel takes the descriptor before it looks at the queue: this may be the end of the
                    # queue. Read the heads just accepted first; the next round tells.
                    return
                if exc.errno == errno.EMFILE:
                    # The limit is reached at this many connections: keep the cap to what fits.
                    self.cap = max(1, min(self.cap, self._open() // FDS_PER_CONNECTION))
                if exc.errno in _SHORT_OF and self.by_accept:
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


class Counter:
    """Bytes served, written to ``<name>.json.stats`` in the run directory at most every second and at exit."""

    def __init__(self, run_fd: int, name: str) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        self.run_fd = run_fd
        self.stats_name = _stats_name(name)
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


# ---------------------------------------------------------------------------
# State


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


def _state_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise PeerError(f"name {name!r} must be letters, digits, '.', '_' or '-' (it names the state file)")
    return f"{name}.json"


def _stats_name(name: str) -> str:
    return _state_name(name) + ".stats"


def state_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, _state_name(name))


def _open_run_dir(run_dir: str, create: bool) -> int | None:
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
        raise PeerError(f"cannot use run_dir {run_dir}: {_reason(exc)}") from None
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


def _read_state(run_fd: int, name: str) -> JSON | None:
    try:
        return read_json(run_fd, _state_name(name))
    except (OSError, SafeFileError):
        return None


def read_state(run_dir: str, name: str) -> JSON | None:
    """The state recorded for ``name`` (None when there is none or it is unreadable)."""
    fd = _open_run_dir(run_dir, create=False)
    if fd is None:
        return None
    try:
        return _read_state(fd, name)
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


def _starttime(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


# ---------------------------------------------------------------------------
# Start and stop


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
    run_dir: str = "/run/ttfleet-weights",
    name: str = "weights",
    kind: str = "weights",
    pinned: Catalog | None = None,
) -> JSON:
    """Start serving ``directory`` (a weights directory or, with ``kind="kernels"``, a kernel-store spool) on
    ``bind:port`` (0 picks a free port); returns the state dict, also written to ``<run_dir>/<name>.json``
    (mode 0600). ``pinned`` is a Catalog of ``directory`` already built by the caller (it is closed here)."""
    state_name = _state_name(name)
    cat = pinned or Catalog(directory, kind)
    run_fd = server = None
    try:
        # With create, a descriptor or PeerError: never None.
        run_fd = cast("int", _open_run_dir(run_dir, create=True))
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
            state["starttime"] = _starttime(state["pid"])
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
    state_name = _state_name(name)
    run_fd = _open_run_dir(run_dir, create=False)
    if run_fd is None:
        return False, 0
    try:
        state = _read_state(run_fd, name)
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
            served = int(read_json(run_fd, _stats_name(name), missing={}).get("served_bytes", 0))
        for leftover in (state_name, _stats_name(name)):
            unlink(run_fd, leftover)
        return running, served
    finally:
        os.close(run_fd)
