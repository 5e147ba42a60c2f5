# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Kernel (tensor) caches of tt-inference-server: pack a complete cache into a store, deploy one from it.

A cache lives at ``<volume>/tt_metal_cache/cache_<model_name>/<mesh>`` (TT_CACHE_PATH). A store entry is
keyed by model_name, mesh, impl_id, tt_metal_commit and vllm_commit and holds three files:
``kernels.tar.zst`` (a tar of the cache directory compressed with the zstd program), its sha256 in
``kernels.tar.zst.sha256`` (sha256sum format) and ``manifest.json`` (the key, counts, sha256). The manifest
is written last: an entry without one is incomplete and never read.

A marker ``cache_<model_name>/.ttfleet-kernels-<mesh>.json`` beside the cache records the key of a cache this
code deployed or harvested, so that a cache built by one tt_metal_commit is never mixed with another.

``tt_metal_cache/`` and everything below it belong to the container UID, which is often a login user: every path
there is hostile. All of it goes through module_utils._safefile, relative to directory descriptors: no link is
followed, no special file is opened, new names are random and created exclusively, ownership is set on
descriptors.

Pure standard library; the host needs the ``zstd`` program (Python 3.11 has no zstd module).
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import functools
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils import _net as net
from ansible_collections.ttfleet.inference.plugins.module_utils._s3 import S3Error, hide_userinfo
from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    TEMP_PREFIX,
    SafeFileError,
    create_temp,
    free_bytes,
    human_bytes,
    kind_of,
    make_path,
    makedirs,
    open_dir,
    open_file,
    open_nearest,
    open_relative,
    open_subdir,
    opened_dir,
    read_bytes,
    read_json,
    remove_tree,
    rename,
    set_attrs,
    unlink,
    walk,
    write_atomic,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._spec import tt_metal_cache_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._weights import Progress

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import IO, Any, BinaryIO, NoReturn, ParamSpec, Protocol, TypeAlias, TypedDict, TypeVar

    from ansible_collections.ttfleet.inference.plugins.module_utils._s3 import S3Client

    _P = ParamSpec("_P")
    _R = TypeVar("_R")
    _T = TypeVar("_T")

    JSON = dict[str, Any]
    Owner = tuple[int, int]
    # A scanned entry: (relpath, kind, size, mtime_ns, mode).
    ScanEntry = tuple[str, str, int, int, int]

    class Key(TypedDict):
        """A store entry's key, as check_key returns it."""

        model_name: str
        mesh: str
        impl_id: str
        tt_metal_commit: str
        vllm_commit: str | None

    class Scan(TypedDict):
        """What scan_cache returns."""

        exists: bool
        files: int
        bytes: int
        newest_mtime: float | None
        entries: list[ScanEntry]
        temp: list[str]
        special: list[str]

    class Unpacked(TypedDict):
        """What unpack returns."""

        sha256: str
        archive_bytes: int
        files: int
        bytes: int

    class Reader(Protocol):
        """A binary source read by blocks: an open file, a _Body."""

        def read(self, size: int = ..., /) -> bytes:
            ...

    Store: TypeAlias = "PathStore | HttpStore | S3Store"

KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")
ARCHIVE_NAME = "kernels.tar.zst"
SHA_NAME = ARCHIVE_NAME + ".sha256"
MANIFEST_NAME = "manifest.json"
MARKER_PREFIX = ".ttfleet-kernels-"
ASIDE_INFIX = ".ttfleet-aside-"
SCHEMA = 1
KIND = "ttfleet.kernel_cache"
NO_VLLM = "none"
CHUNK = 1 << 20
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
_MANIFEST_MAX = 1 << 20
SHA_MAX = 4096  # a kernels.tar.zst.sha256 file (sha256sum format: one line)
# The overall limit of a small store request (a manifest, a sha file) and the floor of the archive's, which grows by
# a second per MiB of its archive_bytes (module_utils._net.Deadline.for_size); the stall limit is the timeout option.
REQUEST_TOTAL = 300.0
HEALTH_TOTAL = 60.0  # the overall limit of the warm-up health check of a harvest
# Names that mean a writer is still at work (or died mid-write): a cache holding one is not complete.
DEFAULT_TEMP_PATTERNS = (
    "*.tmp",
    "*.temp",
    "*.part",
    "*.partial",
    "*.incomplete",
    "*.lock",
    "*.swp",
    "*~",
    ".nfs*",
    TEMP_PREFIX + "*",
)
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9(][A-Za-z0-9._+,()-]*$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


class KernelError(Exception):
    """A request that cannot be carried out; the message says what, which input and how to fix it."""


LEFT_ALONE = (
    "move it away; root-run code never follows a link, opens a special file or reads outside the volume because of "
    "what a user placed in it"
)


def _refusal(exc: SafeFileError, fix: str = LEFT_ALONE) -> KernelError:
    """The KernelError of a path that module_utils._safefile refused, naming the path and the fix."""
    return KernelError(f"{exc.path} {exc.reason}. Fix: {fix}")


def _refusing(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Any SafeFileError not turned into a more specific KernelError on the way becomes one naming the path."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except SafeFileError as exc:
            raise _refusal(exc) from None

    return wrapper


# ---------------------------------------------------------------------------
# Keys and paths


def check_key(key: Mapping[str, Any]) -> Key:
    """The key with every field checked; vllm_commit may be empty (media and forge engines have none)."""
    checked: dict[str, str | None] = {}
    for field in KEY_FIELDS:
        value = key.get(field)
        value = "" if value is None else str(value)
        if field == "vllm_commit" and value in ("", NO_VLLM):
            checked[field] = None
            continue
        if not value:
            raise KernelError(f"{field} is required: take it from the model spec (ttfleet.inference.model_spec)")
        if not _COMPONENT_RE.match(value) or value in (".", ".."):
            raise KernelError(
                f"{field} {value!r} is not usable as a store path component: letters, digits and . _ + , ( ) - only"
            )
        checked[field] = value
    # Every field of KEY_FIELDS is set above, a str (vllm_commit: or None).
    return cast("Key", checked)


def key_text(key: Mapping[str, Any]) -> str:
    vllm = key.get("vllm_commit") or NO_VLLM
    return (
        f"{key['model_name']} on {key['mesh']} ({key['impl_id']}, tt_metal_commit {key['tt_metal_commit']}, "
        f"vllm_commit {vllm})"
    )


def entry_parts(key: Key) -> list[str]:
    """Store path of an entry, relative to the store root."""
    return [key["model_name"], key["mesh"], key["impl_id"], key["tt_metal_commit"], key.get("vllm_commit") or NO_VLLM]


def cache_path(volume: str, key: Key) -> str:
    return os.path.join(volume, tt_metal_cache_subdir(key["model_name"], key["mesh"]))


def cache_parent(volume: str, key: Key) -> str:
    """``<volume>/tt_metal_cache/cache_<model_name>``: the directory holding the caches of all meshes and markers."""
    return os.path.join(volume, "tt_metal_cache", f"cache_{key['model_name']}")


def marker_name(key: Key) -> str:
    return f"{MARKER_PREFIX}{key['mesh']}.json"


def marker_path(volume: str, key: Key) -> str:
    return os.path.join(cache_parent(volume, key), marker_name(key))


def _free_space(path: str) -> tuple[str, int]:
    """``(existing, bytes)``: free bytes on the filesystem of ``path`` or of its nearest existing directory."""
    fd, existing, _missing = open_nearest(path)
    try:
        return existing, free_bytes(fd)
    finally:
        os.close(fd)


def _open_parent(volume: str, key: Key, create: bool = False, owner: Owner | None = None) -> int | None:
    """A descriptor of ``cache_<model_name>`` of the volume; None when it does not exist and ``create`` is off.

    Created, a missing volume is root-owned (the volume itself is never given to the container UID) while
    ``tt_metal_cache`` and ``cache_<model_name>`` get ``owner``: the server writes its kernels there."""
    path = cache_parent(volume, key)
    try:
        if not create:
            return open_dir(path)
        os.close(make_path(volume))
        return make_path(path, owner=owner)
    except FileNotFoundError:
        if create:
            raise
        return None
    except SafeFileError as exc:
        raise _refusal(
            exc, f"make {exc.path} a real directory; kernel caches never go through a link that a user can plant"
        ) from None


def _open_cache(parent_fd: int | None, name: str, path: str) -> int | None:
    """A descriptor of the cache directory ``name`` in ``parent_fd`` (None when it is missing); anything but a
    directory there, a link included, is refused."""
    if parent_fd is None:
        return None
    try:
        return open_subdir(parent_fd, name)
    except FileNotFoundError:
        return None
    except SafeFileError:
        kind = kind_of(os.lstat(name, dir_fd=parent_fd).st_mode)
        raise KernelError(
            f"{path} exists but is not a directory; move it away so the kernel cache can go there (it is a {kind}; "
            "links are never followed)"
        ) from None


def key_mismatch(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Fields on which two keys differ, as ``[(field, found, wanted)]``."""
    return [
        (field, found.get(field), wanted.get(field))
        for field in KEY_FIELDS
        if (found.get(field) or None) != (wanted.get(field) or None)
    ]


def mismatch_text(where: str, found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    diffs = key_mismatch(found, wanted)
    fields = {field for field, _a, _b in diffs}
    parts = [f"{field} {a or NO_VLLM} (wanted {b or NO_VLLM})" for field, a, b in diffs]
    text = f"{where} was built for {', '.join(parts)}"
    if "tt_metal_commit" in fields:
        text += (
            f"; its tt_metal_commit {found.get('tt_metal_commit')} differs from this spec's tt_metal_commit "
            f"{wanted.get('tt_metal_commit')}, and kernel caches are never mixed across tt_metal_commits"
        )
    return text


# ---------------------------------------------------------------------------
# Looking at a cache on the host


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _empty_scan() -> Scan:
    return {"exists": False, "files": 0, "bytes": 0, "newest_mtime": None, "entries": [], "temp": [], "special": []}


def scan_cache(target: int | str, temp_patterns: Sequence[str] = DEFAULT_TEMP_PATTERNS) -> Scan:
    """Regular files and directories under ``target``, a directory descriptor or a path (links are not followed).

    Returns ``{"exists", "files", "bytes", "newest_mtime", "entries", "temp", "special"}`` where
    ``entries`` is a sorted list of ``(relpath, kind, size, mtime_ns, mode)`` and ``temp``/``special``
    list the relative paths of in-progress files and of anything that is neither a file nor a directory.
    """
    if not isinstance(target, int):
        try:
            fd = open_dir(target)
        except FileNotFoundError:
            return _empty_scan()
        try:
            return scan_cache(fd, temp_patterns)
        finally:
            os.close(fd)
    result = _empty_scan()
    result["exists"] = True
    newest = os.fstat(target).st_mtime
    for rel_dir, _fd, entries in walk(target):
        for name, est in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            newest = max(newest, est.st_mtime)
            if _matches(name, temp_patterns):
                result["temp"].append(rel)
            if stat.S_ISDIR(est.st_mode):
                result["entries"].append((rel, "dir", 0, est.st_mtime_ns, est.st_mode & 0o777))
            elif stat.S_ISREG(est.st_mode):
                result["entries"].append((rel, "file", est.st_size, est.st_mtime_ns, est.st_mode & 0o777))
                result["files"] += 1
                result["bytes"] += est.st_size
            else:
                result["special"].append(rel)
    result["entries"].sort()
    result["temp"].sort()
    result["special"].sort()
    result["newest_mtime"] = newest
    return result


def completeness_problems(scan: Scan, path: str, quiet_seconds: float = 0, now: float | None = None) -> list[str]:
    """Why the scanned cache is not complete (empty when it is).

    Complete means: the directory exists, holds at least one non-empty regular file, holds nothing but
    regular files and directories, no in-progress or temporary file, and nothing in it changed during the
    last ``quiet_seconds`` (a server still capturing traces keeps writing).
    """
    if not scan["exists"]:
        return [f"{path} does not exist"]
    problems = []
    if scan["files"] == 0 or scan["bytes"] == 0:
        problems.append(f"{path} holds no data ({scan['files']} files, {scan['bytes']} bytes)")
    if scan["temp"]:
        problems.append(f"{path} holds in-progress or temporary files: {', '.join(scan['temp'][:5])}")
    if scan["special"]:
        special = ", ".join(scan["special"][:5])
        problems.append(f"{path} holds entries that are neither files nor directories: {special}")
    if quiet_seconds and scan["newest_mtime"] is not None:
        now = time.time() if now is None else now
        age = now - scan["newest_mtime"]
        if age < quiet_seconds:
            problems.append(
                f"{path} changed {max(age, 0):.0f} s ago, less than quiet_seconds={quiet_seconds}: the server may "
                "still be writing kernels; harvest again later"
            )
    return problems


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


# ---------------------------------------------------------------------------
# Stores


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
    if not _HEX64_RE.match(sha) or not all(isinstance(c, int) and c >= 0 for c in counts):
        raise KernelError(f"{where} lacks a sha256, file count or byte counts; remove the entry and harvest again")
    return manifest


def parse_sha_file(text: str, where: str) -> str:
    fields = text.split()
    if not fields or not _HEX64_RE.match(fields[0].lower()):
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
            raise _refusal(exc, f"remove the store entry {entry} and harvest again") from None

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read(key, MANIFEST_NAME, _MANIFEST_MAX)
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
            raise _refusal(exc, f"remove the store entry {entry} and harvest again") from None
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


def _split_userinfo(url: str) -> tuple[str, dict[str, str]]:
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
    module_utils._net.NetError naming the origin; closing it closes the connection."""

    def __init__(
        self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: net.Deadline, url: str
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
            raise net.describe(exc, self.deadline, self.url) from None
        self.deadline.check()
        return data

    def read_capped(self, limit: int, what: str) -> bytes:
        return net.read_capped(self.resp, limit, what, self.url, self.deadline)

    def close(self) -> None:
        self.resp.close()
        self.conn.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _too_slow(deadline: net.Deadline) -> bool:
    return deadline.expired or deadline.remaining() <= 0


class HttpStore:
    """Read-only store over HTTP with the path store's layout (a peer's temporary server, a web server).

    Every request goes to the origin of ``url`` and nowhere else: a peer's URL holds its access token in the path,
    so redirects are never followed. Each request has a stall limit (``timeout``) and an overall one (``total``;
    for the archive, more by its size)."""

    kind = "http"

    def __init__(self, url: str, timeout: float | None = 60, total: float = REQUEST_TOTAL) -> None:
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise KernelError(f"store_url {url!r} is not an http(s) URL, for example http://peer-host:8765/")
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
            # Not shown: the path of a peer's URL is its access token.
            raise KernelError("store_url holds spaces or control characters; check the variable that sets it")
        self.url = url.rstrip("/") + "/"
        self.timeout = float(timeout or net.DEFAULT_STALL)
        self.total = float(total)
        # What messages, results and the marker show: no credentials, and not the path of the base URL, which for
        # a fleet peer (weights_server) is its access token; the marker is readable by every user of the host.
        parts = urllib.parse.urlsplit(self.url)
        base = "<base path>/" if parts.path.strip("/") else ""
        self.shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/{base}"
        target, self._headers = _split_userinfo(self.url)
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
        self._origin = net.show_origin(target)

    @staticmethod
    def _entry(key: Key, name: str) -> str:
        return "/".join(urllib.parse.quote(p, safe="") for p in [*entry_parts(key), name])

    def _url(self, key: Key, name: str) -> str:
        return self.url + self._entry(key, name)

    def describe(self, key: Key | None = None, name: str = "") -> str:
        return self.shown + self._entry(key, name) if key else self.shown

    def _failure(self, shown: str, exc: Exception, deadline: net.Deadline) -> KernelError:
        if _too_slow(deadline):
            return KernelError(
                f"{shown} did not finish within its {deadline.total:.0f} s limit; the store is too slow or stalled. "
                "Check store_url and the network"
            )
        why = net.describe(exc, deadline, self._origin)
        return KernelError(f"{shown} failed: {why}; check store_url and that the store is serving")

    def _open(self, key: Key, name: str, missing_ok: bool = False, size: int | None = None) -> _Body | None:
        """A _Body of the entry's file ``name``; None when missing and ``missing_ok``. With ``size``, an answer that
        declares another length is refused."""
        shown = self.describe(key, name)
        if size is None:
            deadline = net.Deadline(total=self.total, stall=self.timeout, what="the answer")
        else:
            deadline = net.Deadline.for_size(size, stall=self.timeout, what="the archive", floor=self.total)
        conn = None
        try:
            conn = net.connection(self._scheme, self._host, self._port, deadline)
            conn.request("GET", self._base + self._entry(key, name), headers=self._headers)
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError, ValueError, net.NetError) as exc:
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
                to = f" to {net.show_origin(location)}" if "://" in location else ""
                raise KernelError(
                    f"{shown} answered HTTP {resp.status}, a redirect{to}; a kernel store's redirects are not followed "
                    "(a peer's URL holds its access token). Set store_url to the store itself"
                )
            if resp.status != 200:
                raise KernelError(f"{shown} answered HTTP {resp.status}; check store_url and that the store is serving")
            declared = net.content_length(resp)
            if size is not None and declared is not None and declared != size:
                raise KernelError(
                    f"{shown} is {declared} bytes where its manifest states {size} (archive_bytes); refused. Remove "
                    "the store entry and harvest again"
                )
        except BaseException:
            resp.close()
            conn.close()
            raise
        return _Body(resp, conn, deadline, self._origin)

    def _read_small(self, key: Key, name: str, limit: int, missing_ok: bool = False) -> bytes | None:
        body = self._open(key, name, missing_ok=missing_ok)
        if body is None:
            return None
        with body:
            try:
                return body.read_capped(limit, name)
            except net.NetError as exc:
                raise self._failure(self.describe(key, name), exc, body.deadline) from None

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read_small(key, MANIFEST_NAME, net.MAX_JSON_BYTES, missing_ok=True)
        if raw is None:
            return None
        return _json_object(raw, self.describe(key, MANIFEST_NAME), "is store_url a kernel store?")

    def read_sha(self, key: Key) -> str:
        # Never None: only missing_ok makes _read_small return None.
        raw = cast(bytes, self._read_small(key, SHA_NAME, SHA_MAX))
        return parse_sha_file(raw.decode("ascii", "replace"), self.describe(key, SHA_NAME))

    def open_archive(self, key: Key, size: int | None = None) -> _Body:
        # Never None: only missing_ok makes _open return None.
        return cast(_Body, self._open(key, ARCHIVE_NAME, size=size))

    def siblings(self, key: Key) -> list[Key]:
        return []

    def writer(self, key: Key) -> NoReturn:
        raise KernelError(f"the http store {self.shown} is read-only; harvest into a path or s3 store")


class S3Store:
    """Entries under ``s3://<bucket>/<prefix>/`` with the path store's layout, through module_utils._s3.

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
        raw = self._read_small(key, MANIFEST_NAME, net.MAX_JSON_BYTES, missing_ok=True)
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
        return _Body(resp, resp.connection_to_close, resp.ttfleet_deadline, net.show_origin(self.client.endpoint))

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


# ---------------------------------------------------------------------------
# zstd through its program


def find_zstd(host: str) -> str:
    found = shutil.which("zstd") or next(
        (p for p in ("/usr/bin/zstd", "/usr/local/bin/zstd", "/bin/zstd") if os.access(p, os.X_OK)), None
    )
    if not found:
        raise KernelError(
            f"{host}: the zstd program is missing (kernel cache archives are .tar.zst): install the zstd package "
            "(apt-get install zstd); the role ttfleet.inference.model_cache installs it when a store is set"
        )
    return found


def _tarinfo(name: str, kind: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        info.mode = DIR_MODE
    else:
        info.size = size
        info.mode = EXEC_MODE if mode & 0o111 else FILE_MODE
    return info


def _abort(proc: subprocess.Popen[bytes], thread: threading.Thread) -> None:
    """Stop a zstd pipe and the thread that feeds or drains it."""
    proc.kill()
    thread.join()
    proc.wait()


class _OneDir:
    """The descriptor of one directory below ``base`` at a time, opened by ``opener(base, relpath)``: scanned
    entries and archive members come sorted, so consecutive files mostly share their directory."""

    rel: str | None
    fd: int | None

    def __init__(self, base: int, opener: Callable[[int, str], int]) -> None:
        self.base = base
        self.opener = opener
        self.rel = self.fd = None

    def get(self, rel: str) -> int:
        if self.fd is None or rel != self.rel:
            self.close()
            self.fd = self.opener(self.base, rel)
            self.rel = rel
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.rel = self.fd = None


def pack(
    cache_fd: int,
    scan: Scan,
    out_fd: int,
    zstd: str,
    level: int = 3,
    progress: Progress | None = None,
    where: str = "",
) -> tuple[str, int]:
    """Tar the scanned entries of the directory ``cache_fd`` through ``zstd`` into the file ``out_fd``.

    Returns ``(sha256, archive_bytes)``, hashed while written (no second pass). Every file is opened relative to
    its directory's descriptor as a regular file: an entry swapped for a link or a special file since the scan is
    refused, never followed or opened. A file whose size changes while it is read fails the pack: the cache was
    not complete after all.
    """
    # Accepted bandit B603: fixed argv: zstd found on PATH, an int level.
    proc = subprocess.Popen(  # nosec B603
        [zstd, "-q", f"-{int(level)}", "-T0", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    digest = hashlib.sha256()
    state: dict[str, Any] = {"bytes": 0, "error": None}
    cache_uid = os.fstat(cache_fd).st_uid

    def drain() -> None:
        try:
            with os.fdopen(out_fd, "wb", closefd=False) as out:
                while True:
                    # stdin and stdout are pipes (subprocess.PIPE): never None.
                    block = cast("IO[bytes]", proc.stdout).read(CHUNK)
                    if not block:
                        break
                    digest.update(block)
                    out.write(block)
                    state["bytes"] += len(block)
                out.flush()
                os.fsync(out_fd)
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
            cast("IO[bytes]", proc.stdout).close()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    dirs = _OneDir(cache_fd, lambda base, rel: open_relative(base, rel, where))
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel, kind, size, _mtime, mode in scan["entries"]:
                info = _tarinfo(rel, kind, size, mode)
                if kind == "dir":
                    tar.addfile(info)
                    continue
                full = os.path.join(where, rel)
                dirname, name = os.path.split(rel)
                try:
                    fd, st = open_file(dirs.get(dirname), name, where=os.path.join(where, dirname))
                except SafeFileError as exc:
                    raise _refusal(
                        exc, "it was a regular file when the cache was scanned; harvest again once nothing writes to it"
                    ) from None
                with os.fdopen(fd, "rb") as handle:
                    if st.st_size != size:
                        raise KernelError(f"{full} changed size while the cache was packed; harvest again later")
                    # A hard link to a file of someone else (possible where fs.protected_hardlinks is off) is
                    # not the cache's own data.
                    if st.st_nlink > 1 and st.st_uid != cache_uid:
                        raise KernelError(
                            f"{full} is a hard link to a file owned by uid {st.st_uid}, not by the cache's owner; "
                            "it is not packed. Fix: remove it from the cache"
                        )
                    tar.addfile(info, handle)
                if progress is not None:
                    progress.advance(size, rel)
        cast("IO[bytes]", proc.stdin).close()
    except BaseException:
        _abort(proc, thread)
        raise
    finally:
        dirs.close()
    thread.join()
    rc = proc.wait()
    if state["error"] is not None:
        raise KernelError(f"writing the archive of {where} failed: {state['error']}")
    if rc != 0:
        raise KernelError(f"zstd failed with exit code {rc} while packing {where}")
    return digest.hexdigest(), state["bytes"]


def _member_parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or "\0" in name:
        raise KernelError(f"the archive holds an unsafe member name {name!r}; it was not written by this collection")
    return parts


def _read_exact(source: Reader, expected: int, push: Callable[[bytes], object]) -> int:
    """Pass exactly the first ``expected`` bytes of ``source`` to ``push``; a byte more is refused before it is
    passed on. Returns the bytes passed (fewer when the source ends early)."""
    done = 0
    while done < expected:
        block = source.read(min(CHUNK, expected - done))
        if not block:
            return done
        push(block)
        done += len(block)
    if source.read(1):
        raise KernelError(
            f"the archive runs past the {expected} bytes (archive_bytes) its manifest states; refused before "
            "unpacking more"
        )
    return done


def unpack(
    source: Reader,
    staging_fd: int,
    zstd: str,
    max_bytes: int,
    owner: Owner | None = None,
    progress: Progress | None = None,
    expected: int | None = None,
) -> Unpacked:
    """Extract a .tar.zst stream into the empty directory ``staging_fd``, hashing the stream as it is read.

    Only regular files and directories are written (no links, devices or absolute/parent paths), each created
    relative to its directory's descriptor (new files with O_EXCL, never through a link) and given ``owner`` on
    its descriptor; writing stops once more than ``max_bytes`` come out. With ``expected`` (the manifest's
    archive_bytes), exactly that many bytes of ``source`` are read: a longer source fails before its extra bytes
    reach zstd.
    Returns ``{"sha256", "archive_bytes", "files", "bytes"}``.
    """
    # Accepted bandit B603: fixed argv: zstd found on PATH, reading the archive from a pipe.
    proc = subprocess.Popen(  # nosec B603
        [zstd, "-q", "-d", "-c", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    digest = hashlib.sha256()
    state: dict[str, Any] = {"bytes": 0, "error": None}

    def push(block: bytes) -> None:
        digest.update(block)
        state["bytes"] += len(block)
        # stdin and stdout are pipes (subprocess.PIPE): never None.
        cast("IO[bytes]", proc.stdin).write(block)
        if progress is not None:
            progress.advance(len(block), ARCHIVE_NAME)

    def feed() -> None:
        try:
            if expected is not None:
                _read_exact(source, expected, push)
                return
            while True:
                block = source.read(CHUNK)
                if not block:
                    break
                push(block)
        except BrokenPipeError:
            pass
        except BaseException as exc:  # reported by the main thread
            state["error"] = exc
        finally:
            with contextlib.suppress(OSError):
                cast("IO[bytes]", proc.stdin).close()

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    files = total = 0
    dirs = _OneDir(staging_fd, lambda base, rel: makedirs(base, rel, DIR_MODE, owner))
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                parts = _member_parts(member.name)
                if member.isdir():
                    dirs.get("/".join(parts))
                    continue
                if not member.isfile():
                    raise KernelError(
                        f"the archive holds {member.name!r}, which is not a regular file or directory; refused"
                    )
                total += member.size
                if total > max_bytes:
                    raise KernelError(f"the archive unpacks to more than the {max_bytes} bytes its manifest states")
                mode = EXEC_MODE if member.mode & 0o111 else FILE_MODE
                fd = os.open(
                    parts[-1],
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                    dir_fd=dirs.get("/".join(parts[:-1])),
                )
                with os.fdopen(fd, "wb") as out:
                    # A regular file (member.isfile() above): extractfile never returns None for one.
                    shutil.copyfileobj(cast("IO[bytes]", tar.extractfile(member)), out, CHUNK)
                    out.flush()
                    set_attrs(fd, mode, owner)
                files += 1
        # Read to the end, so the hash covers the whole archive (tar pads past its end-of-archive blocks).
        while cast("IO[bytes]", proc.stdout).read(CHUNK):
            pass
    except tarfile.TarError as exc:
        _abort(proc, thread)
        if state["error"] is not None:
            # The stream was cut (too long, too slow, broken): that, not the torn tar, is the cause.
            raise _read_failure(state["error"]) from None
        raise KernelError(
            f"the archive is not a readable tar.zst ({exc}); remove the store entry and harvest again"
        ) from None
    except BaseException:
        _abort(proc, thread)
        raise
    finally:
        dirs.close()
    thread.join()
    rc = proc.wait()
    if state["error"] is not None:
        raise _read_failure(state["error"])
    if rc != 0:
        raise KernelError(
            f"zstd could not decompress the archive (exit code {rc}); remove the store entry and harvest again"
        )
    return {"sha256": digest.hexdigest(), "archive_bytes": state["bytes"], "files": files, "bytes": total}


def _read_failure(error: BaseException) -> KernelError:
    if isinstance(error, KernelError):
        return error
    return KernelError(f"reading the archive failed: {error}")


def clear_leftovers(parent_fd: int, mesh: str) -> list[str]:
    """Remove the staging directories of an interrupted deploy of ``mesh`` (ours: TEMP_PREFIX + mesh) from
    ``parent_fd``, never following a link in them."""
    prefix = f"{TEMP_PREFIX}{mesh}-"
    with os.scandir(parent_fd) as entries:
        names = sorted(entry.name for entry in entries if entry.name.startswith(prefix))
    for name in names:
        with contextlib.suppress(OSError, SafeFileError):
            remove_tree(parent_fd, name)
    return names


def _make_staging(parent_fd: int, mesh: str, parent: str) -> tuple[str, int]:
    """``(name, fd)`` of a new root-only directory with a random name in ``parent_fd``: mkdir never reuses an
    existing name, so nothing a user planted becomes the staging directory."""
    for _attempt in range(16):
        name = f"{TEMP_PREFIX}{mesh}-{secrets.token_hex(8)}"
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            continue
        fd = open_subdir(parent_fd, name, parent)
        if os.fstat(fd).st_uid != os.geteuid():
            os.close(fd)
            raise KernelError(f"{parent}/{name} was replaced right after it was made; nothing was deployed. Run again")
        return name, fd
    raise KernelError(f"{parent}: no free name for a staging directory after 16 tries")


# ---------------------------------------------------------------------------
# Operations


def check_health(url: str, timeout: float = 10, total: float = HEALTH_TOTAL) -> str | None:
    """None when ``url`` answers HTTP 200, else the reason. The body is not read; the check stalls for at most
    ``timeout`` seconds and lasts at most ``total``; a broken answer (not HTTP, reset) is a reason, not a crash."""
    shown = net.printable(hide_userinfo(url), 300)
    target, credentials = _split_userinfo(url)
    deadline = net.Deadline(total=total, stall=timeout, what="the health check")
    try:
        resp = net.open_url(target, deadline, credentials=credentials)
    except urllib.error.HTTPError as exc:
        exc.close()
        return f"{shown} answered HTTP {exc.code}"
    except net.NetError as exc:
        return f"{shown} is unreachable or broken ({exc})"
    with contextlib.closing(resp):
        status = resp.status
    return None if status == 200 else f"{shown} answered HTTP {status}"


def _marker(parent_fd: int | None, volume: str, key: Key) -> tuple[str, JSON | None]:
    """``(path, data)`` of the marker of ``key``; data is None when there is none. A link, FIFO or other special
    file in its place is refused at once (never opened blocking)."""
    path = marker_path(volume, key)
    if parent_fd is None:
        return path, None
    fix = "remove it (it only records where the cache came from) and run again"
    try:
        data = read_json(parent_fd, marker_name(key), _MANIFEST_MAX, where=os.path.dirname(path))
    except SafeFileError as exc:
        raise _refusal(exc, fix) from None
    if data is not None and not isinstance(data.get("key"), dict):
        raise KernelError(f"{path} has no key; {fix}")
    return path, data


def _write_marker(parent_fd: int, key: Key, data: JSON, owner: Owner | None) -> None:
    """Replace the marker through a random O_EXCL temporary name; owner and mode are set on its descriptor."""
    write_atomic(parent_fd, marker_name(key), json_bytes(data), FILE_MODE, owner)


@_refusing
def harvest(options: Mapping[str, Any], store: Store, check_mode: bool = False, now: float | None = None) -> JSON:
    """Pack the complete cache of ``options['volume']`` into ``store`` unless the store already holds the key."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    force = bool(options.get("force"))
    where = f"{host}:{path}"
    patterns = options.get("temp_patterns") or DEFAULT_TEMP_PATTERNS
    with contextlib.ExitStack() as fds:
        parent_fd = _open_parent(volume, key)
        if parent_fd is not None:
            fds.callback(os.close, parent_fd)
        marker_file, marker = _marker(parent_fd, volume, key)
        if marker is not None and key_mismatch(marker["key"], key):
            raise KernelError(
                f"{mismatch_text(f'the kernel cache {where} (recorded in {marker_file})', marker['key'], key)}. "
                "Fix: harvest with the key of the spec that built it, or warm this host up with the spec to harvest"
            )
        result: JSON = {
            "changed": False,
            "action": "none",
            "cache_path": path,
            "store": store.describe(key),
            "key": key,
        }
        existing = store.read_manifest(key)
        if existing is not None and not force:
            check_manifest(existing, key, f"the store entry {store.describe(key)}")
            result.update(
                reason=(
                    f"the store already holds {key_text(key)} (from {existing.get('host')}, "
                    f"{existing.get('created_at')})"
                ),
                manifest=existing,
            )
            return result

        cache_fd = _open_cache(parent_fd, key["mesh"], path)
        if cache_fd is not None:
            fds.callback(os.close, cache_fd)
        scan = _empty_scan() if cache_fd is None else scan_cache(cache_fd, patterns)
        problems = completeness_problems(scan, where, options.get("quiet_seconds") or 0, now)
        if marker is not None and not key_mismatch(marker["key"], key):
            evidence = f"marker {marker_file} ({marker.get('evidence') or marker.get('source')})"
        elif options.get("require_marker"):
            problems.append(
                f"{host} holds no record ({marker_file}) that its cache of this key is complete; harvest it there "
                "first (tasks_from: harvest, after a warm-up) or deploy it there from a store"
            )
            evidence = None
        elif options.get("warmed"):
            evidence = "operator flag warmed"
        elif options.get("health_url"):
            why = check_health(options["health_url"], options.get("timeout") or 10)
            if why:
                problems.append(f"no evidence of a successful warm-up: {why}")
            evidence = f"health {options['health_url']}"
        else:
            problems.append("no evidence of a successful warm-up: set health_url to the warmed server's /health URL")
            evidence = None
        if problems:
            raise KernelError(
                f"refusing to harvest the incomplete kernel cache of {key_text(key)}: " + "; ".join(problems) + ". "
                "Fix: harvest after a successful warm-up (health_url answering 200, or warmed: true once you have "
                "checked it), with no server writing to the cache"
            )
        result.update(
            changed=True,
            action="harvested",
            files=scan["files"],
            bytes=scan["bytes"],
            evidence=evidence,
            reason=f"packed {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}",
        )
        if check_mode:
            result["reason"] = f"would pack {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}"
            return result
        zstd = find_zstd(host)
        writer = store.writer(key)
        out_fd = writer.prepare()
        try:
            space = writer.free_bytes()
            if space < scan["bytes"] // 2:
                raise KernelError(
                    f"{host}: the store {store.describe()} has {human_bytes(space)} free, too little for an archive "
                    f"of {human_bytes(scan['bytes'])} of cache; free space there"
                )
            progress = Progress(scan["bytes"], options.get("status_file"))
            # Not None here: a missing cache (or cache_<model_name>) fails completeness_problems, which raises above.
            sha, archive_bytes = pack(
                cast(int, cache_fd), scan, out_fd, zstd, options.get("level") or 3, progress, path
            )
            after = scan_cache(cast(int, cache_fd), patterns)
            if after["entries"] != scan["entries"]:
                raise KernelError(
                    f"the kernel cache {where} changed while it was packed; harvest again once it is idle"
                )
            manifest = build_manifest(key, sha, archive_bytes, scan, host, evidence, now)
            writer.commit(sha, manifest)
            progress.write(state="done")
        except BaseException:
            writer.abort()
            raise
        _write_marker(
            cast(int, parent_fd),  # not None: see cache_fd above
            key,
            {
                "key": manifest["key"],
                "sha256": sha,
                "source": "harvest",
                "evidence": evidence,
                "at": manifest["created_at"],
            },
            (options.get("owner", 1000), options.get("group", 1000)),
        )
    result.update(manifest=manifest, sha256=sha, archive_bytes=archive_bytes, hashed=True)
    return result


def dir_state(parent_fd: int | None, name: str, path: str) -> str:
    """``absent``, ``empty`` or ``nonempty`` for the cache directory ``name`` in ``parent_fd`` (None: absent);
    anything but a directory there is an error."""
    fd = _open_cache(parent_fd, name, path)
    if fd is None:
        return "absent"
    try:
        with os.scandir(fd) as entries:
            return "nonempty" if next(entries, None) is not None else "empty"
    finally:
        os.close(fd)


@_refusing
def local_state(options: Mapping[str, Any]) -> JSON:
    """What is at the cache path of the key: ``{"path", "marker_file", "kind", "in_place", "aside", "reason"}``.

    ``in_place``: a cache deployed or harvested with this key is there. ``aside``: the cache in the way that a
    deploy moves aside first (only with ``force``). ``reason`` is set when a deploy has nothing to do. A cache
    recorded for another key is refused without ``force``.
    """
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    where = f"{host}:{path}"
    parent_fd = _open_parent(volume, key)
    try:
        marker_file, marker = _marker(parent_fd, volume, key)
        # Only whether something is there: a converged host must not walk a cache of tens of thousands of files.
        kind = dir_state(parent_fd, key["mesh"], path)
    finally:
        if parent_fd is not None:
            os.close(parent_fd)
    state: JSON = {
        "path": path,
        "marker_file": marker_file,
        "kind": kind,
        "in_place": False,
        "aside": None,
        "reason": None,
    }
    if kind != "nonempty":
        return state
    if marker is not None and not key_mismatch(marker["key"], key):
        state["in_place"] = True
        state["reason"] = f"{where} already holds {key_text(key)} ({marker.get('source')}, {marker.get('at')})"
    elif marker is not None:
        text = mismatch_text(f"the kernel cache {where} (recorded in {marker_file})", marker["key"], key)
        if not options.get("force"):
            raise KernelError(
                f"{text}. Fix: set force: true to move it aside and deploy {key_text(key)}, or serve the spec "
                "it was built for"
            )
        state["aside"] = path
    elif not options.get("force"):
        state["reason"] = (
            f"{where} holds a kernel cache that no store deployed (compiled here or preseeded); it is left as "
            "it is. Set force: true to move it aside and deploy from the store"
        )
    else:
        state["aside"] = path
    return state


def inspect(options: Mapping[str, Any]) -> JSON:
    """Read-only: whether a deploy of the key would change anything, without asking a store."""
    key = check_key(options)
    state = local_state(options)
    return {
        "changed": False,
        "action": "none",
        "cache_path": state["path"],
        "key": key,
        "in_place": state["in_place"],
        "deployable": state["reason"] is None,
        "reason": state["reason"] or f"{state['path']} can take the kernel cache of {key_text(key)} from a store",
    }


@_refusing
def deploy(options: Mapping[str, Any], store: Store, check_mode: bool = False, now: float | None = None) -> JSON:
    """Put the store's archive of the key in place at the volume's cache path, verified, staged, renamed."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    owner = (options.get("owner", 1000), options.get("group", 1000))
    volume = os.path.normpath(options["volume"])
    state = local_state(options)
    path, aside = state["path"], state["aside"]
    parent = os.path.dirname(path)
    mesh = key["mesh"]
    result: JSON = {"changed": False, "action": "none", "cache_path": path, "store": store.describe(key), "key": key}
    if state["reason"]:
        result["reason"] = state["reason"]
        return result

    manifest = store.read_manifest(key)
    if manifest is None:
        others = store.siblings(key)
        if others:
            commits = ", ".join(sorted({f"{k['tt_metal_commit']}/{k.get('vllm_commit') or NO_VLLM}" for k in others}))
            reason = (
                f"the store {store.describe()} holds kernel caches of {key['model_name']} on {key['mesh']} "
                f"({key['impl_id']}) only for tt_metal_commit/vllm_commit {commits}, not for this spec's "
                f"tt_metal_commit {key['tt_metal_commit']} / vllm_commit {key.get('vllm_commit') or NO_VLLM}; kernel "
                "caches are never mixed across tt_metal_commits. Harvest one from a host warmed up with this spec"
            )
        else:
            reason = (
                f"the store {store.describe()} holds no kernel cache of {key_text(key)}; harvest one after a warm-up"
            )
        if options.get("required"):
            raise KernelError(f"{host}: {reason}")
        result.update(reason=reason, missing=True)
        return result
    check_manifest(manifest, key, f"the store entry {store.describe(key)}")
    result.update(manifest=manifest, files=manifest["files"], bytes=manifest["bytes"])
    need = manifest["bytes"] + int(float(options.get("disk_margin_gb") or 0) * (1 << 30))
    measured, space = _free_space(parent)
    if space < need:
        raise KernelError(
            f"{host}: {measured} has {human_bytes(space)} free; the kernel cache of {key_text(key)} "
            f"needs {human_bytes(manifest['bytes'])} plus the margin of {options.get('disk_margin_gb') or 0} GiB. "
            "Free space on the volume filesystem"
        )
    result.update(changed=True, action="deployed")
    verb = "would deploy" if check_mode else "deployed"
    result["reason"] = (
        f"{verb} {manifest['files']} files ({human_bytes(manifest['bytes'])}) of {key_text(key)} from "
        f"{store.describe(key)}" + (", moving the cache in place aside first" if aside else "")
    )
    if check_mode:
        return result

    zstd = find_zstd(host)
    sha_file = store.read_sha(key)
    if sha_file != manifest["sha256"]:
        raise KernelError(
            f"the store entry {store.describe(key)} is inconsistent: {SHA_NAME} says {sha_file}, the manifest "
            f"{manifest['sha256']}; remove the entry and harvest again"
        )
    # Never None with create: a missing directory is made, a failure raises.
    parent_fd = cast(int, _open_parent(volume, key, create=True, owner=owner))
    try:
        clear_leftovers(parent_fd, mesh)
        staging, staging_fd = _make_staging(parent_fd, mesh, parent)
        try:
            progress = Progress(manifest["archive_bytes"], options.get("status_file"))
            with store.open_archive(key, manifest["archive_bytes"]) as source:
                try:
                    got = unpack(
                        source, staging_fd, zstd, manifest["bytes"], owner, progress, expected=manifest["archive_bytes"]
                    )
                except KernelError as exc:
                    raise KernelError(f"{store.describe(key)}{ARCHIVE_NAME}: {exc}; nothing was put in place") from None
            progress.write(state="done")
            problems = []
            if got["sha256"] != manifest["sha256"]:
                problems.append(f"sha256 {got['sha256']} instead of {manifest['sha256']}")
            if got["archive_bytes"] != manifest["archive_bytes"]:
                problems.append(f"{got['archive_bytes']} archive bytes instead of {manifest['archive_bytes']}")
            if (got["files"], got["bytes"]) != (manifest["files"], manifest["bytes"]):
                problems.append(
                    f"{got['files']} files / {got['bytes']} bytes instead of {manifest['files']} / {manifest['bytes']}"
                )
            if problems:
                raise KernelError(
                    f"the archive {store.describe(key)}{ARCHIVE_NAME} does not match its manifest "
                    f"({'; '.join(problems)}); nothing was put in place. Remove the store entry and harvest again"
                )
            set_attrs(staging_fd, DIR_MODE, owner)
            # The parent belongs to the container UID: its names may have been swapped while the archive streamed.
            named, ours = os.lstat(staging, dir_fd=parent_fd), os.fstat(staging_fd)
            if (named.st_dev, named.st_ino) != (ours.st_dev, ours.st_ino):
                raise KernelError(
                    f"{parent}/{staging} was replaced while the cache was unpacked into it; nothing was put in place. "
                    "Run again"
                )
            if aside:
                moved = f"{mesh}{ASIDE_INFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"
                os.rename(mesh, moved, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                result["moved_aside"] = os.path.join(parent, moved)
            elif state["kind"] == "empty":
                os.rmdir(mesh, dir_fd=parent_fd)
            os.rename(staging, mesh, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError, SafeFileError):
                remove_tree(parent_fd, staging)
            raise
        finally:
            os.close(staging_fd)
        _write_marker(
            parent_fd,
            key,
            {
                "key": manifest["key"],
                "sha256": manifest["sha256"],
                "source": f"store {store.describe(key)}",
                "evidence": manifest.get("evidence"),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            },
            owner,
        )
    finally:
        os.close(parent_fd)
    result.update(sha256=got["sha256"], archive_bytes=got["archive_bytes"], hashed=True)
    return result
