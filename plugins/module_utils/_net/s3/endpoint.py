# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Signed requests to one S3 endpoint: the plumbing under ``client.S3Client``.

Addressing is path-style (``<endpoint>/<bucket>/<key>``), which every S3-compatible server (MinIO, SeaweedFS, Ceph RGW,
Garage, AWS itself) accepts; the endpoint may carry a base path. Requests are signed with ``sigv4`` and sent with
``http.client`` through ``_net.http.connection``.

Temporary credentials (AWS STS: the access key, secret key and session token of one session) work too: the token goes
in the ``x-amz-security-token`` header, which is signed with the others. Credentials are only ever used to compute
signatures and fill that header: they never appear in an exception message, a URL or a log line (``S3Error`` messages
name the method, endpoint, bucket and key, the HTTP status and the server's error code). A network or protocol error
(not HTTP, a reset, a TLS error, a stall) is an ``S3Error`` too.

Endpoints may be hostile (``_net.limits`` and ``_net.deadline`` hold the shared bounds): every request goes to the
endpoint's origin only (no redirect is ever followed, so signatures and the token stay there); each has a stall limit
(``timeout``) and an overall limit (``total``, more for an object by its size); answers are capped (a listing page at
``MAX_XML_BYTES``, an error document at ``MAX_ERROR_BYTES``); text from the endpoint is made printable.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import os
import re
import socket
import ssl
import time
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, ProxyError, S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    connection,
    content_length,
    describe,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import (
    DEFAULT_STALL,
    MAX_ERROR_BYTES,
    MAX_XML_BYTES,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import hide_userinfo, printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.sigv4 import (
    UNSIGNED_PAYLOAD,
    canonical_query,
    sign_v4,
    uri_encode,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.xml import parse_error

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import BinaryIO, NoReturn

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.sigv4 import Query

DEFAULT_REGION = "us-east-1"
ATTEMPTS = 3
# The overall limit of a request whose answer is small (HEAD, a listing page, a manifest, an upload's answer), and
# the floor of a transfer's limit (which grows by a second per MiB: Deadline.for_size). The stall limit is the
# client's ``timeout``.
REQUEST_TOTAL = 300.0
RETRYABLE = (
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    socket.timeout,
    ssl.SSLError,
    OSError,
    ValueError,
    NetError,
)
_ACCESS_KEY_RE = re.compile(r"[!-~]+")
# What S3 and STS answer for a token that is malformed, expired or from another session.
_TOKEN_CODES = ("InvalidToken", "ExpiredToken", "TokenRefreshRequired", "ExpiredTokenException")
# What AWS answers when the request is signed for, or sent to, another region than the bucket's.
_REGION_CODES = ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException")


class _Counted:
    """A response whose bytes read are counted (was a refused answer too long, or did the network fail?)."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.resp = resp
        self.headers = resp.headers
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.resp.read(size)
        self.count += len(data)
        return data


class S3Endpoint:
    """Path-style S3 requests to one endpoint with one set of credentials.

    ``endpoint``: ``http(s)://host[:port][/base/path]``. ``region`` defaults to us-east-1 (what most
    S3-compatible servers expect). ``ca_bundle``: a PEM file of the CAs to trust instead of the system's;
    ``verify=False`` turns TLS verification off (lab only). ``session_token`` (of temporary STS credentials)
    is sent as ``x-amz-security-token``, a signed header of every request.
    ``timeout`` is the stall limit (seconds without a byte); ``total`` the overall limit of a small request
    (retries included) and the floor of a transfer's, which grows with its size (``_net.deadline.Deadline``).
    Every request goes to the endpoint's origin only: redirects are never followed, so the signature and the
    session token reach no other host.
    ``clock`` returns a UTC ``datetime`` (tests pin it).
    """

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str | None = DEFAULT_REGION,
        session_token: str | None = None,
        ca_bundle: str | None = None,
        verify: bool = True,
        timeout: float | None = 60,
        clock: Callable[[], datetime.datetime] | None = None,
        total: float = REQUEST_TOTAL,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint or "")
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise S3Error(
                f"s3 endpoint {self._safe_endpoint(endpoint)!r} is not an http(s) URL; "
                "use e.g. https://s3.example.net:9000"
            )
        if "@" in parts.netloc:
            raise S3Error(
                "s3 endpoint must not carry credentials (user:password@ in the URL); set s3_access_key and "
                "s3_secret_key instead and keep them in a vault"
            )
        if not access_key or not secret_key:
            raise S3Error("s3 access key and secret key are both required")
        if not _ACCESS_KEY_RE.fullmatch(str(access_key)):
            raise S3Error("s3 access key holds spaces or control characters; check the variable that sets it")
        if session_token and not _ACCESS_KEY_RE.fullmatch(str(session_token)):
            # A header value with a line break would be refused by http.client with the value in its message.
            raise S3Error(
                "s3 session token holds spaces, line breaks or control characters; check the variable that sets "
                "it (a token copied from a file may end in a newline)"
            )
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.base_path = parts.path.rstrip("/")
        default_port = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port in (None, default_port) else f"{host}:{self.port}"
        self.endpoint = f"{self.scheme}://{self.host_header}{self.base_path}"
        self.region = region or DEFAULT_REGION
        self._access_key = str(access_key)
        self._secret_key = str(secret_key)
        self._session_token = str(session_token) if session_token else None
        self.timeout = float(timeout or DEFAULT_STALL)
        self.total = float(total)
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self._context: ssl.SSLContext | None = None
        if self.scheme == "https":
            if ca_bundle and not os.path.isfile(ca_bundle):
                raise S3Error(f"s3 CA bundle {ca_bundle} does not exist; give the path of a PEM file")
            self._context = ssl.create_default_context(cafile=ca_bundle or None)
            if not verify:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE

    @staticmethod
    def _safe_endpoint(endpoint: str) -> str:
        return hide_userinfo(endpoint)

    def scrub(self, text: object) -> str:
        """``text`` without the secret key, session token or access key."""
        text = str(text)
        for value in (self._secret_key, self._session_token, self._access_key):
            if value:
                text = text.replace(value, "********")
        return text

    # -- plumbing ----------------------------------------------------------

    def _path(self, bucket: str, key: str | None = None) -> str:
        if not bucket or "/" in bucket:
            raise S3Error(f"s3 bucket {bucket!r} is not a bucket name; give the bucket alone, without slashes")
        path = f"{self.base_path}/{uri_encode(bucket)}"
        if key is not None:
            if not key:
                raise S3Error("s3 object key is empty")
            path += "/" + uri_encode(key)
        return path

    def _deadline(self, size: int | None = None) -> Deadline:
        """The limits of one request: ``total`` for a small one, more for a transfer of ``size`` bytes."""
        if size is None:
            return Deadline(total=self.total, stall=self.timeout, what="the answer")
        return Deadline.for_size(size, stall=self.timeout, what="the transfer", floor=self.total)

    def _connection(self, deadline: Deadline) -> http.client.HTTPConnection:
        """A connection to the endpoint's origin (and only there), bounded by ``deadline``, through the proxy of the
        environment when there is one (``_net.proxy.proxy_for``: a CONNECT tunnel for https; over http, signed
        requests are refused rather than shown to the proxy)."""
        return connection(self.scheme, self.host, self.port, deadline, context=self._context, use_proxy=True)

    def _failure(
        self, method: str, bucket: str, key: str | None, exc: Exception, deadline: Deadline, after: str = ""
    ) -> S3Error:
        """The S3Error of a request that broke: refused, reset, stalled, past its limit or not HTTP."""
        desc = self._describe(method, bucket, key)
        if isinstance(exc, ProxyError):
            text = f"{desc} failed{after}: {exc}"
        elif deadline.expired or deadline.remaining() <= 0:
            text = f"{desc} did not finish within its {deadline.total:.0f} s limit{after}; the endpoint is too slow"
        else:
            text = f"{desc} failed{after}: {describe(exc, deadline, self.endpoint)}"
        return S3Error(self.scrub(text))

    def _signed_headers(
        self, method: str, path: str, query: Query, headers: Mapping[str, str] | None, payload_hash: str
    ) -> dict[str, str]:
        now = self.clock().astimezone(datetime.timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        signed = {"host": self.host_header, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
        if self._session_token:
            signed["x-amz-security-token"] = self._session_token
        out = {}
        for name, value in (headers or {}).items():
            if name.lower().startswith("x-amz-") or name.lower() in ("content-md5", "content-type"):
                signed[name.lower()] = value
            else:
                out[name] = value
        out.update(signed)
        out["Authorization"] = sign_v4(
            method, path, query, signed, payload_hash, self._access_key, self._secret_key, self.region, amz_date
        )
        return out

    def _describe(self, method: str, bucket: str, key: str | None) -> str:
        where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
        return f"S3 {method} {printable(where, 300)} at {self.endpoint}"

    def _raise_for(
        self, resp: http.client.HTTPResponse, body: bytes, method: str, bucket: str, key: str | None
    ) -> NoReturn:
        code, message = parse_error(body) if body else (None, None)
        status = resp.status
        if code in _TOKEN_CODES:
            fix = (
                "the session token is malformed, expired or from another session; get new temporary credentials and "
                "set the access key, secret key and session token of that one session together"
            )
        elif code in _REGION_CODES or 300 <= status < 400:
            where = resp.getheader("x-amz-bucket-region")
            fix = (
                f"the bucket is in region {where}: set s3_region to it and use that region's endpoint"
                if where and re.fullmatch(r"[a-z0-9-]{1,40}", where)
                else "set s3_region to the bucket's region and use that region's endpoint (redirects are not followed)"
            )
        elif status in (401, 403):
            if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", None):
                fix = "check the access key, the secret key, the region and the endpoint"
                if not self._session_token and self._access_key.startswith("ASIA"):
                    fix += "; temporary (STS) keys, whose id starts with ASIA, also need their session token"
            else:
                fix = "check the credentials' permissions on the bucket"
        elif status == 404:
            fix = "check the bucket name and the prefix" if code != "NoSuchKey" else "check the key and the prefix"
        elif status == 416:
            fix = "the object is shorter than the resume offset; remove the partial file and run again"
        elif status >= 500:
            fix = "the server failed; retry later"
        else:
            fix = "check the request parameters"
        if code is None and self._session_token and status in (400, 401, 403):
            # A HEAD answer has no body: an expired or foreign token is then only a bare 400 or 403.
            fix += (
                "; with temporary credentials, check that the session token belongs to these keys and has not expired"
            )
        why = f" {printable(code, 64)}" if code else ""
        text = f": {printable(message, 300)}" if message else ""
        raise S3Error(
            self.scrub(f"{self._describe(method, bucket, key)} answered HTTP {status}{why}{text}; {fix}"), status, code
        )

    def request(
        self,
        method: str,
        bucket: str,
        key: str | None = None,
        query: Query = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | bytearray | BinaryIO = b"",
        payload_hash: str | None = None,
        expect: tuple[int, ...] = (200,),
        limit: int = MAX_XML_BYTES,
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one signed request and read the whole answer: ``(status, headers, body bytes)``.

        ``body`` is bytes (hashed for the signature) or a binary file object with ``payload_hash``
        given and a ``Content-Length`` header. Answers outside ``expect`` raise S3Error (their body read up to
        MAX_ERROR_BYTES); an answer longer than ``limit`` bytes is refused. Idempotent requests with bytes
        bodies are retried on network errors and HTTP 5xx, all within one deadline: the client's ``total``, plus a
        second per MiB of the body sent.
        """
        path = self._path(bucket, key)
        bytes_body = isinstance(body, (bytes, bytearray))
        # Where bytes_body holds, body is bytes or a bytearray (the casts say so).
        if payload_hash is None:
            payload_hash = hashlib.sha256(cast("bytes", body) or b"").hexdigest() if bytes_body else UNSIGNED_PAYLOAD
        sent = len(cast("bytes", body)) if bytes_body else int(str((headers or {}).get("Content-Length") or 0))
        deadline = self._deadline(sent or None)
        attempts = ATTEMPTS if bytes_body else 1
        url = path + (("?" + canonical_query(query)) if query else "")
        for attempt in range(attempts):
            last = attempt + 1 == attempts
            conn = resp = None
            try:
                conn = self._connection(deadline)
                send = self._signed_headers(method, path, query, headers, payload_hash)
                if bytes_body and method in ("PUT", "POST"):
                    send["Content-Length"] = str(len(cast("bytes", body)))
                conn.request(method, url, body=body if body else None, headers=send)
                resp = conn.getresponse()
                if resp.status >= 500 and not last:
                    self._pause(attempt, deadline)
                    continue
                if resp.status not in expect:
                    self._raise_for(resp, self._error_body(resp, deadline), method, bucket, key)
                data = b"" if method == "HEAD" else self._read_answer(resp, limit, method, bucket, key, deadline)
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except S3Error:
                raise
            except RETRYABLE as exc:
                if last or deadline.expired or deadline.remaining() <= 0:
                    raise self._failure(method, bucket, key, exc, deadline) from None
                self._pause(attempt, deadline)
            finally:
                # The response holds the watchdog of the deadline once the headers are in: close both.
                if resp is not None:
                    resp.close()
                if conn is not None:
                    conn.close()
        raise S3Error(f"{self._describe(method, bucket, key)} did not finish")  # pragma: no cover

    @staticmethod
    def _pause(attempt: int, deadline: Deadline) -> None:
        time.sleep(max(0.0, min(0.5 * (attempt + 1), deadline.remaining())))

    @staticmethod
    def _error_body(resp: http.client.HTTPResponse, deadline: Deadline) -> bytes:
        """The start of an error answer (at most MAX_ERROR_BYTES), for its code and message; what cannot be
        read is left out."""
        chunks, total = [], 0
        try:
            while total < MAX_ERROR_BYTES:
                data = resp.read(min(1 << 16, MAX_ERROR_BYTES - total))
                if not data:
                    break
                chunks.append(data)
                total += len(data)
                deadline.check()
        except (NetError, http.client.HTTPException, OSError, ValueError):
            pass
        return b"".join(chunks)

    def _read_answer(
        self,
        resp: http.client.HTTPResponse,
        limit: int,
        method: str,
        bucket: str,
        key: str | None,
        deadline: Deadline,
    ) -> bytes:
        """The body of an expected answer, refused past ``limit`` bytes (a network error is raised as it is)."""
        declared = content_length(resp)
        too_large = S3Error(
            f"{self._describe(method, bucket, key)} answered with more than the {limit} bytes such an answer may "
            "hold; refused",
            resp.status,
        )
        if declared is not None and declared > limit:
            raise too_large
        counted = _Counted(resp)
        try:
            return read_capped(counted, limit, "the answer", self.endpoint, deadline)
        except NetError:
            if counted.count > limit:
                raise too_large from None
            raise
