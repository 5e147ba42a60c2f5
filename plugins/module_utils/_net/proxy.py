# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The one rule for HTTP(S) proxies, read from the environment the way urllib and ``ansible.module_utils.urls`` read it
(``https_proxy``/``HTTPS_PROXY``, ``http_proxy``/``HTTP_PROXY``, ``no_proxy``/``NO_PROXY``; lowercase wins).

Origin clients (the Hub, S3, registries, kernel stores) pass ``use_proxy=True`` to ``http.connection`` and
``http.open_url``; peers and instance ports stay direct. An https origin is reached through a CONNECT tunnel, so TLS
runs end to end and its credentials never reach the proxy; the proxy's own credentials go in ``Proxy-Authorization``
(on CONNECT only, for https). An http origin is asked in absolute form through the proxy, and a request to it that
carries credentials is refused (they would cross the proxy in the clear). A proxy that is unreachable, stalls, lies or
answers CONNECT with garbage is a ``ProxyError`` naming the proxy (its password masked), under the same deadlines as
any other call.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import os
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import ProxyError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_proxy, printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline

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
    scheme, host, port = origin_of(url)
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
