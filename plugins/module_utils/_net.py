# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Bounds for every network call of the collection: time, bytes, redirects, credentials and untrusted text.

Origins, peers and instance ports may be hostile or broken. Everything that talks to them goes through these:

- ``Deadline``: a stall limit (no byte for ``stall`` seconds: the per-read socket timeout) and an overall limit.
  ``open_url``/``connection`` arm a watchdog that shuts the socket down when the overall limit passes, so a peer
  that drips one byte a second, or sends its headers that way, cannot hold a call past it.
- ``read_capped``/``copy_capped``: a body is read up to a cap (a reply) or exactly the bytes expected (a file);
  one byte more fails at once, before it is written.
- ``open_url``: http and https only, at most ``MAX_REDIRECTS`` redirects, never https -> http, and the credential
  headers go only to the origin (scheme, host, port) they were configured for, on redirects and on any later URL
  (pagination) alike. Hugging Face's CDN redirects (another host, a signed URL) still work: only the credentials
  stay behind.
- ``printable``: untrusted text (file names, error bodies, states read from hosts) made safe for a terminal.

A protocol error (``http.client.HTTPException``, a reset, a timeout, a TLS error) is a ``NetError`` naming the
origin and the request; callers count it as a failure.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO, Protocol, TypeAlias

    # (scheme, host, port) of a URL, as ``origin`` gives it.
    Origin: TypeAlias = tuple[str, str, int | None]

    class Readable(Protocol):
        """What ``read_capped`` and ``copy_capped`` read from: a response or a wrapper of one."""

        def read(self, amt: int, /) -> bytes:
            ...

    # For mypy the mixin is the connection it is mixed into; at run time it stays a plain class.
    _ConnectionBase = http.client.HTTPConnection
else:
    _ConnectionBase = object

KIB = 1024
MIB = 1024 * KIB

# Caps on what one reply may hold (docs/security.md lists them with the timeouts).
MAX_JSON_BYTES = 32 * MIB  # a Hub file-list page, a manifest, a revision answer
MAX_XML_BYTES = 16 * MIB  # an S3 ListObjectsV2 page or error document
MAX_ERROR_BYTES = 64 * KIB  # an error body kept for a message
MAX_HEALTH_BYTES = 64 * KIB  # an instance's /health or /v1/models answer
MAX_LISTED_FILES = 200_000  # files in one listing (a model has hundreds; a Hub repository allows 100,000)
MAX_REDIRECTS = 5
CHUNK = 1 * MIB

DEFAULT_STALL = 60.0  # seconds without a byte
DEFAULT_TOTAL = 600.0  # seconds for a request whose size is small or unknown
MIN_RATE = 1 * MIB  # bytes/s a transfer may not stay below for long: a file's deadline grows with its size

# Request headers that carry credentials: never sent outside their origin.
CREDENTIAL_HEADERS = ("authorization", "x-amz-security-token", "x-api-key", "cookie", "proxy-authorization")

_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class NetError(Exception):
    """A network call that failed: refused, too slow, too large, or not speaking the protocol."""


def printable(text: object, limit: int = 512) -> str:
    """``text`` with control characters (ESC, OSC, CR, LF, C1, bidi overrides) shown as escapes, cut at ``limit``."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        text = text[:limit] + f"...({len(text) - limit} more characters)"
    return _UNSAFE_TEXT.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def origin(url: str) -> Origin:
    """(scheme, host, port) of ``url``, default ports filled in, host lower-cased."""
    parts = urllib.parse.urlsplit(url)
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def show_origin(url: str) -> str:
    scheme, host, port = origin(url)
    return f"{scheme}://{host}:{port}"


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

    def remaining(self) -> float:
        return self.total - (self.clock() - self.start)

    def timeout(self) -> float:
        """The socket timeout for the next operation: the stall limit, never past the overall limit."""
        left = self.remaining()
        if left <= 0:
            raise self.error()
        return max(0.05, min(self.stall, left))

    def check(self) -> None:
        if self.remaining() <= 0:
            raise self.error()

    def error(self) -> NetError:
        self.expired = True
        return NetError(f"{self.what} did not finish within its {self.total:.0f} s limit")

    def stalled(self, where: str = "") -> NetError:
        return NetError(f"{self.what} stalled: no data for {self.stall:.0f} s{where}")


class _Watchdog:
    """Shuts a socket down when its deadline passes, whatever read or write it is blocked in."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self.sock = sock
        self.deadline = deadline
        self.timer = threading.Timer(max(0.0, deadline.remaining()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.deadline.expired = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()


def watch(sock: socket.socket, deadline: Deadline) -> _Watchdog:
    """Arm the overall limit of ``deadline`` on ``sock`` and set its per-read timeout to the stall limit."""
    sock.settimeout(deadline.timeout())
    return _Watchdog(sock, deadline)


class _Watched(_ConnectionBase):
    """Mixin for http.client connections: arm the watchdog as soon as the socket exists."""

    ttfleet_deadline: Deadline | None = None
    ttfleet_watch: _Watchdog | None = None

    def connect(self) -> None:
        deadline = self.ttfleet_deadline
        if deadline is not None:
            self.timeout = deadline.timeout()
        super().connect()
        if deadline is not None:
            self.ttfleet_watch = watch(self.sock, deadline)

    def getresponse(self) -> http.client.HTTPResponse:
        # http.client closes a "Connection: close" connection as soon as the headers are in, while the body is still
        # to come: the watchdog moves to the response and stays armed until the response is closed (or fires).
        watch, self.ttfleet_watch = self.ttfleet_watch, None
        try:
            response = super().getresponse()
        except BaseException:
            if watch is not None:
                watch.cancel()
            raise
        if watch is not None:
            close = response.close

            def close_and_disarm() -> None:
                watch.cancel()
                close()

            # Replaced on this one response object: the watchdog lives as long as the response.
            response.close = close_and_disarm  # type: ignore[method-assign]
        return response

    def close(self) -> None:
        if self.ttfleet_watch is not None:
            self.ttfleet_watch.cancel()
        super().close()


class WatchedHTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


def connection(
    scheme: str, host: str, port: int | None, deadline: Deadline, context: ssl.SSLContext | None = None
) -> WatchedHTTPConnection | WatchedHTTPSConnection:
    """An http.client connection to ``scheme://host:port`` bounded by ``deadline``."""
    conn: WatchedHTTPConnection | WatchedHTTPSConnection
    if scheme == "https":
        conn = WatchedHTTPSConnection(host, port, timeout=deadline.timeout(), context=context)
    elif scheme == "http":
        conn = WatchedHTTPConnection(host, port, timeout=deadline.timeout())
    else:
        raise NetError(f"{scheme}://{host} is not an http or https URL")
    conn.ttfleet_deadline = deadline
    return conn


def _handler(
    base: type[urllib.request.AbstractHTTPHandler], conn_class: type[_Watched], deadline: Deadline, **kwargs: Any
) -> type[urllib.request.AbstractHTTPHandler]:
    # ``base`` is HTTPHandler or HTTPSHandler, chosen at run time: mypy cannot take a variable as a base class.
    class Handler(base):  # type: ignore[valid-type,misc]
        def _open_with(
            self, req: urllib.request.Request, opener: Callable[..., http.client.HTTPResponse]
        ) -> http.client.HTTPResponse:
            def factory(host: str, **kw: Any) -> _Watched:
                kw.pop("timeout", None)
                conn = conn_class(host, timeout=deadline.timeout(), **kw)
                conn.ttfleet_deadline = deadline
                return conn

            return opener(factory, req, **kwargs)

    if base is urllib.request.HTTPSHandler:

        def https_open(self: Handler, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self._open_with(req, self.do_open)

        Handler.https_open = https_open
    else:

        def http_open(self: Handler, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self._open_with(req, self.do_open)

        Handler.http_open = http_open
    return Handler


class RedirectPolicy(urllib.request.HTTPRedirectHandler):
    """Redirects only to http(s), at most MAX_REDIRECTS, never https -> http; credentials stay with their origin."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 2

    def __init__(self, credential_origin: Origin | None) -> None:
        super().__init__()
        self.credential_origin = credential_origin

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        target = urllib.parse.urlsplit(newurl)
        here = origin(req.full_url)
        if target.scheme.lower() not in ("http", "https"):
            raise NetError(
                f"{show_origin(req.full_url)} redirected to a {target.scheme or 'schemeless'} URL; only "
                "http and https are followed"
            )
        if here[0] == "https" and target.scheme.lower() == "http":
            raise NetError(f"{show_origin(req.full_url)} redirected from https to http; downgrades are refused")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            strip_credentials(new, self.credential_origin)
        return new


def strip_credentials(req: urllib.request.Request, credential_origin: Origin | None) -> None:
    """Drop every credential header of ``req`` unless it goes to ``credential_origin``."""
    if credential_origin is not None and origin(req.full_url) == credential_origin:
        return
    for name in list(req.headers) + list(req.unredirected_hdrs):
        if name.lower() in CREDENTIAL_HEADERS:
            req.remove_header(name)


def open_url(
    url: str,
    deadline: Deadline,
    headers: Mapping[str, str] | None = None,
    credentials: Mapping[str, str] | None = None,
    credential_origin: Origin | None = None,
    method: str | None = None,
    context: ssl.SSLContext | None = None,
) -> http.client.HTTPResponse:
    """Open ``url`` (urllib) bounded by ``deadline``; ``credentials`` (a dict of headers) go only to
    ``credential_origin`` (default: the origin of ``url``), on this request and every redirect."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise NetError(f"{printable(url, 120)} is not an http or https URL")
    if credential_origin is None:
        credential_origin = origin(url)
    https_kwargs = {"context": context} if context is not None else {}
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.UnknownHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        RedirectPolicy(credential_origin),
        _handler(urllib.request.HTTPHandler, WatchedHTTPConnection, deadline)(),
        _handler(urllib.request.HTTPSHandler, WatchedHTTPSConnection, deadline, **https_kwargs)(),
    ):
        opener.add_handler(handler)
    req = urllib.request.Request(url, headers=dict(headers or {}), method=method)
    for name, value in (credentials or {}).items():
        req.add_header(name, value)
    strip_credentials(req, credential_origin)
    try:
        return opener.open(req, timeout=deadline.timeout())
    except urllib.error.HTTPError:
        raise
    except NetError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ssl.SSLError, ValueError) as exc:
        raise describe(exc, deadline, url) from None


def describe(exc: BaseException, deadline: Deadline | None, url: str) -> NetError:
    """A NetError for a failed call to ``url``, naming the origin and what went wrong."""
    where = show_origin(url)
    if isinstance(exc, NetError):
        return exc
    if deadline is not None and deadline.expired:
        return NetError(f"{deadline.what} from {where}: {deadline.error()}")
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return NetError(
            f"{deadline.what if deadline else 'the request'} from {where} stalled: no data for "
            f"{deadline.stall if deadline else '?'} s"
        )
    if isinstance(exc, http.client.HTTPException):
        return NetError(f"{where} broke the HTTP protocol ({type(exc).__name__}: {printable(exc, 200)})")
    return NetError(f"{where} failed: {type(reason).__name__}: {printable(reason, 200)}")


def _read_some(resp: Readable, size: int, deadline: Deadline | None, url: str) -> bytes:
    try:
        data = resp.read(size)
    except (http.client.HTTPException, OSError, ssl.SSLError, ValueError) as exc:
        raise describe(exc, deadline, url) from None
    if deadline is not None:
        deadline.check()
    return data


def content_length(resp: Any) -> int | None:
    value = resp.headers.get("Content-Length") if getattr(resp, "headers", None) is not None else None
    if value is None or not str(value).strip().isdigit():
        return None
    return int(value)


def _check_complete(declared: int | None, got: int, what: str, url: str) -> None:
    if declared is not None and got < declared:
        raise NetError(f"{show_origin(url)} broke the HTTP protocol: {what} ended after {got} of its {declared} bytes")


def read_capped(resp: Readable, limit: int, what: str, url: str = "", deadline: Deadline | None = None) -> bytes:
    """The whole body of ``resp``, refused once it passes ``limit`` bytes (a Content-Length above it is refused
    before reading)."""
    declared = content_length(resp)
    if declared is not None and declared > limit:
        raise NetError(f"{what} from {show_origin(url)} is {declared} bytes, above the {limit}-byte cap")
    chunks: list[bytes]
    chunks, total = [], 0
    while True:
        data = _read_some(resp, min(CHUNK, limit + 1 - total), deadline, url)
        if not data:
            _check_complete(declared, total, what, url)
            return b"".join(chunks)
        total += len(data)
        if total > limit:
            raise NetError(f"{what} from {show_origin(url)} passed the {limit}-byte cap")
        chunks.append(data)


def copy_capped(
    resp: Readable,
    write: Callable[[bytes], object],
    expected: int,
    what: str,
    url: str = "",
    deadline: Deadline | None = None,
) -> int:
    """Copy exactly the ``expected`` remaining bytes of ``resp`` to ``write``; a byte more is refused before it
    is written, and a body that ends early returns the short count. Returns the bytes written."""
    declared = content_length(resp)
    if declared is not None and declared > expected:
        raise NetError(f"{what} from {show_origin(url)} is {declared} bytes, more than the {expected} expected")
    done = 0
    while done < expected:
        data = _read_some(resp, min(CHUNK, expected - done), deadline, url)
        if not data:
            _check_complete(declared, done, what, url)
            return done
        write(data)
        done += len(data)
    if _read_some(resp, 1, deadline, url):
        raise NetError(f"{what} from {show_origin(url)} sent more than the {expected} bytes expected")
    return done
