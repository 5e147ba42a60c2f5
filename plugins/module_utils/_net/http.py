# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Bounded HTTP for every network call of the collection: connections, requests and bodies.

Origins, peers and instance ports may be hostile or broken. Everything that talks to them goes through these:

- ``connection``/``open_url``: arm the watchdog of their ``Deadline`` as soon as the socket exists, so that neither a
  proxy's CONNECT, the TLS handshake, the headers nor the body can hold a call past its overall limit. With
  ``use_proxy`` they go through the proxy ``proxy.proxy_for`` picks.
- ``read_capped``/``copy_capped``: a body is read up to a cap (a reply) or exactly the bytes expected (a file);
  one byte more fails at once, before it is written.
- ``open_url``: http and https only, at most ``MAX_REDIRECTS`` redirects, never https -> http, and the credential
  headers go only to the origin (scheme, host, port) they were configured for, on redirects and on any later URL
  (pagination) alike. Hugging Face's CDN redirects (another host, a signed URL) still work: only the credentials
  stay behind.
- ``describe``: a protocol error (``http.client.HTTPException``, a reset, a timeout, a TLS error) as a ``NetError``
  naming the origin and the request; callers count it as a failure.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline, Watchdog, seconds, watch
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, ProxyError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import CHUNK, MAX_REDIRECTS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import Proxy, proxy_for
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of, show_origin

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO, Protocol

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import Origin

    class Readable(Protocol):
        """What ``read_capped`` and ``copy_capped`` read from: a response or a wrapper of one."""

        def read(self, amt: int, /) -> bytes:
            ...

    # For mypy the mixin is the connection it is mixed into; at run time it stays a plain class.
    _ConnectionBase = http.client.HTTPConnection
else:
    _ConnectionBase = object

# Request headers that carry credentials: never sent outside their origin.
CREDENTIAL_HEADERS = ("authorization", "x-amz-security-token", "x-api-key", "cookie", "proxy-authorization")


class _Watched(_ConnectionBase):
    """Mixin for http.client connections: arm the watchdog as soon as the socket exists (before a proxy's CONNECT and
    the TLS handshake, which a dripping peer could otherwise hold open), and speak to a proxy when given one."""

    ttfleet_deadline: Deadline | None = None
    ttfleet_watch: Watchdog | None = None
    # The proxy this connection goes through, and for an http origin through it the origin's URL prefix
    # ("http://host:port") that turns a request path into the absolute form a proxy expects.
    ttfleet_proxy: Proxy | None = None
    ttfleet_absolute: str | None = None
    ttfleet_target: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # http.client opens its socket through this instance attribute (connect() and, for a tunnel, before CONNECT).
        self._create_connection = self._create_watched

    def _create_watched(
        self, address: tuple[str, int], timeout: float | None = None, source_address: tuple[str, int] | None = None
    ) -> socket.socket:
        try:
            sock = socket.create_connection(address, timeout, source_address)
        except OSError as exc:
            if self.ttfleet_proxy is not None:
                raise self.ttfleet_proxy.failure(self.ttfleet_target, exc, self.ttfleet_deadline) from None
            raise
        if self.ttfleet_deadline is not None:
            self.ttfleet_watch = watch(sock, self.ttfleet_deadline)
        return sock

    def connect(self) -> None:
        deadline = self.ttfleet_deadline
        if deadline is not None:
            self.timeout = deadline.timeout()
            deadline.via = self.ttfleet_proxy.shown if self.ttfleet_proxy is not None else None
        super().connect()

    def _tunnel(self) -> None:
        # CONNECT: whatever goes wrong here is the proxy's, and the error says so.
        try:
            super()._tunnel()  # type: ignore[misc]
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if self.ttfleet_proxy is None:
                raise
            raise self.ttfleet_proxy.failure(self.ttfleet_target, exc, self.ttfleet_deadline) from None
        deadline = self.ttfleet_deadline
        if self.ttfleet_proxy is not None and deadline is not None and deadline.expired:
            # The watchdog shut the socket while the proxy dripped its answer's headers: http.client reads the end
            # of the stream as their end and takes the tunnel for open.
            raise self.ttfleet_proxy.failure(self.ttfleet_target, deadline.error(), deadline)

    def putrequest(self, method: str, url: str, skip_host: bool = False, skip_accept_encoding: bool = False) -> None:
        if self.ttfleet_absolute is not None and url.startswith("/"):
            url = self.ttfleet_absolute + url
        super().putrequest(method, url, skip_host=skip_host, skip_accept_encoding=skip_accept_encoding)
        if self.ttfleet_absolute is not None and self.ttfleet_proxy is not None:
            for name, value in self.ttfleet_proxy.headers().items():
                super().putheader(name, value)

    def putheader(self, header: str | bytes, *values: Any) -> None:
        name = header.decode("latin-1") if isinstance(header, bytes) else header
        proxy = self.ttfleet_proxy
        credential = name.lower() in CREDENTIAL_HEADERS and name.lower() != "proxy-authorization"
        if credential and self.ttfleet_absolute and proxy:
            raise ProxyError(
                f"a request to {self.ttfleet_absolute} carries credentials ({name}), which would cross the proxy "
                f"{proxy.shown} ({proxy.variable}) in the clear; nothing was sent. Use https for that origin, or "
                "list its host in NO_PROXY to reach it directly"
            )
        super().putheader(header, *values)

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
        if response.status == 407 and self.ttfleet_absolute is not None and self.ttfleet_proxy is not None:
            response.close()
            raise self.ttfleet_proxy.failure(
                self.ttfleet_target, OSError("Tunnel connection failed: 407 Proxy Authentication Required"), None
            )
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
    scheme: str,
    host: str,
    port: int | None,
    deadline: Deadline,
    context: ssl.SSLContext | None = None,
    use_proxy: bool = False,
    environ: Mapping[str, str] | None = None,
) -> WatchedHTTPConnection | WatchedHTTPSConnection:
    """An http.client connection to ``scheme://host:port`` bounded by ``deadline``. With ``use_proxy`` (origin
    clients; never peers or instance ports) it goes through the proxy ``proxy_for`` picks from ``environ``."""
    if scheme not in ("http", "https"):
        raise NetError(f"{scheme}://{host} is not an http or https URL")
    port = port or (443 if scheme == "https" else 80)
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    proxy = proxy_for(f"{scheme}://{hostport}/", environ) if use_proxy else None
    conn: WatchedHTTPConnection | WatchedHTTPSConnection
    if proxy is None:
        if scheme == "https":
            conn = WatchedHTTPSConnection(host, port, timeout=deadline.timeout(), context=context)
        else:
            conn = WatchedHTTPConnection(host, port, timeout=deadline.timeout())
    elif scheme == "https":
        conn = WatchedHTTPSConnection(proxy.host, proxy.port, timeout=deadline.timeout(), context=context)
        conn.set_tunnel(host, port, headers=proxy.headers())
    else:
        conn = WatchedHTTPConnection(proxy.host, proxy.port, timeout=deadline.timeout())
        conn.ttfleet_absolute = "http://" + (hostport if port != 80 else hostport.rpartition(":")[0])
    conn.ttfleet_proxy = proxy
    conn.ttfleet_target = hostport
    conn.ttfleet_deadline = deadline
    return conn


def _handler(
    base: type[urllib.request.AbstractHTTPHandler],
    deadline: Deadline,
    use_proxy: bool,
    environ: Mapping[str, str] | None,
    **kwargs: Any,
) -> type[urllib.request.AbstractHTTPHandler]:
    # ``base`` is HTTPHandler or HTTPSHandler, chosen at run time: mypy cannot take a variable as a base class.
    class Handler(base):  # type: ignore[valid-type,misc]
        def _open_with(
            self, req: urllib.request.Request, opener: Callable[..., http.client.HTTPResponse]
        ) -> http.client.HTTPResponse:
            def factory(_host: str, **kw: Any) -> _Watched:
                # Each request (a redirect too) is routed on its own URL: a CDN may be in NO_PROXY, the origin not.
                return connection(
                    *origin_of(req.full_url), deadline, kw.get("context"), use_proxy=use_proxy, environ=environ
                )

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
        here = origin_of(req.full_url)
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
    if credential_origin is not None and origin_of(req.full_url) == credential_origin:
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
    use_proxy: bool = False,
    environ: Mapping[str, str] | None = None,
) -> http.client.HTTPResponse:
    """Open ``url`` (urllib) bounded by ``deadline``; ``credentials`` (a dict of headers) go only to
    ``credential_origin`` (default: the origin of ``url``), on this request and every redirect. With ``use_proxy``,
    each request goes through the proxy ``proxy_for`` picks for its URL (see ``connection``)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise NetError(f"{printable(url, 120)} is not an http or https URL")
    if credential_origin is None:
        credential_origin = origin_of(url)
    https_kwargs = {"context": context} if context is not None else {}
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.UnknownHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        RedirectPolicy(credential_origin),
        _handler(urllib.request.HTTPHandler, deadline, use_proxy, environ)(),
        _handler(urllib.request.HTTPSHandler, deadline, use_proxy, environ, **https_kwargs)(),
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
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, NetError):
        exc = exc.reason
    if isinstance(exc, NetError):
        return exc
    where = show_origin(url)
    if deadline is not None and deadline.via:
        where += f" (through the proxy {deadline.via})"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    timed_out = isinstance(reason, (socket.timeout, TimeoutError))
    # A socket timeout that the overall limit had cut short is that limit, not a stall (on a loaded machine the socket
    # can give up a hair before the clock says the limit has passed).
    if deadline is not None and (deadline.expired or (timed_out and (deadline.capped or deadline.remaining() <= 0))):
        return NetError(f"{deadline.what} from {where}: {deadline.error()}")
    if timed_out:
        return NetError(
            f"{deadline.what if deadline else 'the request'} from {where} stalled: no data for "
            f"{seconds(deadline.stall) if deadline else '?'} s"
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
