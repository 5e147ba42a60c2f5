# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The http store: a read-only store over HTTP with the path store's layout (a peer's temporary server, a web
server), each request bounded in time and sent to the store's origin only."""

from __future__ import annotations

import base64
import http.client
import re
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    MANIFEST_NAME,
    SHA_NAME,
    KernelError,
    entry_parts,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import (
    SHA_MAX,
    json_object,
    parse_sha_file,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, ProxyError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    connection,
    content_length,
    describe,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import DEFAULT_STALL, MAX_JSON_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import show_origin

if TYPE_CHECKING:
    from typing import NoReturn

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key


# The overall limit of a small store request (a manifest, a sha file) and the floor of the archive's, which grows by
# a second per MiB of its archive_bytes (_net.deadline.Deadline.for_size); the stall limit is the timeout option.
REQUEST_TOTAL = 300.0


def split_userinfo(url: str) -> tuple[str, dict[str, str]]:
    """``(url without user:password@, credential headers)``: HTTP basic credentials of a URL go in a header, sent
    only to that URL's origin."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _sep, hostport = parts.netloc.rpartition("@")
    user, _sep, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return urllib.parse.urlunsplit(parts._replace(netloc=hostport)), {
        "Authorization": "Basic " + base64.b64encode(pair).decode("ascii")
    }


class Body:
    """The body of a store's answer as a file object: a network error, a stall or the end of its deadline is a
    module_utils._net.errors.NetError naming the origin; closing it closes the connection."""

    def __init__(
        self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: Deadline, url: str
    ) -> None:
        self.resp = resp
        self.conn = conn
        self.deadline = deadline
        self.url = url
        self.headers = resp.headers

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.resp.read(size)
        except (http.client.HTTPException, OSError, ValueError) as exc:
            raise describe(exc, self.deadline, self.url) from None
        self.deadline.check()
        return data

    def read_capped(self, limit: int, what: str) -> bytes:
        return read_capped(self.resp, limit, what, self.url, self.deadline)

    def close(self) -> None:
        self.resp.close()
        self.conn.close()

    def __enter__(self) -> Body:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _too_slow(deadline: Deadline) -> bool:
    return deadline.expired or deadline.remaining() <= 0


class HttpStore:
    """Read-only store over HTTP with the path store's layout (a peer's temporary server, a web server).

    Every request goes to the origin of ``url`` and nowhere else: a peer's URL holds its access token in the path,
    so redirects are never followed. Each request has a stall limit (``timeout``) and an overall one (``total``;
    for the archive, more by its size). Requests are direct (a peer is on the site network, and a proxy would see
    the token of a plain-http peer) unless ``use_proxy``: then the environment's proxy is used as for any origin."""

    kind = "http"

    def __init__(
        self, url: str, timeout: float | None = 60, total: float = REQUEST_TOTAL, use_proxy: bool = False
    ) -> None:
        self.use_proxy = use_proxy
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise KernelError(f"store_url {url!r} is not an http(s) URL, for example http://peer-host:8765/")
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
            # Not shown: the path of a peer's URL is its access token.
            raise KernelError("store_url holds spaces or control characters; check the variable that sets it")
        self.url = url.rstrip("/") + "/"
        self.timeout = float(timeout or DEFAULT_STALL)
        self.total = float(total)
        # What messages, results and the marker show: no credentials, and not the path of the base URL, which for
        # a fleet peer (weights_server) is its access token; the marker is readable by every user of the host.
        parts = urllib.parse.urlsplit(self.url)
        base = "<base path>/" if parts.path.strip("/") else ""
        self.shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/{base}"
        target, self._headers = split_userinfo(self.url)
        target_parts = urllib.parse.urlsplit(target)
        try:
            self._port = target_parts.port
        except ValueError:
            raise KernelError(f"store_url {self.shown} has no usable port") from None
        if not target_parts.hostname:
            raise KernelError(f"store_url {self.shown} names no host; give one, for example http://peer-host:8765/")
        self._scheme = target_parts.scheme.lower()
        self._host = target_parts.hostname
        self._base = target_parts.path
        self._origin = show_origin(target)

    @staticmethod
    def _entry(key: Key, name: str) -> str:
        return "/".join(urllib.parse.quote(p, safe="") for p in [*entry_parts(key), name])

    def _url(self, key: Key, name: str) -> str:
        return self.url + self._entry(key, name)

    def describe(self, key: Key | None = None, name: str = "") -> str:
        return self.shown + self._entry(key, name) if key else self.shown

    def _failure(self, shown: str, exc: Exception, deadline: Deadline) -> KernelError:
        if isinstance(exc, ProxyError):
            return KernelError(f"{shown} failed: {exc}")
        if _too_slow(deadline):
            return KernelError(
                f"{shown} did not finish within its {deadline.total:.0f} s limit; the store is too slow or stalled. "
                "Check store_url and the network"
            )
        why = describe(exc, deadline, self._origin)
        return KernelError(f"{shown} failed: {why}; check store_url and that the store is serving")

    def _open(
        self, key: Key, name: str, missing_ok: bool = False, size: int | None = None, offset: int = 0
    ) -> Body | None:
        """A Body of the entry's file ``name``; None when missing and ``missing_ok``. With ``size``, an answer that
        declares another length is refused. With ``offset`` (and ``size``), the body starts at that byte: asked
        with ``Range``, and skipped to when the server sends the whole file instead (HTTP lets it)."""
        shown = self.describe(key, name)
        if size is None:
            deadline = Deadline(total=self.total, stall=self.timeout, what="the answer")
        else:
            deadline = Deadline.for_size(size - offset, stall=self.timeout, what="the archive", floor=self.total)
        headers = dict(self._headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        conn = None
        try:
            conn = connection(self._scheme, self._host, self._port, deadline, use_proxy=self.use_proxy)
            conn.request("GET", self._base + self._entry(key, name), headers=headers)
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError, ValueError, NetError) as exc:
            if conn is not None:
                conn.close()
            raise self._failure(shown, exc, deadline) from None
        try:
            if resp.status == 404 and missing_ok:
                resp.close()
                conn.close()
                return None
            if 300 <= resp.status < 400:
                location = resp.getheader("Location") or ""
                to = f" to {show_origin(location)}" if "://" in location else ""
                raise KernelError(
                    f"{shown} answered HTTP {resp.status}, a redirect{to}; a kernel store's redirects are not followed "
                    "(a peer's URL holds its access token). Set store_url to the store itself"
                )
            ranged = bool(offset) and resp.status == 206
            if resp.status != 200 and not ranged:
                raise KernelError(f"{shown} answered HTTP {resp.status}; check store_url and that the store is serving")
            declared = content_length(resp)
            wanted = f"bytes {offset}-{(size or 0) - 1}/{size}"
            if ranged and (resp.getheader("Content-Range") or "").strip() != wanted:
                raise KernelError(
                    f"{shown} answered the range from byte {offset} with Content-Range "
                    f"{printable(resp.getheader('Content-Range') or '(none)', 80)}, not the rest of an archive of "
                    f"{size} bytes (archive_bytes); refused"
                )
            if size is not None and declared is not None and declared != size - (offset if ranged else 0):
                raise KernelError(
                    f"{shown} is {declared + (offset if ranged else 0)} bytes where its manifest states {size} "
                    "(archive_bytes); refused. Remove the store entry and harvest again"
                )
            body = Body(resp, conn, deadline, self._origin)
            skip = offset if offset and not ranged else 0
            while skip:
                # The server ignored the range: what the last holder sent already is read past, not kept.
                dropped = len(body.read(min(skip, 1 << 20)))
                if not dropped:
                    raise KernelError(f"{shown} ended before byte {offset}, where the transfer resumes")
                skip -= dropped
        except BaseException:
            resp.close()
            conn.close()
            raise
        return body

    def _read_small(self, key: Key, name: str, limit: int, missing_ok: bool = False) -> bytes | None:
        body = self._open(key, name, missing_ok=missing_ok)
        if body is None:
            return None
        with body:
            try:
                return body.read_capped(limit, name)
            except NetError as exc:
                raise self._failure(self.describe(key, name), exc, body.deadline) from None

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read_small(key, MANIFEST_NAME, MAX_JSON_BYTES, missing_ok=True)
        if raw is None:
            return None
        return json_object(raw, self.describe(key, MANIFEST_NAME), "is store_url a kernel store?")

    def read_sha(self, key: Key) -> str:
        # Never None: only missing_ok makes _read_small return None.
        raw = cast(bytes, self._read_small(key, SHA_NAME, SHA_MAX))
        return parse_sha_file(raw.decode("ascii", "replace"), self.describe(key, SHA_NAME))

    def open_archive(self, key: Key, size: int | None = None, offset: int = 0) -> Body:
        # Never None: only missing_ok makes _open return None.
        return cast(Body, self._open(key, ARCHIVE_NAME, size=size, offset=offset))

    def siblings(self, key: Key) -> list[Key]:
        return []

    def writer(self, key: Key) -> NoReturn:
        raise KernelError(f"the http store {self.shown} is read-only; harvest into a path or s3 store")
