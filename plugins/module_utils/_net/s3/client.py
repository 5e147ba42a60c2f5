# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""A small S3 client for S3-compatible object stores, standard library only: objects, listings and uploads.

Target hosts may lack boto3, so requests are signed with AWS Signature Version 4 (``sigv4``) and sent by
``endpoint.S3Endpoint``, which holds the bounds and the rules on credentials.

Use::

    client = S3Client("https://s3.example.net:9000", access_key, secret_key, region="us-east-1",
                      session_token=None, ca_bundle="/etc/ssl/site-ca.pem")
    info = client.head_object("models", "Qwen/Qwen3-32B/<sha>/config.json")  # None when absent
    client.get_object("models", key, "/tmp/file.part", offset=os.path.getsize("/tmp/file.part"))
    for obj in client.list_objects("models", prefix="Qwen/Qwen3-32B/"):
        print(obj["key"], obj["size"])
    client.upload_file("models", key, "/path/to/big.tar")  # single PUT or multipart by size

Every public method raises ``S3Error`` on failure: an HTTP error, and a network or protocol error alike. A GET copies
exactly the object's bytes; a listing holds at most ``MAX_LISTED_FILES`` objects; XML holding a DTD is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import content_length, copy_capped
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import (
    MAX_LISTED_FILES,
    MAX_XML_BYTES,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.endpoint import (
    DEFAULT_REGION,
    RETRYABLE,
    S3Endpoint,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.sigv4 import EMPTY_SHA256
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.xml import (
    child_text,
    parse_error,
    parse_list,
    parse_xml,
    xml_escape,
)

if TYPE_CHECKING:
    import http.client
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any, BinaryIO, Protocol

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline

    JSON = dict[str, Any]

    class Digest(Protocol):
        """A hashlib object (only its update is used)."""

        def update(self, data: bytes, /) -> None:
            ...

    class ObjectResponse(http.client.HTTPResponse):
        """The response ``S3Client.open_object`` returns, with what its reader needs set on it."""

        connection_to_close: http.client.HTTPConnection
        ttfleet_deadline: Deadline
        ttfleet_expected: int


NET_CHUNK = 1 << 20
MIN_PART_SIZE = 5 << 20
MAX_PARTS = 10000
DEFAULT_PART_SIZE = 64 << 20
# ListObjectsV2 pages of one listing: with 1000 keys a page, far more than MAX_LISTED_FILES needs.
MAX_LIST_PAGES = 10000
# RFC 9110 section 14.4: "bytes first-last/complete-length" (or "/*"); the unit is case-insensitive.
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


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


class S3Client(S3Endpoint):
    """Objects, listings and uploads of one endpoint with one set of credentials (``S3Endpoint`` documents the
    arguments)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> S3Client:
        """The client of a module's S3 options (``_net.s3.options.S3_OPTIONS``) and its ``timeout``."""
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
        module_utils._net.http.copy_capped), ``ttfleet_deadline`` (the transfer's limits, sized by the object: the
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
        except RETRYABLE as exc:
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
            declared = content_length(resp)
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
                    copy_capped(resp, write, expected, "the object", self.endpoint, deadline)
                except NetError as exc:
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

        Each page is read up to MAX_XML_BYTES; a listing of more than MAX_LISTED_FILES objects, of more than
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
            _status, _headers, body = self.request("GET", bucket, None, query=query, limit=MAX_XML_BYTES)
            try:
                objects, token = parse_list(body, MAX_LISTED_FILES - seen)
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
                f"<LocationConstraint>{xml_escape(self.region)}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        status, _headers, body_out = self.request("PUT", bucket, None, body=body, expect=(200, 409))
        if status == 409 and parse_error(body_out)[0] != "BucketAlreadyOwnedByYou":
            raise S3Error(f"s3 bucket {bucket} exists and belongs to someone else; choose another name", 409)

    # -- multipart ---------------------------------------------------------

    def create_multipart_upload(self, bucket: str, key: str, content_type: str = "application/octet-stream") -> str:
        """Start a multipart upload; returns its UploadId."""
        _s, _h, body = self.request("POST", bucket, key, query={"uploads": ""}, headers={"Content-Type": content_type})
        try:
            upload_id = child_text(parse_xml(body), "UploadId")
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
            f"<Part><PartNumber>{number}</PartNumber><ETag>{xml_escape(etag)}</ETag></Part>"
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
            return (child_text(parse_xml(answer), "ETag") or "").strip('"')
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
