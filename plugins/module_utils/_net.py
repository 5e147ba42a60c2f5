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
- ``proxy_for``: the one rule for HTTP(S) proxies, the way urllib and ``ansible.module_utils.urls`` read the environment
  (``https_proxy``/``HTTPS_PROXY``, ``http_proxy``/``HTTP_PROXY``, ``no_proxy``/``NO_PROXY``; lowercase wins). Origin
  clients (the Hub, S3, registries, kernel stores) pass ``use_proxy=True``; peers and instance ports stay direct. An
  https origin is reached through a CONNECT tunnel, so TLS runs end to end and its credentials never reach the proxy;
  the proxy's own credentials go in ``Proxy-Authorization`` (on CONNECT only, for https). An http origin is asked in
  absolute form through the proxy, and a request to it that carries credentials is refused (they would cross the
  proxy in the clear). A proxy that is unreachable, stalls, lies or answers CONNECT with garbage is a ``ProxyError``
  naming the proxy (its password masked), under the same deadlines as any other call.

A protocol error (``http.client.HTTPException``, a reset, a timeout, a TLS error) is a ``NetError`` naming the
origin and the request; callers count it as a failure.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import os
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


class ProxyError(NetError, OSError):
    """A proxy that is misconfigured, unreachable, stalls or breaks the protocol; or a request it must not carry.

    An OSError too, so that every caller that counts a failed connection counts this one; ``describe`` keeps its
    message, which names the proxy (never its password) rather than the origin."""


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


# The proxy variables of each origin scheme, as urllib reads them (lowercase first: it wins when both are set).
PROXY_VARIABLES = {"http": ("http_proxy", "HTTP_PROXY"), "https": ("https_proxy", "HTTPS_PROXY")}
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")


def _setting(environ: Mapping[str, str], names: tuple[str, str]) -> tuple[str, str] | None:
    """``(variable, value)`` of the first of ``names`` that is set, lowercase first, as urllib's
    ``getproxies_environment`` reads them: a lowercase variable set to the empty string turns the setting off."""
    for name in names:
        if name in environ:
            value = environ[name].strip()
            return (name, value) if value else None
    return None


def mask_proxy(value: str) -> str:
    """``value`` (a proxy URL) with its password replaced by ``***``: ``http://user:***@proxy:3128``."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        userinfo, _at, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}"
    return printable(f"{scheme}{sep}{netloc}{slash}{path}", 200)


class Proxy:
    """An HTTP proxy read from ``variable``; ``shown`` is its URL with the password masked (what messages use)."""

    def __init__(self, variable: str, value: str) -> None:
        self.variable = variable
        self.shown = mask_proxy(value)
        text = value if "://" in value else "http://" + value  # urllib and curl read "host:port" as http
        parts = urllib.parse.urlsplit(text)
        fix = f"set {variable} to http://[user:password@]host:port"
        if parts.scheme.lower() != "http":
            raise ProxyError(
                f"{variable} is {self.shown}, a {parts.scheme} proxy; only http:// proxies are supported (https "
                f"origins still run TLS end to end through them): {fix}"
            )
        try:
            port = parts.port
        except ValueError:
            raise ProxyError(f"{variable} is {self.shown}, whose port is not a number from 0 to 65535: {fix}") from None
        if not parts.hostname:
            raise ProxyError(f"{variable} is {self.shown}, which names no host: {fix}")
        self.host = parts.hostname
        self.port = port or 80
        self.authorization = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")

    def headers(self) -> dict[str, str]:
        """The header that carries the proxy's own credentials, if it has any."""
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def __repr__(self) -> str:
        return f"Proxy({self.shown!r} from {self.variable})"

    def failure(self, target: str, exc: BaseException, deadline: Deadline | None) -> ProxyError:
        """The ProxyError of a connection through this proxy to ``target`` (host:port) that failed before the origin
        was reached."""
        if isinstance(exc, ProxyError):
            return exc
        fix = f"check {self.variable} and that the proxy runs, or list {target.rpartition(':')[0]} in NO_PROXY"
        head = f"the proxy {self.shown} ({self.variable}), on the way to {target},"
        if deadline is not None and deadline.expired:
            return ProxyError(f"{head} did not finish within the {deadline.total:.0f} s limit ({deadline.what}); {fix}")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            stall = f"{deadline.stall:.0f} s" if deadline is not None else "the stall limit"
            return ProxyError(f"{head} stalled: no data for {stall}; {fix}")
        if isinstance(exc, http.client.HTTPException):
            return ProxyError(f"{head} broke the HTTP protocol ({type(exc).__name__}: {printable(exc, 200)}); {fix}")
        text = str(exc)
        if text.startswith("Tunnel connection failed: "):
            answer = printable(text.partition(": ")[2], 200)
            # 407 is the standard answer; tinyproxy answers a CONNECT with bad credentials with 401.
            hint = "; check the user and password in " + self.variable if answer[:3] in ("401", "407") else ""
            return ProxyError(f"{head} refused the tunnel: HTTP {answer}{hint}; {fix}")
        return ProxyError(f"{head} failed: {type(exc).__name__}: {printable(exc, 200)}; {fix}")


def bypasses(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``host`` (port ``port``) matches an entry of ``no_proxy`` (a NO_PROXY value): ``*``; a host name that
    is the host or a domain it is in (``example.com`` and ``.example.com`` both match ``example.com`` and
    ``a.example.com``, as in urllib); any of these with ``:port``; an IP address; a network in CIDR form."""
    host = host.lower().strip("[]").rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        name, sep, entry_port = entry.rpartition(":")
        if sep and entry_port.isdigit() and (":" not in name or name.endswith("]")):
            if int(entry_port) != port:
                continue
            entry = name
        entry = entry.strip("[]").rstrip(".")
        if not entry:
            continue
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            continue
        entry = entry.lstrip(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(url: str, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy that ``url`` goes through under ``environ`` (default: this process's environment), or None for a
    direct connection. A proxy variable that cannot be used is a ProxyError naming it, its password masked."""
    environ = os.environ if environ is None else environ
    scheme, host, port = origin(url)
    names = PROXY_VARIABLES.get(scheme)
    setting = _setting(environ, names) if names else None
    if setting is None:
        return None
    no_proxy = _setting(environ, NO_PROXY_VARIABLES)
    if no_proxy is not None and bypasses(host, port, no_proxy[1]):
        return None
    return Proxy(*setting)


# The option of the modules that fetch from origins (doc fragment ttfleet.inference.proxy).
PROXY_OPTIONS: dict[str, dict[str, Any]] = {"proxy_env": {"type": "dict", "default": {}}}


def apply_proxy_env(module: Any) -> None:
    """Put the module's ``proxy_env`` option into its process environment, where ``proxy_for`` reads it, after
    registering the passwords of its proxy URLs as no_log values; a key that is not a proxy variable fails the
    module with a message naming it."""
    values = module.params.get("proxy_env") or {}
    known = PROXY_VARIABLES["http"] + PROXY_VARIABLES["https"] + NO_PROXY_VARIABLES
    for name, value in values.items():
        if name not in known or not isinstance(value, str):
            module.fail_json(
                msg=f"proxy_env holds {printable(name, 60)!r}, which is not a proxy variable with a text value; give "
                f"only {', '.join(known)}, each a string"
            )
        if name in NO_PROXY_VARIABLES:
            continue
        userinfo = urllib.parse.urlsplit(value if "://" in value else "http://" + value).netloc.rpartition("@")[0]
        password = userinfo.partition(":")[2]
        for secret in (userinfo, password):
            if secret:
                module.no_log_values.add(secret)
    os.environ.update(values)


class _Watchdog:
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


def watch(sock: socket.socket, deadline: Deadline) -> _Watchdog:
    """Arm the overall limit of ``deadline`` on ``sock`` and set its per-read timeout to the stall limit."""
    sock.settimeout(deadline.timeout())
    return _Watchdog(sock, deadline)


class _Watched(_ConnectionBase):
    """Mixin for http.client connections: arm the watchdog as soon as the socket exists (before a proxy's CONNECT and
    the TLS handshake, which a dripping peer could otherwise hold open), and speak to a proxy when given one."""

    ttfleet_deadline: Deadline | None = None
    ttfleet_watch: _Watchdog | None = None
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
                    *origin(req.full_url), deadline, kw.get("context"), use_proxy=use_proxy, environ=environ
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
        credential_origin = origin(url)
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
