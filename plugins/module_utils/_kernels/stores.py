# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel caches: the stores that hold them (a directory, an HTTP server, an S3 bucket) and their writers.

A store entry holds three files: ``kernels.tar.zst`` (a tar of the cache directory compressed with the
zstd program), its sha256 in ``kernels.tar.zst.sha256`` (sha256sum format) and ``manifest.json`` (the key,
counts, sha256). The manifest is written last: an entry without one is incomplete and never read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import stat
import time
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    DIR_MODE,
    FILE_MODE,
    KEY_FIELDS,
    MANIFEST_MAX,
    MANIFEST_NAME,
    NO_VLLM,
    SHA_NAME,
    KernelError,
    entry_parts,
    key_mismatch,
    mismatch_text,
    refusal,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, ProxyError, S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    connection,
    content_length,
    describe,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import DEFAULT_STALL, MAX_JSON_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import show_origin
from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    TEMP_PREFIX,
    SafeFileError,
    create_temp,
    free_bytes,
    make_path,
    open_dir,
    open_file,
    opened_dir,
    read_bytes,
    rename,
    set_attrs,
    unlink,
    walk,
    write_atomic,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, BinaryIO, NoReturn, TypeAlias, TypeVar

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import Scan
    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

    _T = TypeVar("_T")
    Store: TypeAlias = "PathStore | HttpStore | S3Store | HolderChain"


SCHEMA = 1
KIND = "ttfleet.kernel_cache"
SHA_MAX = 4096  # a kernels.tar.zst.sha256 file (sha256sum format: one line)
# The overall limit of a small store request (a manifest, a sha file) and the floor of the archive's, which grows by
# a second per MiB of its archive_bytes (_net.deadline.Deadline.for_size); the stall limit is the timeout option.
REQUEST_TOTAL = 300.0
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


def json_bytes(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _json_object(raw: bytes, where: str, fix: str) -> JSON:
    """The JSON object in ``raw`` (a manifest read from a store); KernelError naming ``where`` and ``fix``."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise KernelError(f"{where} is not JSON; {fix}") from None
    if not isinstance(data, dict):
        raise KernelError(f"{where} is not a JSON object; {fix}")
    return data


def build_manifest(
    key: Key,
    sha256: str,
    archive_bytes: int,
    scan: Scan,
    host: str,
    evidence: str | None,
    now: float | None = None,
) -> JSON:
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "key": {field: key.get(field) for field in KEY_FIELDS},
        "archive": ARCHIVE_NAME,
        "compression": "zstd",
        "sha256": sha256,
        "archive_bytes": archive_bytes,
        "files": scan["files"],
        "bytes": scan["bytes"],
        "host": host,
        "evidence": evidence,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }


def check_manifest(manifest: JSON, key: Key, where: str) -> JSON:
    """A store manifest that describes an archive of exactly ``key``; raises otherwise."""
    if manifest.get("kind") != KIND or manifest.get("schema") != SCHEMA:
        raise KernelError(
            f"{where} is not a kernel cache manifest of schema {SCHEMA}; remove the entry and harvest again"
        )
    found = cast("dict[str, Any]", manifest.get("key")) if isinstance(manifest.get("key"), dict) else {}
    if key_mismatch(found, key):
        raise KernelError(
            f"{mismatch_text(where, found, key)}; this store entry is misplaced: remove it and harvest again"
        )
    sha = str(manifest.get("sha256") or "")
    counts = [manifest.get(name) for name in ("files", "bytes", "archive_bytes")]
    if not HEX64_RE.match(sha) or not all(isinstance(c, int) and c >= 0 for c in counts):
        raise KernelError(f"{where} lacks a sha256, file count or byte counts; remove the entry and harvest again")
    return manifest


def parse_sha_file(text: str, where: str) -> str:
    fields = text.split()
    if not fields or not HEX64_RE.match(fields[0].lower()):
        raise KernelError(f"{where} does not start with a sha256; remove the entry and harvest again")
    return fields[0].lower()


class PathStore:
    """A directory (local disk or an NFS share) holding ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm>/``.

    Entries are opened with open_dir (a link is followed only in a root-only directory) and their files with
    open_file: a link or special file in an entry is refused, never followed or opened."""

    kind = "path"

    def __init__(self, root: str) -> None:
        if not root or not os.path.isabs(root):
            raise KernelError(f"store_path {root!r} must be an absolute directory, for example /mnt/kernel-store")
        self.root = os.path.normpath(root)

    def describe(self, key: Key | None = None) -> str:
        return os.path.join(self.root, *entry_parts(key)) if key else self.root

    def entry_dir(self, key: Key) -> str:
        return os.path.join(self.root, *entry_parts(key))

    def _read(self, key: Key, name: str, limit: int) -> bytes | None:
        """Content of ``name`` in the entry of ``key``; None when the entry or the file is missing."""
        entry = self.entry_dir(key)
        try:
            with opened_dir(entry) as fd:
                return read_bytes(fd, name, limit, where=entry)
        except FileNotFoundError:
            return None
        except SafeFileError as exc:
            raise refusal(exc, f"remove the store entry {entry} and harvest again") from None

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read(key, MANIFEST_NAME, MANIFEST_MAX)
        if raw is None:
            return None
        path = os.path.join(self.entry_dir(key), MANIFEST_NAME)
        return _json_object(raw, path, "remove the store entry and harvest again")

    def read_sha(self, key: Key) -> str:
        path = os.path.join(self.entry_dir(key), SHA_NAME)
        raw = self._read(key, SHA_NAME, 4096)
        if raw is None:
            raise KernelError(f"{path} is missing; remove the entry and harvest again")
        return parse_sha_file(raw.decode("ascii", "replace"), path)

    def open_archive(self, key: Key, size: int | None = None) -> BinaryIO:
        """The archive as a file; ``size`` (archive_bytes) is enforced by unpack, which reads exactly that."""
        entry = self.entry_dir(key)
        try:
            with opened_dir(entry) as dirfd:
                fd, _st = open_file(dirfd, ARCHIVE_NAME, where=entry)
        except FileNotFoundError:
            raise KernelError(
                f"{os.path.join(entry, ARCHIVE_NAME)} is missing; remove the entry and harvest again"
            ) from None
        except SafeFileError as exc:
            raise refusal(exc, f"remove the store entry {entry} and harvest again") from None
        return os.fdopen(fd, "rb")

    def siblings(self, key: Key) -> list[Key]:
        """Keys of complete entries for the same model, mesh and impl_id with other commits."""
        base = os.path.join(self.root, key["model_name"], key["mesh"], key["impl_id"])
        found: list[Key] = []
        try:
            base_fd = open_dir(base)
        except (OSError, SafeFileError):
            return found
        try:
            # Entries sit two levels down (<tt_metal_commit>/<vllm>); links and unreadable parts are skipped.
            for rel, _fd, entries in walk(base_fd, base, onerror=lambda _exc: None):
                parts = rel.split("/")
                if len(parts) == 2 and any(n == MANIFEST_NAME and stat.S_ISREG(st.st_mode) for n, st in entries):
                    tmc, vllm = parts
                    found.append({**key, "tt_metal_commit": tmc, "vllm_commit": None if vllm == NO_VLLM else vllm})
        finally:
            os.close(base_fd)
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key: Key) -> _PathWriter:
        return _PathWriter(self, key)


class _TempArchive:
    """The archive being packed: a random O_EXCL temporary file in ``directory``, which is held by descriptor from
    ``prepare`` to ``commit`` or ``abort``. Leftovers of an interrupted run (names starting with ``stale``) go
    first."""

    dir_fd: int | None
    fd: int | None
    tmp: str | None

    def __init__(self, directory: str, hint: str, stale: str, dir_mode: int = DIR_MODE) -> None:
        self.directory = directory
        self.hint = hint
        self.stale = stale
        self.dir_mode = dir_mode
        self.dir_fd = self.fd = self.tmp = None

    def prepare(self) -> int:
        """The descriptor to write the archive to."""
        try:
            self.dir_fd = make_path(self.directory, mode=self.dir_mode)
            with os.scandir(self.dir_fd) as entries:
                stale = [entry.name for entry in entries if entry.name.startswith(self.stale)]
            for name in stale:
                unlink(self.dir_fd, name)
            self.fd, self.tmp = create_temp(self.dir_fd, self.hint, FILE_MODE)
        except BaseException:
            self.abort()
            raise
        return self.fd

    def free_bytes(self) -> int:
        return free_bytes(cast(int, self.dir_fd))  # called between prepare and abort: set

    def abort(self) -> None:
        """Remove the temporary archive (if any) and close the descriptors; safe to call more than once."""
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                unlink(cast(int, self.dir_fd), self.tmp)  # tmp is only set after dir_fd
            self.tmp = None
        for fd in (self.fd, self.dir_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dir_fd = None


class _PathWriter(_TempArchive):
    """Writes an entry: the archive into a temporary name renamed into place, then the sha, the manifest last."""

    def __init__(self, store: PathStore, key: Key) -> None:
        super().__init__(store.entry_dir(key), ARCHIVE_NAME, TEMP_PREFIX)

    def commit(self, sha256: str, manifest: JSON) -> None:
        # Called between prepare and abort: the descriptors and the temporary name are set.
        dir_fd, fd, tmp = cast(int, self.dir_fd), cast(int, self.fd), cast(str, self.tmp)
        # A replaced entry must never pair the new archive with the old manifest: drop the manifest first.
        unlink(dir_fd, MANIFEST_NAME)
        set_attrs(fd, FILE_MODE)
        rename(dir_fd, tmp, ARCHIVE_NAME)
        self.tmp = None
        write_atomic(dir_fd, SHA_NAME, f"{sha256}  {ARCHIVE_NAME}\n".encode(), FILE_MODE)
        write_atomic(dir_fd, MANIFEST_NAME, json_bytes(manifest), FILE_MODE)
        self.abort()


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


class _Body:
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

    def __enter__(self) -> _Body:
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
    ) -> _Body | None:
        """A _Body of the entry's file ``name``; None when missing and ``missing_ok``. With ``size``, an answer that
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
            body = _Body(resp, conn, deadline, self._origin)
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
        return _json_object(raw, self.describe(key, MANIFEST_NAME), "is store_url a kernel store?")

    def read_sha(self, key: Key) -> str:
        # Never None: only missing_ok makes _read_small return None.
        raw = cast(bytes, self._read_small(key, SHA_NAME, SHA_MAX))
        return parse_sha_file(raw.decode("ascii", "replace"), self.describe(key, SHA_NAME))

    def open_archive(self, key: Key, size: int | None = None, offset: int = 0) -> _Body:
        # Never None: only missing_ok makes _open return None.
        return cast(_Body, self._open(key, ARCHIVE_NAME, size=size, offset=offset))

    def siblings(self, key: Key) -> list[Key]:
        return []

    def writer(self, key: Key) -> NoReturn:
        raise KernelError(f"the http store {self.shown} is read-only; harvest into a path or s3 store")


# What makes a holder of a fan-out round fail over to the next one.
_HOLDER_ERRORS = (KernelError, NetError, OSError)


class Span:
    """Bytes ``start`` to ``stop`` (exclusive) of an archive and the sha256 of what a stream held there: a holder's
    part of a spliced archive, or the same bytes of the archive read again whole."""

    def __init__(self, start: int, stop: int | None = None, holder: int = 0) -> None:
        self.start = start
        self.stop = stop
        self.holder = holder
        self.seen = 0
        self._digest = hashlib.sha256()

    @property
    def end(self) -> int:
        return self.start + self.seen

    def feed(self, offset: int, block: bytes) -> None:
        """Hash the part of ``block`` (found at byte ``offset`` of the archive) that falls in the span."""
        stop = offset + len(block) if self.stop is None else min(self.stop, offset + len(block))
        low = max(self.start, offset)
        if low < stop:
            self._digest.update(block[low - offset : stop - offset])
            self.seen += stop - low

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class HolderChain:
    """The holders of one fan-out round (HttpStore each) as one read-only store.

    The manifest and the sha256 come from the first holder that answers. With ``pinned`` (the archive's sha256 as
    the origin's manifest gives it, carried by the plan), a holder whose manifest or sha256 file names another
    archive is passed over, named, before a byte of its archive is read: a holder's own files prove nothing. When a
    holder fails while the archive streams (it stops, stalls, cuts the connection, answers an error), the next one
    is asked for the rest only, with ``Range`` from the byte where the last one stopped, once it names the same
    archive. The bytes are read as one stream, so the archive is still hashed and verified whole before anything is
    put in place; ``parts`` records which holder sent which bytes, so that a spliced archive that fails blames no
    one holder (operations.deploy_from_any asks the last one again for the whole archive). A holder that lacks the
    entry or fails is passed over, with a line in ``failures``."""

    kind = "http"

    def __init__(
        self,
        stores: Sequence[HttpStore],
        failures: list[str],
        pinned: str | None = None,
        witness: Sequence[Span] = (),
    ) -> None:
        if not stores:
            raise KernelError("no holder to deploy from: store_url and store_fallback_urls are empty")
        self.stores = list(stores)
        self.index = 0
        self.failures = failures
        self.pinned = pinned
        # The sha256 of the archive being read, once fixed (pinned) or a holder named it, and the holders known to
        # name that archive.
        self.sha256: str | None = pinned
        self.same: set[int] = set()
        # The part each holder sent of the archive streaming, in order (Span.holder: the index in stores).
        self.parts: list[Span] = []
        # Spans of an earlier, spliced try to hash again in this one (see operations.deploy_from_any).
        self.witness = list(witness)

    @property
    def exhausted(self) -> bool:
        return self.index >= len(self.stores)

    @property
    def spliced(self) -> bool:
        """The holder in use sent only the rest of an archive that another holder began."""
        return not self.exhausted and len(self.parts) > 1 and self.parts[-1].holder == self.index

    def describe(self, key: Key | None = None) -> str:
        return self.stores[min(self.index, len(self.stores) - 1)].describe(key)

    def describe_archive(self, key: Key) -> str:
        """Where the archive's bytes came from: one holder's archive, or the holders it was spliced from."""
        if len(self.parts) <= 1:
            return f"the archive {self.describe(key)}{ARCHIVE_NAME}"
        pieces = ", ".join(f"{self.stores[part.holder].describe()} (from byte {part.start})" for part in self.parts)
        return f"the archive spliced from {pieces}"

    def fail(self, why: object) -> None:
        """Record the holder in use as failed and pass to the next."""
        self.failures.append(f"{self.describe()}: {why}")
        self.index += 1

    def _each(self, what: Callable[[HttpStore], _T]) -> _T:
        while not self.exhausted:
            try:
                return what(self.stores[self.index])
            except _HOLDER_ERRORS as exc:
                self.fail(exc)
        raise KernelError(f"every holder failed ({len(self.stores)} asked)")

    def _against_pin(self, sha: object, what: str) -> None:
        if self.pinned is not None and sha != self.pinned:
            raise KernelError(
                f"its {what} names the archive sha256 {printable(sha, 80)}, not {self.pinned}, the sha256 the "
                "plan fixed at the origin (expected_sha256); this holder holds another archive and is refused"
            )

    def _manifest_of(self, store: HttpStore, key: Key) -> JSON | None:
        manifest = store.read_manifest(key)
        if manifest is not None:
            self._against_pin(manifest.get("sha256"), MANIFEST_NAME)
        return manifest

    def _sha_of(self, store: HttpStore, key: Key) -> str:
        sha = store.read_sha(key)
        self._against_pin(sha, SHA_NAME)
        return sha

    def read_manifest(self, key: Key) -> JSON | None:
        while True:
            manifest = self._each(lambda store: self._manifest_of(store, key))
            if manifest is not None or self.index == len(self.stores) - 1:
                return manifest
            self.fail("holds no such entry")

    def read_sha(self, key: Key) -> str:
        self.sha256 = self._each(lambda store: self._sha_of(store, key))
        self.same.add(self.index)
        return self.sha256

    def open_archive(self, key: Key, size: int | None = None) -> _ResumingBody:
        if size is None:
            raise KernelError("a holder chain needs the archive's size (archive_bytes) to resume a transfer")
        self.parts = []
        return _ResumingBody(self, key, size)

    def siblings(self, key: Key) -> list[Key]:
        return []

    def writer(self, key: Key) -> NoReturn:
        raise KernelError(f"the holders of a fan-out round ({self.describe()} first) are read-only")


class _ResumingBody:
    """The archive from the holders of a HolderChain: a failed holder's part is resumed from the next one."""

    def __init__(self, chain: HolderChain, key: Key, size: int) -> None:
        self.chain = chain
        self.key = key
        self.size = size
        self.offset = 0
        self.body: _Body | None = None

    def _next(self) -> _Body:
        chain = self.chain
        while not chain.exhausted:
            store = chain.stores[chain.index]
            try:
                if chain.index not in chain.same:
                    # Never splice another archive's bytes: the holder must name the same sha256 first. This only
                    # spares a useless transfer; the bytes themselves are proven by the digest of the whole archive.
                    sha = chain._sha_of(store, self.key)
                    if sha != chain.sha256:
                        raise KernelError(f"holds another archive (sha256 {sha}, not {chain.sha256})")
                    chain.same.add(chain.index)
                body = store.open_archive(self.key, self.size, offset=self.offset)
            except _HOLDER_ERRORS as exc:
                chain.fail(exc)
                continue
            chain.parts.append(Span(self.offset, holder=chain.index))
            return body
        raise KernelError(
            f"every holder failed ({len(chain.stores)} asked) after {self.offset} of {self.size} bytes of the archive"
        )

    def _failed(self, why: object) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None
        self.chain.fail(f"{why} (at byte {self.offset} of {self.size}; the rest was asked of the next holder)")

    def read(self, size: int = -1) -> bytes:
        while True:
            if self.body is None:
                self.body = self._next()
            try:
                block = self.body.read(size)
            except _HOLDER_ERRORS as exc:
                self._failed(exc)
                continue
            if not block and self.offset < self.size:
                self._failed("the answer ended early")
                continue
            for span in (self.chain.parts[-1], *self.chain.witness):
                span.feed(self.offset, block)
            self.offset += len(block)
            return block

    def close(self) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None

    def __enter__(self) -> _ResumingBody:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class S3Store:
    """Entries under ``s3://<bucket>/<prefix>/`` with the path store's layout, through module_utils._net.s3.client.

    Archives are packed into ``spool`` on the host (a directory with room for one archive) and uploaded from
    there; the manifest is uploaded last and removed first when an entry is replaced.
    """

    kind = "s3"

    def __init__(self, client: S3Client, bucket: str, prefix: str | None = "", spool: str | None = None) -> None:
        if not bucket:
            raise KernelError("s3_bucket is required for the s3 store, for example kernel-caches")
        self.client = client
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        self.spool = spool

    def _object(self, key: Key, name: str = "") -> str:
        return "/".join(p for p in [self.prefix, *entry_parts(key), name] if p)

    def describe(self, key: Key | None = None) -> str:
        base = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        return f"s3://{self.bucket}/{self._object(key)}/" if key else base

    def _call(self, what: str, func: Callable[..., _T], *args: Any) -> _T:
        try:
            return func(*args)
        except S3Error as exc:
            raise KernelError(f"{what} failed: {exc}; check the s3 endpoint, bucket and credentials") from None

    def _read_small(self, key: Key, name: str, limit: int, missing_ok: bool = False) -> bytes | None:
        """The object ``name`` of the entry, refused past ``limit`` bytes; None when missing and ``missing_ok``."""
        obj = self._object(key, name)
        info = self._call(f"HEAD {self.describe(key)}{name}", self.client.head_object, self.bucket, obj)
        if info is None:
            if missing_ok:
                return None
            raise KernelError(f"{self.describe(key)}{name} is missing; remove the entry and harvest again")
        if info["size"] > limit:
            raise KernelError(
                f"{self.describe(key)}{name} is {info['size']} bytes, above the {limit}-byte cap of such a file; "
                "remove the entry and harvest again"
            )
        _status, _headers, raw = self._call(
            f"GET {self.describe(key)}{name}",
            lambda: self.client.request("GET", self.bucket, obj, limit=limit),
        )
        return raw

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read_small(key, MANIFEST_NAME, MAX_JSON_BYTES, missing_ok=True)
        if raw is None:
            return None
        return _json_object(raw, f"{self.describe(key)}{MANIFEST_NAME}", "remove the entry and harvest again")

    def read_sha(self, key: Key) -> str:
        # Never None: only missing_ok makes _read_small return None.
        raw = cast(bytes, self._read_small(key, SHA_NAME, SHA_MAX))
        return parse_sha_file(raw.decode("ascii", "replace"), f"{self.describe(key)}{SHA_NAME}")

    def open_archive(self, key: Key, size: int | None = None) -> _Body:
        """The archive's body, of ``size`` bytes (what the manifest states) or refused before reading."""
        obj = self._object(key, ARCHIVE_NAME)
        resp, _start = self._call(
            f"GET {self.describe(key)}{ARCHIVE_NAME}", self.client.open_object, self.bucket, obj, 0, size
        )
        return _Body(resp, resp.connection_to_close, resp.ttfleet_deadline, show_origin(self.client.endpoint))

    def siblings(self, key: Key) -> list[Key]:
        base = "/".join(p for p in [self.prefix, key["model_name"], key["mesh"], key["impl_id"]] if p) + "/"
        listing = self._call(f"listing {self.describe()}", lambda: list(self.client.list_objects(self.bucket, base)))
        found: list[Key] = []
        for item in listing:
            parts = item["key"][len(base) :].split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_NAME:
                found.append(
                    {**key, "tt_metal_commit": parts[0], "vllm_commit": None if parts[1] == NO_VLLM else parts[1]}
                )
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key: Key) -> _S3Writer:
        if not self.spool:
            raise KernelError("the s3 store needs a spool directory on the host to pack the archive in")
        return _S3Writer(self, key)


class _S3Writer(_TempArchive):
    """Packs into the spool (by default ``<volume>/tt_metal_cache``, a directory the container UID can write) and
    uploads from the descriptor."""

    def __init__(self, store: S3Store, key: Key) -> None:
        hint = f"{key['model_name']}-{key['mesh']}.tar.zst"
        # store.spool is set: S3Store.writer refuses to make a writer without one.
        super().__init__(cast(str, store.spool), hint, f"{TEMP_PREFIX}{hint}.", dir_mode=0o700)
        self.store = store
        self.key = key

    def commit(self, sha256: str, manifest: JSON) -> None:
        store, key = self.store, self.key
        try:
            store._call(
                "DELETE of the old manifest",
                store.client.delete_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
            )
            store._call(
                f"upload to {store.describe(key)}",
                # From the descriptor that was packed and hashed: the container UID can swap names in the spool.
                store.client.upload_file,
                store.bucket,
                store._object(key, ARCHIVE_NAME),
                self.fd,
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, SHA_NAME),
                f"{sha256}  {ARCHIVE_NAME}\n".encode(),
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
                json_bytes(manifest),
            )
        finally:
            self.abort()
