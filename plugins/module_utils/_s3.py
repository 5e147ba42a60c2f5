# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""A small S3 client for S3-compatible object stores, standard library only.

Target hosts may lack boto3, so requests are signed here with AWS Signature Version 4 and sent with
``http.client``. Addressing is path-style (``<endpoint>/<bucket>/<key>``), which every S3-compatible
server (MinIO, SeaweedFS, Ceph RGW, Garage, AWS itself) accepts; the endpoint may carry a base path.

Use::

    client = S3Client("https://s3.example.net:9000", access_key, secret_key, region="us-east-1",
                      session_token=None, ca_bundle="/etc/ssl/site-ca.pem")
    info = client.head_object("models", "Qwen/Qwen3-32B/<sha>/config.json")  # None when absent
    client.get_object("models", key, "/tmp/file.part", offset=os.path.getsize("/tmp/file.part"))
    for obj in client.list_objects("models", prefix="Qwen/Qwen3-32B/"):
        print(obj["key"], obj["size"])
    client.upload_file("models", key, "/path/to/big.tar")  # single PUT or multipart by size

Temporary credentials (AWS STS: the access key, secret key and session token of one session) work too:
the token goes in the ``x-amz-security-token`` header, which is signed with the others; no presigned URL
is ever made. Credentials are only ever used to compute signatures and fill that header: they never
appear in an exception message, a URL or a log line (``S3Error`` messages name the method, endpoint,
bucket and key, the HTTP status and the server's error code). Every public method raises ``S3Error`` on
failure: an HTTP error, and a network or protocol error (not HTTP, a reset, a TLS error, a stall) alike.

Endpoints may be hostile (module_utils._net holds the shared bounds): every request goes to the endpoint's origin
only (no redirect is ever followed, so signatures and the token stay there); each has a stall limit (``timeout``)
and an overall limit (``total``, more for an object by its size); a GET copies exactly the object's bytes; answers
are capped (a listing page at net.MAX_XML_BYTES, an error document at net.MAX_ERROR_BYTES, a listing at
net.MAX_LISTED_FILES objects); XML holding a DTD is refused; text from the endpoint is made printable.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import http.client
import os
import re
import socket
import ssl
import time
import urllib.parse
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils import _net as net
from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    SafeFileError,
    open_path,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any, BinaryIO, NoReturn, Optional, Protocol, Union

    JSON = dict[str, Any]
    # The query of a request: a dict or pairs (a None value is sent as "").
    Query = Optional[Union[dict[str, Any], Iterable[tuple[Any, Any]]]]  # noqa: UP007, UP045 - ansible-test pylint reads `|` here as an operation

    class Digest(Protocol):
        """A hashlib object (only its update is used)."""

        def update(self, data: bytes, /) -> None:
            ...

    class ObjectResponse(http.client.HTTPResponse):
        """The response ``S3Client.open_object`` returns, with what its reader needs set on it."""

        connection_to_close: http.client.HTTPConnection
        ttfleet_deadline: net.Deadline
        ttfleet_expected: int


DEFAULT_REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
NET_CHUNK = 1 << 20
MIN_PART_SIZE = 5 << 20
MAX_PARTS = 10000
DEFAULT_PART_SIZE = 64 << 20
ATTEMPTS = 3
# The overall limit of a request whose answer is small (HEAD, a listing page, a manifest, an upload's answer), and
# the floor of a transfer's limit (which grows by a second per MiB: net.Deadline.for_size). The stall limit is the
# client's ``timeout``.
REQUEST_TOTAL = 300.0
# ListObjectsV2 pages of one listing: with 1000 keys a page, far more than MAX_LISTED_FILES needs.
MAX_LIST_PAGES = 10000
_RETRYABLE = (
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    socket.timeout,
    ssl.SSLError,
    OSError,
    ValueError,
    net.NetError,
)
_ACCESS_KEY_RE = re.compile(r"[!-~]+")
# What S3 and STS answer for a token that is malformed, expired or from another session.
_TOKEN_CODES = ("InvalidToken", "ExpiredToken", "TokenRefreshRequired", "ExpiredTokenException")
# What AWS answers when the request is signed for, or sent to, another region than the bucket's.
_REGION_CODES = ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException")
# The user info of a URL runs to the last "@" before the path: a password may hold "@" itself.
_USERINFO_RE = re.compile(r"(://)[^/?#\s]*@")
# RFC 9110 section 14.4: "bytes first-last/complete-length" (or "/*"); the unit is case-insensitive.
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


class S3Error(Exception):
    """A failed S3 request. ``status`` is the HTTP status (None for network errors), ``code`` the S3 error code."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# ---------------------------------------------------------------------------
# Signature Version 4 (pure functions, tested against the AWS documentation's examples)


def uri_encode(text: str, keep_slash: bool = True) -> str:
    """RFC 3986 encoding as SigV4 wants it: everything but ``A-Za-z0-9-._~`` (and ``/`` when kept)."""
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def canonical_query(query: Query) -> str:
    """``k=v&...`` from a dict or list of pairs, sorted by encoded key then value, both URI-encoded."""
    pairs = query.items() if isinstance(query, dict) else (query or [])
    encoded = sorted((uri_encode(str(k), False), uri_encode("" if v is None else str(v), False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_key: str, date: str, region: str, service: str = "s3") -> bytes:
    """The derived key of SigV4 for one day, region and service."""
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def sign_v4(
    method: str,
    path: str,
    query: Query,
    headers: Mapping[str, object],
    payload_hash: str,
    access_key: str,
    secret_key: str,
    region: str,
    amz_date: str,
    service: str = "s3",
) -> str:
    """The ``Authorization`` header value for a request; every header in ``headers`` is signed.

    ``path`` is the already URI-encoded absolute path, ``headers`` must hold ``host`` and
    ``x-amz-date`` (= ``amz_date``, ``YYYYMMDDTHHMMSSZ``), ``payload_hash`` is the hex sha256 of the body
    (or ``UNSIGNED-PAYLOAD``).
    """
    canon = {name.lower().strip(): " ".join(str(value).strip().split()) for name, value in headers.items()}
    names = sorted(canon)
    canonical_request = "\n".join(
        [
            method,
            path or "/",
            canonical_query(query),
            "".join(f"{name}:{canon[name]}\n" for name in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )
    signature = hmac.new(
        signing_key(secret_key, amz_date[:8], region, service), string_to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"


# ---------------------------------------------------------------------------
# XML


def _strip_ns(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(elem: ET.Element) -> dict[str, ET.Element]:
    return {_strip_ns(child.tag): child for child in elem}


def _text(elem: ET.Element, name: str, default: str | None = None) -> str | None:
    for child in elem:
        if _strip_ns(child.tag) == name:
            return child.text if child.text is not None else ""
    return default


def _no_dtd(body: bytes) -> bool:
    """Whether ``body`` is free of a document type declaration: S3 answers never hold one, and refusing it keeps
    entity expansion (billion laughs) out whatever expat's own limit (>= 2.4.1) is."""
    return b"<!DOCTYPE" not in body and b"<!ENTITY" not in body


def _parse(body: bytes) -> ET.Element:
    """The root element of ``body``; ET.ParseError when it is not XML or holds a DTD."""
    if not _no_dtd(body):
        raise ET.ParseError("a document type declaration (S3 answers never hold one)")
    # Accepted bandit B314: no DTD reaches the parser (refused above), so no entity is expanded; ElementTree
    # resolves no external entity anyway, and expat >= 2.4.1 caps amplification.
    return ET.fromstring(body)  # nosec B314


def parse_error(body: bytes) -> tuple[str | None, str | None]:
    """``(code, message)`` from an S3 ``<Error>`` body; ``(None, None)`` when it is not one."""
    try:
        root = _parse(body)
    except ET.ParseError:
        return None, None
    if _strip_ns(root.tag) != "Error":
        return None, None
    return _text(root, "Code"), _text(root, "Message")


def parse_list(body: bytes, limit: int | None = None) -> tuple[list[JSON], str | None]:
    """``(objects, next_token)`` of one ListObjectsV2 page; more than ``limit`` objects is refused.

    The page is parsed as a stream and each ``<Contents>`` dropped once read, so memory follows the objects kept,
    not the elements of the page."""
    if not _no_dtd(body):
        raise S3Error("the server sent a ListObjectsV2 answer with a document type declaration; refused")
    # Accepted bandit B314 (XMLPullParser): no DTD reaches it (refused above); no external entities.
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))  # nosec B314
    objects: list[JSON]
    fields: dict[str, str]
    root: ET.Element | None
    objects, fields, root, depth = [], {}, None, 0
    try:
        for offset in range(0, len(body), 1 << 16):
            parser.feed(body[offset : offset + (1 << 16)])
            # Start and end events only: each is (event, element).
            for event, elem in cast("Iterator[tuple[str, ET.Element]]", parser.read_events()):
                if event == "start":
                    root = elem if root is None else root
                    depth += 1
                    continue
                depth -= 1
                if depth != 1:
                    continue
                name = _strip_ns(elem.tag)
                if name == "Contents":
                    size = cast("str", _text(elem, "Size", "0"))  # a str with a str default
                    key = _text(elem, "Key")
                    if not key:
                        raise S3Error("the server sent a ListObjectsV2 entry without a Key; refused")
                    objects.append(
                        {
                            "key": key,
                            "size": int(size) if size.isdigit() else 0,
                            "etag": (_text(elem, "ETag") or "").strip('"'),
                            "last_modified": _text(elem, "LastModified"),
                        }
                    )
                    if limit is not None and len(objects) > limit:
                        raise S3Error(f"the listing holds more than {net.MAX_LISTED_FILES} objects; refused")
                elif name in ("IsTruncated", "NextContinuationToken"):
                    fields[name] = elem.text or ""
                cast("ET.Element", root).remove(elem)  # set at the first start event, before any end
        parser.close()
    except ET.ParseError as exc:
        raise S3Error(f"the server sent a ListObjectsV2 answer that is not XML ({exc})") from None
    truncated = (fields.get("IsTruncated") or "false").lower() == "true"
    token = fields.get("NextContinuationToken") if truncated else None
    if truncated and not token:
        raise S3Error("the server sent a truncated ListObjectsV2 page without NextContinuationToken")
    return objects, token


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def hide_userinfo(text: object) -> str:
    """``text`` with the user info of every URL in it (``user:password@``) replaced by ``********@``."""
    return _USERINFO_RE.sub(r"\1********@", str(text))


def content_range_start(value: str | None) -> int | None:
    """Where the body of a 206 answer starts, from its ``Content-Range``; None when the header is unusable
    (absent, another unit, an unsatisfied range, last before first, or a range past the complete length)."""
    match = _CONTENT_RANGE_RE.fullmatch((value or "").strip())
    if not match:
        return None
    first, last, total = int(match.group(1)), int(match.group(2)), match.group(3)
    if last < first or (total != "*" and last >= int(total)):
        return None
    return first


def _open_read(path: str | int) -> BinaryIO:
    """A binary file object of the regular file ``path``, opened without following a link a user planted, or of
    an open file descriptor (read from its start; the caller keeps its own descriptor)."""
    if isinstance(path, int):
        handle = os.fdopen(os.dup(path), "rb")
        handle.seek(0)
        return handle
    try:
        fd, _st = open_path(os.path.abspath(path))
    except SafeFileError as exc:
        raise S3Error(f"cannot upload {path}: {exc.reason}") from None
    return os.fdopen(fd, "rb")


def _open_write(path: str, keep: bool) -> BinaryIO:
    """A binary file object of ``path`` for writing, created 0600 when missing; the content is kept when
    ``keep`` (a resume), else truncated. A link or special file at ``path`` is refused."""
    try:
        fd, _st = open_path(os.path.abspath(path), flags=os.O_RDWR | os.O_CREAT)
    except SafeFileError as exc:
        raise S3Error(f"cannot write {path}: {exc.reason}") from None
    if not keep:
        os.ftruncate(fd, 0)
    return os.fdopen(fd, "r+b")


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


# ---------------------------------------------------------------------------
# The client


class S3Client:
    """Path-style S3 requests to one endpoint with one set of credentials.

    ``endpoint``: ``http(s)://host[:port][/base/path]``. ``region`` defaults to us-east-1 (what most
    S3-compatible servers expect). ``ca_bundle``: a PEM file of the CAs to trust instead of the system's;
    ``verify=False`` turns TLS verification off (lab only). ``session_token`` (of temporary STS credentials)
    is sent as ``x-amz-security-token``, a signed header of every request.
    ``timeout`` is the stall limit (seconds without a byte); ``total`` the overall limit of a small request
    (retries included) and the floor of a transfer's, which grows with its size (module_utils._net.Deadline).
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
        self.timeout = float(timeout or net.DEFAULT_STALL)
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

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> S3Client:
        """The client of a module's S3 options (``_s3_options.S3_OPTIONS``) and its ``timeout``."""
        return cls(
            options["s3_endpoint"],
            options["s3_access_key"],
            options["s3_secret_key"],
            region=options.get("s3_region") or DEFAULT_REGION,
            session_token=options.get("s3_session_token") or None,
            ca_bundle=options.get("s3_ca_bundle"),
            verify=options.get("s3_verify", True) is not False,
            timeout=options.get("timeout") or 60,
        )

    def __repr__(self) -> str:
        return f"S3Client({self.endpoint!r}, region={self.region!r})"

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

    def _deadline(self, size: int | None = None) -> net.Deadline:
        """The limits of one request: ``total`` for a small one, more for a transfer of ``size`` bytes."""
        if size is None:
            return net.Deadline(total=self.total, stall=self.timeout, what="the answer")
        return net.Deadline.for_size(size, stall=self.timeout, what="the transfer", floor=self.total)

    def _connection(self, deadline: net.Deadline) -> http.client.HTTPConnection:
        """A connection to the endpoint's origin (and only there), bounded by ``deadline``, through the proxy of the
        environment when there is one (``_net.proxy_for``: a CONNECT tunnel for https; over http, signed requests are
        refused rather than shown to the proxy)."""
        return net.connection(self.scheme, self.host, self.port, deadline, context=self._context, use_proxy=True)

    def _failure(
        self, method: str, bucket: str, key: str | None, exc: Exception, deadline: net.Deadline, after: str = ""
    ) -> S3Error:
        """The S3Error of a request that broke: refused, reset, stalled, past its limit or not HTTP."""
        desc = self._describe(method, bucket, key)
        if isinstance(exc, net.ProxyError):
            text = f"{desc} failed{after}: {exc}"
        elif deadline.expired or deadline.remaining() <= 0:
            text = f"{desc} did not finish within its {deadline.total:.0f} s limit{after}; the endpoint is too slow"
        else:
            text = f"{desc} failed{after}: {net.describe(exc, deadline, self.endpoint)}"
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
        return f"S3 {method} {net.printable(where, 300)} at {self.endpoint}"

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
        why = f" {net.printable(code, 64)}" if code else ""
        text = f": {net.printable(message, 300)}" if message else ""
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
        limit: int = net.MAX_XML_BYTES,
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one signed request and read the whole answer: ``(status, headers, body bytes)``.

        ``body`` is bytes (hashed for the signature) or a binary file object with ``payload_hash``
        given and a ``Content-Length`` header. Answers outside ``expect`` raise S3Error (their body read up to
        net.MAX_ERROR_BYTES); an answer longer than ``limit`` bytes is refused. Idempotent requests with bytes
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
            except _RETRYABLE as exc:
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
    def _pause(attempt: int, deadline: net.Deadline) -> None:
        time.sleep(max(0.0, min(0.5 * (attempt + 1), deadline.remaining())))

    @staticmethod
    def _error_body(resp: http.client.HTTPResponse, deadline: net.Deadline) -> bytes:
        """The start of an error answer (at most net.MAX_ERROR_BYTES), for its code and message; what cannot be
        read is left out."""
        chunks, total = [], 0
        try:
            while total < net.MAX_ERROR_BYTES:
                data = resp.read(min(1 << 16, net.MAX_ERROR_BYTES - total))
                if not data:
                    break
                chunks.append(data)
                total += len(data)
                deadline.check()
        except (net.NetError, http.client.HTTPException, OSError, ValueError):
            pass
        return b"".join(chunks)

    def _read_answer(
        self,
        resp: http.client.HTTPResponse,
        limit: int,
        method: str,
        bucket: str,
        key: str | None,
        deadline: net.Deadline,
    ) -> bytes:
        """The body of an expected answer, refused past ``limit`` bytes (a network error is raised as it is)."""
        declared = net.content_length(resp)
        too_large = S3Error(
            f"{self._describe(method, bucket, key)} answered with more than the {limit} bytes such an answer may "
            "hold; refused",
            resp.status,
        )
        if declared is not None and declared > limit:
            raise too_large
        counted = _Counted(resp)
        try:
            return net.read_capped(counted, limit, "the answer", self.endpoint, deadline)
        except net.NetError:
            if counted.count > limit:
                raise too_large from None
            raise

    # -- objects -----------------------------------------------------------

    def head_object(self, bucket: str, key: str) -> JSON | None:
        """``{"size", "etag", "last_modified", "metadata"}`` of an object, or None when it does not exist."""
        status, headers, _body = self.request("HEAD", bucket, key, expect=(200, 404))
        if status == 404:
            return None
        size = headers.get("content-length", "").strip()
        if not size.isdigit():
            raise S3Error(f"{self._describe('HEAD', bucket, key)} answered without a usable Content-Length")
        return {
            "size": int(size),
            "etag": headers.get("etag", "").strip('"'),
            "last_modified": headers.get("last-modified"),
            "metadata": {k[len("x-amz-meta-") :]: v for k, v in headers.items() if k.startswith("x-amz-meta-")},
        }

    def open_object(
        self, bucket: str, key: str, offset: int = 0, size: int | None = None
    ) -> tuple[ObjectResponse, int]:
        """Start a GET (with ``Range: bytes=offset-`` when offset > 0) of an object of ``size`` bytes and return
        ``(response, start)``; without ``size`` a HEAD asks for it first.

        ``start`` is where the body begins: ``offset`` when the server honoured the range (206), 0 when
        it sent the whole object (200). An answer that declares another length than ``size - start`` is refused.
        The response carries ``ttfleet_expected`` (the bytes its body must hold: read exactly those, with
        module_utils._net.copy_capped), ``ttfleet_deadline`` (the transfer's limits, sized by the object: the
        connection is shut when it passes) and ``connection_to_close``. The caller must close both.
        An offset equal to the object's size answers 416: the caller should check the size first.
        """
        desc = self._describe("GET", bucket, key)
        if size is None:
            info = self.head_object(bucket, key)
            if info is None:
                raise S3Error(f"{desc} answered HTTP 404 NoSuchKey; check the key and the prefix", 404, "NoSuchKey")
            size = info["size"]
        size = int(size)
        path = self._path(bucket, key)
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        deadline = self._deadline(max(0, size - offset))
        conn = None
        try:
            conn = self._connection(deadline)
            send = self._signed_headers("GET", path, None, headers, EMPTY_SHA256)
            conn.request("GET", path, headers=send)
            # It gets the attributes of an ObjectResponse below, before it is returned.
            resp = cast("ObjectResponse", conn.getresponse())
        except _RETRYABLE as exc:
            if conn is not None:
                conn.close()
            raise self._failure("GET", bucket, key, exc, deadline) from None
        try:
            if resp.status not in (200, 206):
                self._raise_for(resp, self._error_body(resp, deadline), "GET", bucket, key)
            start: int | None
            start = 0
            if resp.status == 206:
                content_range = resp.getheader("Content-Range")
                start = content_range_start(content_range)
                if start is None:
                    raise S3Error(f"{desc} sent a partial answer without a usable Content-Range")
                # content_range is a str: a start was parsed from it.
                complete = cast("str", content_range).rsplit("/", 1)[1].strip()
                if complete != "*" and int(complete) != size:
                    raise S3Error(f"{desc} says the object is {complete} bytes, not the {size} expected; refused")
            expected = size - start
            declared = net.content_length(resp)
            if expected < 0 or (declared is not None and declared != expected):
                raise S3Error(
                    f"{desc} sends {declared} bytes from byte {start} of an object of {size} bytes "
                    f"({max(expected, 0)} expected); refused"
                )
        except BaseException:
            resp.close()
            conn.close()
            raise
        resp.connection_to_close = conn
        resp.ttfleet_deadline = deadline
        resp.ttfleet_expected = expected
        return resp, start

    def get_object(
        self,
        bucket: str,
        key: str,
        dest_path: str,
        offset: int = 0,
        callback: Callable[[int], object] | None = None,
        digest: Digest | None = None,
        size: int | None = None,
    ) -> dict[str, int]:
        """Stream an object of ``size`` bytes (None: ask with a HEAD) into ``dest_path``, resuming at ``offset``
        (bytes already in the file).

        The file is truncated to where the body starts (0 when the server ignores the range), then
        written in 1 MiB blocks and fsynced: exactly the bytes the object lacks, never one more (a longer body
        fails before its extra bytes are written). ``callback(nbytes)`` is called per block; ``digest`` (a
        hashlib object already fed with the first ``offset`` bytes) is updated with each block, and must
        be reset by the caller when the returned ``start`` is 0 but ``offset`` was not.
        Returns ``{"start", "written", "size"}`` (``size`` = final file size).
        """
        resp, start = self.open_object(bucket, key, offset, size)
        expected, deadline = resp.ttfleet_expected, resp.ttfleet_deadline
        state = {"written": 0}
        try:
            with _open_write(dest_path, keep=bool(start)) as handle:
                handle.seek(start)
                handle.truncate()

                def write(block: bytes) -> None:
                    handle.write(block)
                    state["written"] += len(block)
                    if digest is not None:
                        digest.update(block)
                    if callback is not None:
                        callback(len(block))

                try:
                    net.copy_capped(resp, write, expected, "the object", self.endpoint, deadline)
                except net.NetError as exc:
                    handle.flush()
                    after = f" after {start + state['written']} bytes"
                    raise self._failure("GET", bucket, key, exc, deadline, after) from None
                handle.flush()
                os.fsync(handle.fileno())
                final = handle.tell()
        finally:
            resp.close()
            resp.connection_to_close.close()
        if state["written"] != expected:
            raise S3Error(
                f"{self._describe('GET', bucket, key)} sent {state['written']} of {expected} bytes; run again to resume"
            )
        return {"start": start, "written": state["written"], "size": final}

    def list_objects(self, bucket: str, prefix: str = "", page_size: int = 1000) -> Iterator[JSON]:
        """Yield ``{"key", "size", "etag", "last_modified"}`` per object under ``prefix`` (ListObjectsV2, all pages).

        Each page is read up to net.MAX_XML_BYTES; a listing of more than net.MAX_LISTED_FILES objects, of more than
        MAX_LIST_PAGES pages, or one whose continuation token comes back, is refused."""
        token: str | None
        tokens: set[bytes]
        token, seen, tokens = None, 0, set()
        for _page in range(MAX_LIST_PAGES):
            query = {"list-type": "2", "max-keys": str(page_size)}
            if prefix:
                query["prefix"] = prefix
            if token:
                query["continuation-token"] = token
            _status, _headers, body = self.request("GET", bucket, None, query=query, limit=net.MAX_XML_BYTES)
            try:
                objects, token = parse_list(body, net.MAX_LISTED_FILES - seen)
            except S3Error as exc:
                raise S3Error(f"{self._describe('GET', bucket, prefix)}: {exc}") from None
            seen += len(objects)
            yield from objects
            if not token:
                return
            mark = hashlib.sha256(token.encode("utf-8", "replace")).digest()
            if len(token) > 4096 or mark in tokens:
                raise S3Error(
                    f"{self._describe('GET', bucket, prefix)}: the server sent a continuation token that is too long "
                    "or came back; the listing is refused"
                )
            tokens.add(mark)
        raise S3Error(f"{self._describe('GET', bucket, prefix)} listed more than {MAX_LIST_PAGES} pages; refused")

    def put_object(
        self,
        bucket: str,
        key: str,
        data: bytes | bytearray | str | int,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Upload ``data`` (bytes, the path of a file or an open descriptor) in one PUT; returns the ETag.

        A file is hashed first (the signature covers the payload) and then streamed, never read whole.
        """
        headers = {"Content-Type": content_type}
        for name, value in (metadata or {}).items():
            headers[f"x-amz-meta-{name}"] = value
        if isinstance(data, (bytes, bytearray)):
            _status, resp_headers, _body = self.request("PUT", bucket, key, headers=headers, body=bytes(data))
            return resp_headers.get("etag", "").strip('"')
        with _open_read(data) as handle:
            size = os.fstat(handle.fileno()).st_size
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(NET_CHUNK * 8), b""):
                digest.update(block)
            headers["Content-Length"] = str(size)
            handle.seek(0)
            _status, resp_headers, _body = self.request(
                "PUT", bucket, key, headers=headers, body=handle if size else b"", payload_hash=digest.hexdigest()
            )
        return resp_headers.get("etag", "").strip('"')

    def delete_object(self, bucket: str, key: str) -> None:
        """Delete an object (absent objects are fine, as in S3)."""
        self.request("DELETE", bucket, key, expect=(200, 204))

    def create_bucket(self, bucket: str) -> None:
        """Create a bucket in the client's region; one that we already own is fine."""
        body = b""
        if self.region != DEFAULT_REGION:
            body = (
                '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<LocationConstraint>{_xml_escape(self.region)}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        status, _headers, body_out = self.request("PUT", bucket, None, body=body, expect=(200, 409))
        if status == 409 and parse_error(body_out)[0] != "BucketAlreadyOwnedByYou":
            raise S3Error(f"s3 bucket {bucket} exists and belongs to someone else; choose another name", 409)

    # -- multipart ---------------------------------------------------------

    def create_multipart_upload(self, bucket: str, key: str, content_type: str = "application/octet-stream") -> str:
        """Start a multipart upload; returns its UploadId."""
        _s, _h, body = self.request("POST", bucket, key, query={"uploads": ""}, headers={"Content-Type": content_type})
        try:
            upload_id = _text(_parse(body), "UploadId")
        except ET.ParseError:
            upload_id = None
        if not upload_id:
            raise S3Error(f"{self._describe('POST', bucket, key)} started a multipart upload without an UploadId")
        return upload_id

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Upload part ``number`` (1-based) of ``bytes``; returns its ETag."""
        _s, headers, _b = self.request(
            "PUT", bucket, key, query={"partNumber": str(number), "uploadId": upload_id}, body=bytes(data)
        )
        etag = headers.get("etag")
        if not etag:
            raise S3Error(f"{self._describe('PUT', bucket, key)} stored part {number} without an ETag")
        return etag

    def complete_multipart_upload(self, bucket: str, key: str, upload_id: str, etags: Iterable[str]) -> str:
        """Finish an upload from the ETags of parts 1..n in order; returns the object's ETag."""
        parts = "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{_xml_escape(etag)}</ETag></Part>"
            for number, etag in enumerate(etags, 1)
        )
        body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        _s, _h, answer = self.request("POST", bucket, key, query={"uploadId": upload_id}, body=body)
        # S3 may answer 200 with an <Error> body when completion fails late.
        code, message = parse_error(answer)
        if code:
            raise S3Error(
                f"{self._describe('POST', bucket, key)} could not complete the upload: {code} {message}", 200, code
            )
        try:
            return (_text(_parse(answer), "ETag") or "").strip('"')
        except ET.ParseError:
            return ""

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        self.request("DELETE", bucket, key, query={"uploadId": upload_id}, expect=(200, 204, 404))

    def upload_file(
        self,
        bucket: str,
        key: str,
        path: str | int,
        part_size: int = DEFAULT_PART_SIZE,
        callback: Callable[[int], object] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        """Upload a file (a path or an open descriptor): one PUT up to ``part_size``, multipart above it (aborted
        on failure). Returns the ETag.

        Parts are read one at a time (memory use is one part); ``part_size`` grows when the file would
        need more than 10000 parts. ``callback(nbytes)`` is called per part (or once for a single PUT).
        """
        part_size = max(int(part_size), MIN_PART_SIZE)
        with _open_read(path) as handle:
            size = os.fstat(handle.fileno()).st_size
        if size <= part_size:
            etag = self.put_object(bucket, key, path, content_type=content_type)
            if callback is not None:
                callback(size)
            return etag
        while -(-size // part_size) > MAX_PARTS:
            part_size *= 2
        upload_id = self.create_multipart_upload(bucket, key, content_type)
        try:
            etags = []
            with _open_read(path) as handle:
                for number in range(1, MAX_PARTS + 1):
                    block = handle.read(part_size)
                    if not block:
                        break
                    etags.append(self.upload_part(bucket, key, upload_id, number, block))
                    if callback is not None:
                        callback(len(block))
            return self.complete_multipart_upload(bucket, key, upload_id, etags)
        except BaseException:
            with contextlib.suppress(S3Error):
                self.abort_multipart_upload(bucket, key, upload_id)
            raise
