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
failure.
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

from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    SafeFileError,
    open_path,
)

DEFAULT_REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
NET_CHUNK = 1 << 20
MIN_PART_SIZE = 5 << 20
MAX_PARTS = 10000
DEFAULT_PART_SIZE = 64 << 20
ATTEMPTS = 3
_RETRYABLE = (http.client.HTTPException, ConnectionError, TimeoutError, socket.timeout, ssl.SSLError, OSError)
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

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        self.status = status
        self.code = code


# ---------------------------------------------------------------------------
# Signature Version 4 (pure functions, tested against the AWS documentation's examples)


def uri_encode(text, keep_slash=True):
    """RFC 3986 encoding as SigV4 wants it: everything but ``A-Za-z0-9-._~`` (and ``/`` when kept)."""
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def canonical_query(query):
    """``k=v&...`` from a dict or list of pairs, sorted by encoded key then value, both URI-encoded."""
    pairs = query.items() if isinstance(query, dict) else (query or [])
    encoded = sorted((uri_encode(str(k), False), uri_encode("" if v is None else str(v), False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _hmac(key, text):
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_key, date, region, service="s3"):
    """The derived key of SigV4 for one day, region and service."""
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def sign_v4(method, path, query, headers, payload_hash, access_key, secret_key, region, amz_date, service="s3"):
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


def _strip_ns(tag):
    return tag.rsplit("}", 1)[-1]


def _children(elem):
    return {_strip_ns(child.tag): child for child in elem}


def _text(elem, name, default=None):
    for child in elem:
        if _strip_ns(child.tag) == name:
            return child.text if child.text is not None else ""
    return default


def parse_error(body):
    """``(code, message)`` from an S3 ``<Error>`` body; ``(None, None)`` when it is not one."""
    try:
        # Accepted bandit B314: ElementTree resolves no external entity or DTD, and the expat of every target
        # OS (>= 2.4.1) caps entity amplification.
        root = ET.fromstring(body)  # nosec B314
    except ET.ParseError:
        return None, None
    if _strip_ns(root.tag) != "Error":
        return None, None
    return _text(root, "Code"), _text(root, "Message")


def parse_list(body):
    """``(objects, next_token)`` of one ListObjectsV2 page."""
    try:
        # Accepted bandit B314: as in _error (no external entities; expat >= 2.4.1).
        root = ET.fromstring(body)  # nosec B314
    except ET.ParseError as exc:
        raise S3Error(f"the server sent a ListObjectsV2 answer that is not XML ({exc})") from None
    objects = []
    for child in root:
        if _strip_ns(child.tag) != "Contents":
            continue
        size = _text(child, "Size", "0")
        objects.append(
            {
                "key": _text(child, "Key"),
                "size": int(size) if size.isdigit() else 0,
                "etag": (_text(child, "ETag") or "").strip('"'),
                "last_modified": _text(child, "LastModified"),
            }
        )
    truncated = (_text(root, "IsTruncated") or "false").lower() == "true"
    token = _text(root, "NextContinuationToken") if truncated else None
    if truncated and not token:
        raise S3Error("the server sent a truncated ListObjectsV2 page without NextContinuationToken")
    return objects, token


def _xml_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def hide_userinfo(text):
    """``text`` with the user info of every URL in it (``user:password@``) replaced by ``********@``."""
    return _USERINFO_RE.sub(r"\1********@", str(text))


def content_range_start(value):
    """Where the body of a 206 answer starts, from its ``Content-Range``; None when the header is unusable
    (absent, another unit, an unsatisfied range, last before first, or a range past the complete length)."""
    match = _CONTENT_RANGE_RE.fullmatch((value or "").strip())
    if not match:
        return None
    first, last, total = int(match.group(1)), int(match.group(2)), match.group(3)
    if last < first or (total != "*" and last >= int(total)):
        return None
    return first


def _open_read(path):
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


def _open_write(path, keep):
    """A binary file object of ``path`` for writing, created 0600 when missing; the content is kept when
    ``keep`` (a resume), else truncated. A link or special file at ``path`` is refused."""
    try:
        fd, _st = open_path(os.path.abspath(path), flags=os.O_RDWR | os.O_CREAT)
    except SafeFileError as exc:
        raise S3Error(f"cannot write {path}: {exc.reason}") from None
    if not keep:
        os.ftruncate(fd, 0)
    return os.fdopen(fd, "r+b")


# ---------------------------------------------------------------------------
# The client


class S3Client:
    """Path-style S3 requests to one endpoint with one set of credentials.

    ``endpoint``: ``http(s)://host[:port][/base/path]``. ``region`` defaults to us-east-1 (what most
    S3-compatible servers expect). ``ca_bundle``: a PEM file of the CAs to trust instead of the system's;
    ``verify=False`` turns TLS verification off (lab only). ``session_token`` (of temporary STS credentials)
    is sent as ``x-amz-security-token``, a signed header of every request.
    ``clock`` returns a UTC ``datetime`` (tests pin it).
    """

    def __init__(
        self,
        endpoint,
        access_key,
        secret_key,
        region=DEFAULT_REGION,
        session_token=None,
        ca_bundle=None,
        verify=True,
        timeout=60,
        clock=None,
    ):
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
        self.timeout = timeout
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self._context = None
        if self.scheme == "https":
            if ca_bundle and not os.path.isfile(ca_bundle):
                raise S3Error(f"s3 CA bundle {ca_bundle} does not exist; give the path of a PEM file")
            self._context = ssl.create_default_context(cafile=ca_bundle or None)
            if not verify:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE

    def __repr__(self):
        return f"S3Client({self.endpoint!r}, region={self.region!r})"

    @staticmethod
    def _safe_endpoint(endpoint):
        return hide_userinfo(endpoint)

    def scrub(self, text):
        """``text`` without the secret key, session token or access key."""
        text = str(text)
        for value in (self._secret_key, self._session_token, self._access_key):
            if value:
                text = text.replace(value, "********")
        return text

    # -- plumbing ----------------------------------------------------------

    def _path(self, bucket, key=None):
        if not bucket or "/" in bucket:
            raise S3Error(f"s3 bucket {bucket!r} is not a bucket name; give the bucket alone, without slashes")
        path = f"{self.base_path}/{uri_encode(bucket)}"
        if key is not None:
            if not key:
                raise S3Error("s3 object key is empty")
            path += "/" + uri_encode(key)
        return path

    def _connection(self):
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _signed_headers(self, method, path, query, headers, payload_hash):
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

    def _describe(self, method, bucket, key):
        where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
        return f"S3 {method} {where} at {self.endpoint}"

    def _raise_for(self, resp, body, method, bucket, key):
        code, message = parse_error(body) if body else (None, None)
        status = resp.status
        if code in _TOKEN_CODES:
            fix = (
                "the session token is malformed, expired or from another session; get new temporary credentials and "
                "set the access key, secret key and session token of that one session together"
            )
        elif code in _REGION_CODES or status in (301, 307):
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
        why = f" {code}" if code else ""
        text = f": {message}" if message else ""
        raise S3Error(
            self.scrub(f"{self._describe(method, bucket, key)} answered HTTP {status}{why}{text}; {fix}"), status, code
        )

    def request(self, method, bucket, key=None, query=None, headers=None, body=b"", payload_hash=None, expect=(200,)):
        """Send one signed request and read the whole answer: ``(status, headers, body bytes)``.

        ``body`` is bytes (hashed for the signature) or a binary file object with ``payload_hash``
        given and a ``Content-Length`` header. Answers outside ``expect`` raise S3Error; idempotent
        requests with bytes bodies are retried on network errors and HTTP 5xx.
        """
        path = self._path(bucket, key)
        if payload_hash is None:
            payload_hash = (
                hashlib.sha256(body or b"").hexdigest() if isinstance(body, (bytes, bytearray)) else UNSIGNED_PAYLOAD
            )
        retry = isinstance(body, (bytes, bytearray))
        for attempt in range(ATTEMPTS if retry else 1):
            conn = self._connection()
            try:
                url = path + (("?" + canonical_query(query)) if query else "")
                send = self._signed_headers(method, path, query, headers, payload_hash)
                if isinstance(body, (bytes, bytearray)) and method in ("PUT", "POST"):
                    send["Content-Length"] = str(len(body))
                conn.request(method, url, body=body if body else None, headers=send)
                resp = conn.getresponse()
                data = resp.read()
                if resp.status >= 500 and retry and attempt + 1 < ATTEMPTS:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                if resp.status not in expect:
                    self._raise_for(resp, data, method, bucket, key)
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except S3Error:
                raise
            except _RETRYABLE as exc:
                if not retry or attempt + 1 == ATTEMPTS:
                    raise S3Error(self.scrub(f"{self._describe(method, bucket, key)} failed: {exc}")) from None
                time.sleep(0.5 * (attempt + 1))
            finally:
                conn.close()
        raise S3Error(f"{self._describe(method, bucket, key)} did not finish")  # pragma: no cover

    # -- objects -----------------------------------------------------------

    def head_object(self, bucket, key):
        """``{"size", "etag", "last_modified", "metadata"}`` of an object, or None when it does not exist."""
        status, headers, _body = self.request("HEAD", bucket, key, expect=(200, 404))
        if status == 404:
            return None
        return {
            "size": int(headers.get("content-length", "0")),
            "etag": headers.get("etag", "").strip('"'),
            "last_modified": headers.get("last-modified"),
            "metadata": {k[len("x-amz-meta-") :]: v for k, v in headers.items() if k.startswith("x-amz-meta-")},
        }

    def open_object(self, bucket, key, offset=0):
        """Start a GET (with ``Range: bytes=offset-`` when offset > 0) and return ``(response, start)``.

        ``start`` is where the body begins: ``offset`` when the server honoured the range (206), 0 when
        it sent the whole object (200). The caller reads ``response`` in blocks and must close it.
        An offset equal to the object's size answers 416: the caller should check the size first.
        """
        path = self._path(bucket, key)
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        conn = self._connection()
        try:
            send = self._signed_headers("GET", path, None, headers, EMPTY_SHA256)
            conn.request("GET", path, headers=send)
            resp = conn.getresponse()
        except _RETRYABLE as exc:
            conn.close()
            raise S3Error(self.scrub(f"{self._describe('GET', bucket, key)} failed: {exc}")) from None
        if resp.status not in (200, 206):
            body = resp.read()
            conn.close()
            self._raise_for(resp, body, "GET", bucket, key)
        start = 0
        if resp.status == 206:
            start = content_range_start(resp.getheader("Content-Range"))
            if start is None:
                conn.close()
                raise S3Error(
                    f"{self._describe('GET', bucket, key)} sent a partial answer without a usable Content-Range"
                )
        resp.connection_to_close = conn
        return resp, start

    def get_object(self, bucket, key, dest_path, offset=0, callback=None, digest=None):
        """Stream an object into ``dest_path``, resuming at ``offset`` (bytes already in the file).

        The file is truncated to where the body starts (0 when the server ignores the range), then
        written in 1 MiB blocks and fsynced. ``callback(nbytes)`` is called per block; ``digest`` (a
        hashlib object already fed with the first ``offset`` bytes) is updated with each block, and must
        be reset by the caller when the returned ``start`` is 0 but ``offset`` was not.
        Returns ``{"start", "written", "size"}`` (``size`` = final file size).
        """
        resp, start = self.open_object(bucket, key, offset)
        written = 0
        try:
            with _open_write(dest_path, keep=bool(start)) as handle:
                handle.seek(start)
                handle.truncate()
                while True:
                    try:
                        block = resp.read(NET_CHUNK)
                    except _RETRYABLE as exc:
                        handle.flush()
                        raise S3Error(
                            self.scrub(
                                f"{self._describe('GET', bucket, key)} broke off after {start + written} bytes: {exc}"
                            )
                        ) from None
                    if not block:
                        break
                    handle.write(block)
                    written += len(block)
                    if digest is not None:
                        digest.update(block)
                    if callback is not None:
                        callback(len(block))
                handle.flush()
                os.fsync(handle.fileno())
                size = handle.tell()
        finally:
            resp.close()
            resp.connection_to_close.close()
        expected = resp.getheader("Content-Length")
        if expected is not None and expected.isdigit() and int(expected) != written:
            raise S3Error(
                f"{self._describe('GET', bucket, key)} sent {written} of {expected} bytes; run again to resume"
            )
        return {"start": start, "written": written, "size": size}

    def list_objects(self, bucket, prefix="", page_size=1000):
        """Yield ``{"key", "size", "etag", "last_modified"}`` per object under ``prefix`` (ListObjectsV2, all pages)."""
        token = None
        for _page in range(1000000):
            query = {"list-type": "2", "max-keys": str(page_size)}
            if prefix:
                query["prefix"] = prefix
            if token:
                query["continuation-token"] = token
            _status, _headers, body = self.request("GET", bucket, None, query=query)
            objects, token = parse_list(body)
            yield from objects
            if not token:
                return
        raise S3Error(f"{self._describe('GET', bucket, prefix)} listed too many pages")  # pragma: no cover

    def put_object(self, bucket, key, data, content_type="application/octet-stream", metadata=None):
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

    def delete_object(self, bucket, key):
        """Delete an object (absent objects are fine, as in S3)."""
        self.request("DELETE", bucket, key, expect=(200, 204))

    def create_bucket(self, bucket):
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

    def create_multipart_upload(self, bucket, key, content_type="application/octet-stream"):
        """Start a multipart upload; returns its UploadId."""
        _s, _h, body = self.request("POST", bucket, key, query={"uploads": ""}, headers={"Content-Type": content_type})
        try:
            # Accepted bandit B314: as in _error (no external entities; expat >= 2.4.1).
            upload_id = _text(ET.fromstring(body), "UploadId")  # nosec B314
        except ET.ParseError:
            upload_id = None
        if not upload_id:
            raise S3Error(f"{self._describe('POST', bucket, key)} started a multipart upload without an UploadId")
        return upload_id

    def upload_part(self, bucket, key, upload_id, number, data):
        """Upload part ``number`` (1-based) of ``bytes``; returns its ETag."""
        _s, headers, _b = self.request(
            "PUT", bucket, key, query={"partNumber": str(number), "uploadId": upload_id}, body=bytes(data)
        )
        etag = headers.get("etag")
        if not etag:
            raise S3Error(f"{self._describe('PUT', bucket, key)} stored part {number} without an ETag")
        return etag

    def complete_multipart_upload(self, bucket, key, upload_id, etags):
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
            # Accepted bandit B314: as in _error (no external entities; expat >= 2.4.1).
            return (_text(ET.fromstring(answer), "ETag") or "").strip('"')  # nosec B314
        except ET.ParseError:
            return ""

    def abort_multipart_upload(self, bucket, key, upload_id):
        self.request("DELETE", bucket, key, query={"uploadId": upload_id}, expect=(200, 204, 404))

    def upload_file(
        self, bucket, key, path, part_size=DEFAULT_PART_SIZE, callback=None, content_type="application/octet-stream"
    ):
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
