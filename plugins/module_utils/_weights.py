# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights in ``weights/<model_name>/``: listing a source, planning, fetching, verifying.

Private to the collection and standard library only: target hosts may lack huggingface_hub, so the
Hugging Face Hub HTTP protocol is spoken directly (revision, tree and resolve endpoints). The layout
written is a plain ``--local-dir`` snapshot, never the HF cache with its symlinks.

The work is split so that check mode and tests can stop at any stage: ``list_hf_source`` /
``list_path_source`` describe the source, ``plan_weights`` compares it with the destination and its
manifest (reading only), ``check_disk`` refuses before anything is written, ``fetch_hf`` /
``fetch_path`` fill a staging directory beside the destination (same filesystem, resumable, root's 0700),
``place_files`` + ``write_manifest`` move complete files into place, and ``apply_layout`` gives the weights
(and their volume) the ownership layout. ``sync_weights`` runs the stages in order for the module.

The container user may own the volume, ``weights/`` and the staging directory (an older release, a factory
volume), so every file operation goes through ``_safefile``: directory descriptors, no link followed, no
special file opened, random O_EXCL temporary names, owner and mode set on descriptors.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import http.client
import json
import os
import re
import socket
import stat
import time
import urllib.error
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils import _net as net
from ansible_collections.ttfleet.inference.plugins.module_utils._s3 import (
    S3Client,
    S3Error,
    content_range_start,
    hide_userinfo,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    SafeFileError,
    copy_file,
    ensure_dir,
    free_bytes,
    human_bytes,
    kind_of,
    make_path,
    makedirs,
    nearest_existing,
    open_dir,
    open_file,
    open_nearest,
    open_path,
    open_relative,
    open_subdir,
    opened_dir,
    own_tree,
    read_json,
    remove_tree,
    rename,
    set_attrs,
    unlink,
    walk,
    write_json,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes import MANIFEST_NAME

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
    from email.message import Message
    from types import TracebackType
    from typing import Any, NoReturn, Optional, Protocol, TypeGuard, TypeVar

    # Decoded JSON and the dicts built like it: module options, file items, plans, manifests, digests, stats.
    JSON = dict[str, Any]
    # (uid, gid)
    Owner = tuple[int, int]
    # allow_patterns / ignore_patterns (fnmatch patterns; None for none).
    Patterns = Optional[Iterable[str]]  # noqa: UP045 - ansible-test pylint reads `|` here as an operation
    # What a manifest records for its source: repo_id and revision, or a path (see identity_of).
    Identity = Mapping[str, object]
    # callback(done_bytes, total_bytes, file) of a transfer.
    ProgressCallback = Callable[[int, int, str], object]
    _T = TypeVar("_T")

    class _Response(Protocol):
        """An open answer of a source: an http.client response, or a ``_ClosingResponse`` around one."""

        @property
        def headers(self) -> Message:
            ...

        def read(self, amount: int | None = ..., /) -> bytes:
            ...

        def __enter__(self) -> _Response:
            ...

        def __exit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
        ) -> object:
            ...


STAGING_NAME = ".ttfleet-staging"
STAGING_STATE = ".ttfleet-staging.json"
PART_SUFFIX = ".ttfleet-part"
TEMP_PREFIX = ".ttfleet-tmp-"
DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_SOURCES = ("hf", "s3", "peer")
DEFAULT_IGNORE_PATTERNS = ("original/**",)
MANIFEST_SCHEMA = 1
HASH_CHUNK = 8 << 20
# Weights are root's and read-only to the serving container: files 0644 (0755 with an execute bit), dirs 0755.
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
# Staging is root's scratch space: nobody else may add, swap or read partial files there.
STAGING_MODE = 0o700
ROOT_OWNER = (0, 0)
# The directories of a volume the serving container writes (kernel caches, logs, its symlink map, its HF home).
WRITABLE_SUBDIRS = ("tt_metal_cache", "logs", "model_file_symlinks_map", "huggingface")
# Path sources: top-level directories that are never model files.
_SKIPPED_TOP = (STAGING_NAME, ".cache", ".git")
STATUS_INTERVAL = 2.0
NET_ATTEMPTS = 3
_MANIFEST_MAX_BYTES = 64 << 20
# Network bounds (docs/security.md). The stall limit of every request is the module's ``timeout``.
# The overall limit of one small request: the revision, one page of the file list, a peer's manifest.
REQUEST_TOTAL = 300.0
# The overall limit of a whole listing, every page of the tree API included.
LISTING_TOTAL = 1800.0
# The floor of one file's overall limit, which grows by a second per MiB (_net.Deadline.for_size); each of the
# NET_ATTEMPTS attempts has its own.
TRANSFER_FLOOR = 300.0
# Pages of one file list (a Hub page holds up to 1000 entries; net.MAX_LISTED_FILES caps the entries).
MAX_LIST_PAGES = 10000
# JSON items (commas and opened objects or arrays) a reply may hold per file it can list: a Hub tree entry of an
# LFS file has about 10, a manifest entry 3. Counted in the raw bytes before json.loads builds anything.
JSON_ITEMS_PER_FILE = 16
MAX_JSON_ITEMS = JSON_ITEMS_PER_FILE * (net.MAX_LISTED_FILES + 1) + 1024
# A listed path: at most 4096 bytes, each component at most 255 (what Linux filesystems take).
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
USER_AGENT = "ttfleet.inference/model_weights"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
# Failures of one attempt at a file: retried (NET_ATTEMPTS in all), resuming what was verified.
_RETRYABLE = (
    net.NetError,
    urllib.error.URLError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    socket.timeout,
)


class WeightsError(Exception):
    """A request that cannot be carried out; the message says what, which input and how to fix it."""


# ---------------------------------------------------------------------------
# Paths


# ---------------------------------------------------------------------------
# Text


def scrub(text: object, *secret_values: str | None) -> str:
    """``text`` with every secret value (and URL user info) replaced by ``********``."""
    text = str(text)
    for value in secret_values:
        if value:
            text = text.replace(value, "********")
    return hide_userinfo(text)


def is_commit_sha(revision: object) -> TypeGuard[str]:
    return isinstance(revision, str) and bool(_SHA_RE.match(revision))


def check_revision(
    repo_id: str, revision: str | None, allow_floating: bool | None, endpoint: str = DEFAULT_ENDPOINT
) -> bool:
    """Refuse a branch, tag or short SHA unless ``allow_floating``; return True when it is a pinned commit."""
    if is_commit_sha(revision):
        return True
    if allow_floating:
        return False
    base = endpoint.rstrip("/")
    if not revision:
        raise WeightsError(
            f"no revision given for {repo_id}; pin a 40-character commit SHA "
            f"(see {base}/{repo_id}/commits/main) or set allow_floating_revision: true to follow main"
        )
    if re.match(r"^[0-9a-fA-F]{7,39}$", revision) or re.match(r"^[0-9A-F]{40}$", revision):
        kind = "an abbreviated or upper-case commit id"
    else:
        kind = "a branch or tag, not a commit"
    raise WeightsError(
        f"revision {revision!r} of {repo_id} is {kind}; pin a 40-character lower-case commit SHA "
        f"(see {base}/{repo_id}/commits/{urllib.parse.quote(revision, safe='')}) or set allow_floating_revision: true"
    )


def check_repo_id(repo_id: object) -> str:
    if not isinstance(repo_id, str) or not _REPO_RE.match(repo_id) or ".." in repo_id:
        raise WeightsError(f"repo_id {repo_id!r} is not a Hugging Face repository id; use the form org/name")
    return repo_id


def _path_bytes(path: str) -> list[int] | None:
    try:
        return [len(part.encode("utf-8")) for part in path.split("/")]
    except UnicodeError:
        return None


def check_relpath(path: Any, origin: str) -> str:
    """Refuse a file path from a source that could escape the destination, clash with our own files, not fit a
    filesystem, or show as something else on a terminal (control characters: ESC, newlines, bidi overrides)."""
    parts = path.split("/") if isinstance(path, str) else []
    lengths = _path_bytes(path) if parts else None
    if (
        not parts
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or net.printable(path, limit=len(path)) != path
        or lengths is None
        or sum(lengths) + len(lengths) - 1 > MAX_PATH_BYTES
        or max(lengths) > MAX_NAME_BYTES
        or any(part in ("", ".", "..") for part in parts)
        or parts[0] in (MANIFEST_NAME, STAGING_NAME)
        or path.endswith(PART_SUFFIX)
        or any(part.startswith(TEMP_PREFIX) for part in parts)
    ):
        text = path.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(path, str) else repr(path)
        shown = net.printable(text, 200)
        raise WeightsError(f"{origin} lists an unusable file path '{shown}'; refusing to write it")
    return path


# ---------------------------------------------------------------------------
# Patterns


def _normalize_patterns(patterns: Patterns) -> list[str]:
    # As huggingface_hub does: "dir/" means everything below dir.
    return [pattern + "*" if pattern.endswith("/") else pattern for pattern in (patterns or [])]


def filter_paths(
    paths: Iterable[str], allow_patterns: Patterns = None, ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS
) -> list[str]:
    """Keep paths matching any allow pattern (all when none) and no ignore pattern (fnmatch, ``*`` crosses ``/``)."""
    allow = _normalize_patterns(allow_patterns)
    ignore = _normalize_patterns(ignore_patterns)
    kept = []
    for path in paths:
        if allow and not any(fnmatch.fnmatchcase(path, pattern) for pattern in allow):
            continue
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in ignore):
            continue
        kept.append(path)
    return kept


# ---------------------------------------------------------------------------
# Hashing


def blob_header(size: int) -> bytes:
    """Prefix git hashes before the content: the tree API's ``oid`` of a non-LFS file is sha1 of both."""
    return b"blob %d\0" % size


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(blob_header(len(content)) + content, usedforsecurity=False).hexdigest()


class Digests:
    """sha256 of the content, plus the git blob sha1 when the size is known up front."""

    def __init__(self, blob_size: int | None = None) -> None:
        self.sha256 = hashlib.sha256()
        self.sha1 = None
        if blob_size is not None:
            self.sha1 = hashlib.sha1(blob_header(blob_size), usedforsecurity=False)

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.sha1 is not None:
            self.sha1.update(data)

    def result(self) -> JSON:
        return {"sha256": self.sha256.hexdigest(), "blob_sha1": self.sha1.hexdigest() if self.sha1 else None}


def hash_file(path: str, blob: bool = False) -> JSON:
    """Digests of the regular file ``path`` read in 8 MiB blocks; ``blob`` adds the git blob sha1.

    Opened without following a link and refused when it is not a regular file (a FIFO never blocks)."""
    fd, st = open_path(path)
    with os.fdopen(fd, "rb") as handle:
        size = st.st_size
        digests = Digests(size if blob else None)
        while True:
            block = handle.read(HASH_CHUNK)
            if not block:
                break
            digests.update(block)
    result = digests.result()
    result["size"] = size
    return result


def hash_files(requests: Mapping[tuple[str, str], tuple[str, bool]], workers: int) -> dict[tuple[str, str], JSON]:
    """Hash ``{key: (path, blob)}`` in parallel; returns ``{key: digests}`` (a file that cannot be read, or is
    no regular file, becomes ``{"error"}``).

    hashlib releases the GIL on large blocks, so threads use several cores.
    """

    def one(item: tuple[tuple[str, str], tuple[str, bool]]) -> tuple[tuple[str, str], JSON]:
        key, (path, blob) = item
        try:
            return key, hash_file(path, blob)
        except SafeFileError as exc:
            return key, {"error": str(exc)}
        except OSError as exc:
            return key, {"error": f"{path}: {exc.strerror or exc}"}

    if not requests:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(requests)))) as pool:
        return dict(pool.map(one, sorted(requests.items())))


# ---------------------------------------------------------------------------
# Hugging Face Hub protocol


def _json_items(body: bytes) -> int:
    """An upper bound on the values ``json.loads(body)`` builds, from the raw bytes: every value but the first of a
    container follows a comma, and every container opens with ``{`` or ``[``."""
    return body.count(b",") + body.count(b"{") + body.count(b"[") + 1


class Hub:
    """The three Hub endpoints a snapshot needs.

    The token is sent only once the repository needs it: requests go out anonymously first and a 401/403 from
    the configured endpoint's origin is retried once with ``Authorization: Bearer``, which is kept from then on.

    Every request goes through ``_net.open_url``: the token only ever reaches the origin (scheme, host, port)
    of ``hf_endpoint`` (never a CDN it redirects to, never another page origin, never over http after https),
    redirects go to http(s) only and at most five times, and each request has a deadline: ``timeout``
    seconds without a byte (stall) and an overall limit (``REQUEST_TOTAL`` for an answer, a file's growing with
    its size). Every JSON answer is capped (``_net.MAX_JSON_BYTES``) and a listing holds at most
    ``_net.MAX_LISTED_FILES`` entries.
    """

    def __init__(
        self, endpoint: str | None = DEFAULT_ENDPOINT, token: str | None = None, timeout: float | None = 60
    ) -> None:
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        if not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise WeightsError(
                f"hf_endpoint {scrub(self.endpoint)!r} is not an http(s) URL; use e.g. https://huggingface.co"
            )
        self.origin = net.origin(self.endpoint)
        self.token = token or None
        self.use_token = False
        self.timeout = float(timeout or net.DEFAULT_STALL)

    @property
    def name(self) -> str:
        """The source as messages name it."""
        return scrub(self.endpoint)

    def deadline(self, what: str, total: float | None = None) -> net.Deadline:
        """The limits of one request: ``timeout`` seconds without a byte, ``total`` (REQUEST_TOTAL) in all."""
        return net.Deadline(total=REQUEST_TOTAL if total is None else total, stall=self.timeout, what=what)

    def _open_url(self, url: str, deadline: net.Deadline, headers: dict[str, str]) -> _Response:
        credentials = {"Authorization": f"Bearer {self.token}"} if self.use_token else None
        return net.open_url(url, deadline, headers=headers, credentials=credentials, credential_origin=self.origin)

    def open(
        self,
        url: str,
        what: str,
        repo_id: str,
        headers: Mapping[str, str] | None = None,
        deadline: net.Deadline | None = None,
        size: int | None = None,
    ) -> _Response:
        """Open ``url`` within ``deadline``; HTTP errors become WeightsError naming ``what`` and the fix, a
        connection that fails, stalls, passes its deadline or breaks the protocol a ``_net.NetError``. ``size``
        (of the whole file) is for sources that need it. Never shows the token."""
        del size
        deadline = deadline or self.deadline(what)
        send = {"User-Agent": USER_AGENT, **(headers or {})}
        try:
            try:
                return self._open_url(url, deadline, send)
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403) and self.token and not self.use_token and net.origin(url) == self.origin:
                    exc.close()
                    self.use_token = True
                    return self._open_url(url, deadline, send)
                raise
        except urllib.error.HTTPError as exc:
            detail = exc.headers.get("X-Error-Message") if exc.headers else None
            exc.close()
            raise WeightsError(scrub(self._http_message(exc.code, detail, what, repo_id), self.token)) from None

    def _http_message(self, code: int, detail: str | None, what: str, repo_id: str) -> str:
        why = f" ({net.printable(detail, 300)})" if detail else ""
        if code in (401, 403):
            if self.token:
                fix = "check that hf_token has access to it (accept the licence on the model page for gated models)"
            else:
                fix = "set hf_token if it is gated or private, and check repo_id and revision"
            return (
                f"{self.name} refused {what} of {repo_id} with HTTP {code}{why}: the repository is gated, "
                f"private or does not exist; {fix}"
            )
        if code == 404:
            return f"{self.name} has no {what} of {repo_id} (HTTP 404{why}); check repo_id, revision and hf_endpoint"
        if 300 <= code < 400:
            return (
                f"{self.name} answered {what} of {repo_id} with a redirect that is not followed (HTTP {code}{why}): "
                f"to another scheme than http or https, more than {net.MAX_REDIRECTS} times, or in a loop; check "
                "hf_endpoint"
            )
        return f"{self.name} answered HTTP {code}{why} for {what} of {repo_id}; retry later or use another hf_endpoint"

    def _net_message(self, what: str, repo_id: str, exc: Exception) -> str:
        return (
            f"{self.name}: {what} of {repo_id} failed: {exc}; check hf_endpoint and the network, or retry later "
            "(timeout is the stall limit in seconds)"
        )

    def get_json(
        self, url: str, what: str, repo_id: str, deadline: net.Deadline | None = None, max_items: int | None = None
    ) -> tuple[Any, str]:
        """``(decoded JSON, Link header)`` of ``url``: at most ``_net.MAX_JSON_BYTES`` and ``max_items`` values
        (counted before decoding), within ``deadline``."""
        deadline = deadline or self.deadline(what)
        if max_items is None:
            max_items = MAX_JSON_ITEMS
        try:
            with self.open(url, what, repo_id, {"Accept": "application/json"}, deadline=deadline) as resp:
                body = net.read_capped(resp, net.MAX_JSON_BYTES, what, url, deadline)
                link = resp.headers.get("Link", "") if resp.headers is not None else ""
        except _RETRYABLE as exc:
            error = exc if isinstance(exc, net.NetError) else net.describe(exc, deadline, url)
            raise WeightsError(scrub(self._net_message(what, repo_id, error), self.token)) from None
        return self._loads(body, what, repo_id, max_items), link

    def _loads(self, body: bytes, what: str, repo_id: str, max_items: int) -> Any:
        if _json_items(body) > max_items:
            raise WeightsError(
                f"{self.name} sent {what} of {repo_id} holding more than {max_items} JSON values, more than a "
                f"listing of at most {net.MAX_LISTED_FILES} files needs; refused before decoding it"
            )
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise WeightsError(
                f"{self.name} sent {what} of {repo_id} that is not JSON (or nested too deep); is hf_endpoint a "
                "Hugging Face Hub?"
            ) from None

    def _repo_url(self, repo_id: str) -> str:
        return "/".join(urllib.parse.quote(part, safe="") for part in repo_id.split("/"))

    def resolve_revision(self, repo_id: str, revision: str) -> str:
        """The commit SHA a branch, tag or short SHA points at (revision API)."""
        url = f"{self.endpoint}/api/models/{self._repo_url(repo_id)}/revision/{urllib.parse.quote(revision, safe='')}"
        data, _link = self.get_json(url, f"revision {revision!r}", repo_id)
        sha = data.get("sha") if isinstance(data, dict) else None
        if not is_commit_sha(sha):
            raise WeightsError(f"{self.name} resolved revision {revision!r} of {repo_id} to no commit SHA")
        return sha

    def list_tree(self, repo_id: str, sha: str) -> list[JSON]:
        """Every file entry of the tree API at a commit, following ``Link: rel="next"`` pages on the endpoint's
        origin (a next page elsewhere is refused).

        The pages together hold at most ``_net.MAX_LISTED_FILES`` entries and take at most ``LISTING_TOTAL``
        seconds; each entry is kept with only the keys ``hf_files`` reads."""
        url = f"{self.endpoint}/api/models/{self._repo_url(repo_id)}/tree/{sha}?recursive=true&expand=false"
        what = f"the file list at {sha}"
        listing = self.deadline(what, LISTING_TOTAL)
        entries: list[JSON] = []
        count = 0
        for page in range(MAX_LIST_PAGES):
            if listing.remaining() <= 0:
                raise WeightsError(
                    f"{self.name} did not send {what} of {repo_id} within {LISTING_TOTAL:.0f} s ({count} entries in "
                    f"{page} pages); retry later or use another hf_endpoint"
                )
            left = net.MAX_LISTED_FILES - count
            deadline = self.deadline(what, min(REQUEST_TOTAL, listing.remaining()))
            data, link = self.get_json(url, what, repo_id, deadline, JSON_ITEMS_PER_FILE * (left + 1) + 64)
            if not isinstance(data, list):
                raise WeightsError(f"{self.name} sent a file list of {repo_id} that is not a list")
            count += len(data)
            if count > net.MAX_LISTED_FILES:
                raise WeightsError(
                    f"{self.name} lists more than {net.MAX_LISTED_FILES} entries for {repo_id}@{sha}; refused (a "
                    "model has hundreds of files)"
                )
            entries.extend(_tree_entry(entry) for entry in data if _is_file(entry))
            del data
            match = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link or "")
            if not match:
                return entries
            following = urllib.parse.urljoin(url, match.group(1).strip())
            if net.origin(following) != self.origin:
                raise WeightsError(
                    f"{self.name} sent the next page of {what} of {repo_id} at "
                    f"{net.printable(net.show_origin(following), 200)}, another origin; refused (a Hub pages on its "
                    "own origin)"
                )
            url = following
        raise WeightsError(f"{self.name} sent more than {MAX_LIST_PAGES} pages of files for {repo_id}")

    def file_url(self, repo_id: str, sha: str, path: str) -> str:
        return f"{self.endpoint}/{self._repo_url(repo_id)}/resolve/{sha}/{urllib.parse.quote(path, safe='/')}"


def _is_file(entry: object) -> bool:
    return isinstance(entry, dict) and entry.get("type") == "file"


def _tree_entry(entry: JSON) -> JSON:
    """The keys of a tree API file entry that ``hf_files`` reads (the rest is dropped as pages arrive)."""
    kept = {"type": "file", "path": entry.get("path"), "size": entry.get("size"), "oid": entry.get("oid")}
    lfs = entry.get("lfs")
    if isinstance(lfs, dict):
        kept["lfs"] = {"oid": lfs.get("oid"), "size": lfs.get("size")}
    return kept


def list_hf_source(
    hub: Hub,
    repo_id: str,
    revision: str | None,
    allow_floating: bool | None = False,
    allow_patterns: Patterns = None,
    ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS,
) -> tuple[str, list[JSON]]:
    """Resolve the revision and list the files to fetch: ``(sha, [file dicts])``.

    Each file has path, size, lfs, and the digest to check: ``sha256`` (LFS files, from ``lfs.oid``)
    or ``blob_sha1`` (the git blob id of files stored in git itself).
    """
    check_repo_id(repo_id)
    pinned = check_revision(repo_id, revision, allow_floating, hub.endpoint)
    # pinned: check_revision found revision to be a commit SHA.
    sha = cast(str, revision) if pinned else hub.resolve_revision(repo_id, revision or "main")
    return sha, hf_files(hub.list_tree(repo_id, sha), allow_patterns, ignore_patterns, hub.endpoint)


def hf_files(
    entries: Iterable[Any],
    allow_patterns: Patterns = None,
    ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS,
    origin: str = "the Hub",
) -> list[JSON]:
    """File dicts from tree API entries, filtered by the patterns."""
    by_path = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") != "file":
            continue
        path = check_relpath(entry.get("path"), origin)
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
        size = lfs.get("size") if lfs else entry.get("size")
        if not isinstance(size, int) or size < 0:
            raise WeightsError(f"{origin} lists {path} without a usable size")
        item = {"path": path, "size": size, "lfs": bool(lfs), "sha256": None, "blob_sha1": None}
        if lfs:
            oid = str(lfs.get("oid", "")).lower()
            if not _HEX64_RE.match(oid):
                raise WeightsError(f"{origin} lists LFS file {path} without a sha256 oid")
            item["sha256"] = oid
        else:
            oid = str(entry.get("oid", "")).lower()
            if not _SHA_RE.match(oid):
                raise WeightsError(f"{origin} lists {path} without a git blob id")
            item["blob_sha1"] = oid
        by_path[path] = item
    return [by_path[path] for path in filter_paths(sorted(by_path), allow_patterns, ignore_patterns)]


def list_path_source(
    root: str, allow_patterns: Patterns = None, ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS
) -> list[JSON]:
    """Regular files under a local or NFS directory, walked without following a link.

    A link or special file among the files kept by the patterns is refused: a user who can write the source
    could point it at a file only root may read, which would then be copied into the weights readable by all.
    Digests are left empty: they are computed only when a comparison needs them.
    """
    try:
        rootfd = open_dir(root)
    except (OSError, SafeFileError) as exc:
        why = exc.reason if isinstance(exc, SafeFileError) else (exc.strerror or exc)
        raise WeightsError(
            f"path {root} is not a directory ({why}); point path at a directory holding the model files"
        ) from None

    def unreadable(exc: Exception) -> NoReturn:
        raise WeightsError(f"cannot list {exc} in path {root}; run again, or fix the directory") from None

    found, refused = {}, {}
    try:
        for rel_dir, _fd, entries in walk(rootfd, root, onerror=unreadable):
            if rel_dir.split("/")[0] in _SKIPPED_TOP:
                continue
            for name, st in entries:
                if not rel_dir and name in _SKIPPED_TOP:
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if stat.S_ISDIR(st.st_mode):
                    continue
                if rel == MANIFEST_NAME or name.endswith(PART_SUFFIX) or name.startswith(TEMP_PREFIX):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    refused[rel] = kind_of(st.st_mode)
                    continue
                check_relpath(rel, f"path {root}")
                found[rel] = {
                    "path": rel,
                    "size": st.st_size,
                    "lfs": False,
                    "sha256": None,
                    "blob_sha1": None,
                    "src": os.path.join(root, rel),
                    "dev": st.st_dev,
                    "ino": st.st_ino,
                    "src_mode": st.st_mode,
                    "src_owner": (st.st_uid, st.st_gid),
                }
    except OSError as exc:
        raise WeightsError(f"cannot list path {root}: {exc.strerror or exc}") from None
    finally:
        os.close(rootfd)
    bad = filter_paths(sorted(refused), allow_patterns, ignore_patterns)
    if bad:
        raise WeightsError(
            f"path {root} holds {bad[0]}, a {refused[bad[0]]}"
            + (f" (and {len(bad) - 1} more links or special files)" if len(bad) > 1 else "")
            + ": model_weights reads only regular files from a path source and never follows a link. Replace it "
            "with the file itself, or leave it out with ignore_patterns"
        )
    return [found[path] for path in filter_paths(sorted(found), allow_patterns, ignore_patterns)]


# ---------------------------------------------------------------------------
# Sources that carry our own manifest: an S3 bucket and a peer host


def manifest_files(
    manifest: object,
    repo_id: str,
    revision: str,
    origin: str,
    allow_patterns: Patterns = None,
    ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS,
) -> list[JSON]:
    """File dicts (with the sha256 to check) from a manifest of ours that a bucket or a peer holds.

    The manifest must be for ``repo_id`` at ``revision`` and list a size and a sha256 for every file.
    """
    if (
        not isinstance(manifest, dict)
        or manifest.get("schema") != MANIFEST_SCHEMA
        or not isinstance(manifest.get("files"), dict)
    ):
        raise WeightsError(f"{origin} holds no usable {MANIFEST_NAME} (schema {MANIFEST_SCHEMA} with files)")
    got = (manifest.get("repo_id"), manifest.get("revision"))
    if got != (repo_id, revision):
        raise WeightsError(
            f"{origin} holds {net.printable(got[0], 200)}@{net.printable(got[1], 100)}, not {repo_id}@{revision}; "
            "point it at a copy of that revision"
        )
    if len(manifest["files"]) > net.MAX_LISTED_FILES:
        raise WeightsError(f"{origin} lists more than {net.MAX_LISTED_FILES} files in its manifest; refused")
    by_path = {}
    for path, entry in manifest["files"].items():
        check_relpath(path, origin)
        size = entry.get("size") if isinstance(entry, dict) else None
        digest = str(entry.get("sha256") or "") if isinstance(entry, dict) else ""
        if not isinstance(size, int) or size < 0 or not _HEX64_RE.match(digest):
            raise WeightsError(f"{origin} lists {path} in its manifest without a size and sha256")
        by_path[path] = {
            "path": path,
            "size": size,
            "lfs": False,
            "from_manifest": True,
            "sha256": digest,
            "blob_sha1": None,
        }
    return [by_path[path] for path in filter_paths(sorted(by_path), allow_patterns, ignore_patterns)]


def s3_prefix_of(prefix: str | None, repo_id: str, revision: str) -> str:
    """The key prefix of a model in a bucket: ``<prefix>/<repo_id>/<revision>/`` (no leading slash)."""
    parts = [part for part in (prefix or "").strip("/").split("/") if part]
    return "/".join(parts + repo_id.split("/") + [revision]) + "/"


class _ClosingResponse:
    """An http.client response that also closes its connection, shaped like what urllib returns."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    def read(self, amount: int | None = None) -> bytes:
        return self._resp.read(amount)

    def __enter__(self) -> _ClosingResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        self._resp.close()
        # Set by S3Client.open_object and PeerFiles.open on the response they return.
        self._resp.connection_to_close.close()  # type: ignore[attr-defined]


class S3Files:
    """The weights of one model in an S3 bucket, with the ``open``/``file_url`` interface ``fetch_hf`` uses.

    Keys are ``<prefix>/<repo_id>/<revision>/<file>``; ``<file>`` is the path in the ``--local-dir`` layout,
    and ``.ttfleet-manifest.json`` beside the files gives the size and sha256 of each one (upload a weights
    directory that this collection filled, manifest included, to publish a model).
    """

    def __init__(self, client: S3Client, bucket: str, prefix: str | None, repo_id: str, revision: str) -> None:
        self.client = client
        self.bucket = bucket
        self.base = s3_prefix_of(prefix, repo_id, revision)
        self.endpoint = f"{client.endpoint}/{bucket}/{self.base}"
        self.token: str | None = None
        self.timeout = client.timeout

    def file_url(self, _repo_id: str, _sha: str, path: str) -> str:
        return self.base + path

    @property
    def name(self) -> str:
        return self.endpoint

    def open(
        self,
        key: str,
        what: str,
        repo_id: str,
        headers: Mapping[str, str] | None = None,
        deadline: net.Deadline | None = None,
        size: int | None = None,
    ) -> _ClosingResponse:
        """GET ``key`` (of ``size`` bytes); the client bounds the transfer by its own deadline, sized by the
        object (``deadline`` is the caller's, checked as it reads)."""
        del deadline
        match = re.match(r"^bytes=(\d+)-$", (headers or {}).get("Range", ""))
        try:
            resp, _start = self.client.open_object(self.bucket, key, int(match.group(1)) if match else 0, size=size)
        except S3Error as exc:
            if exc.status is None or exc.status >= 500:
                raise ConnectionError(str(exc)) from None
            raise WeightsError(f"{exc} (reading {what} of {repo_id})") from None
        return _ClosingResponse(resp)

    def list(
        self,
        repo_id: str,
        revision: str,
        allow_patterns: Patterns = None,
        ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS,
    ) -> list[JSON]:
        origin = f"s3://{self.bucket}/{self.base} at {self.client.endpoint}"
        try:
            status, _headers, body = self.client.request(
                "GET", self.bucket, self.base + MANIFEST_NAME, expect=(200, 404), limit=net.MAX_JSON_BYTES
            )
            if status == 404:
                raise WeightsError(
                    f"{origin} has no {MANIFEST_NAME}; upload the whole weights directory of {repo_id}@{revision} "
                    f"(as this collection writes it, manifest included) under that prefix, or check "
                    "s3_bucket and s3_prefix"
                )
            if _json_items(body) > MAX_JSON_ITEMS:
                raise WeightsError(
                    f"{origin} holds a {MANIFEST_NAME} of more than {MAX_JSON_ITEMS} JSON values; refused"
                )
            try:
                manifest = json.loads(body)
            except (ValueError, RecursionError):
                raise WeightsError(f"{origin} holds a {MANIFEST_NAME} that is not JSON (or nested too deep)") from None
            files = manifest_files(manifest, repo_id, revision, origin, allow_patterns, ignore_patterns)
            present = {
                obj["key"][len(self.base) :]: obj["size"] for obj in self.client.list_objects(self.bucket, self.base)
            }
        except S3Error as exc:
            raise WeightsError(str(exc)) from None
        missing = [item["path"] for item in files if present.get(item["path"]) != item["size"]]
        if missing:
            raise WeightsError(
                f"{origin} lacks or holds a different size of {len(missing)} file(s) its manifest lists "
                f"({', '.join(missing[:5])}); upload them again"
            )
        return files


class PeerFiles(Hub):
    """The weights of a fleet host, served read-only by ``ttfleet.inference.weights_server`` at ``url``.

    The path of ``url`` holds the server's 128-bit token, so requests go to the peer's origin only: one
    connection per request (``_net.connection``, with the same deadlines as the Hub's), no redirect followed,
    and messages name the origin, never the token."""

    def __init__(self, url: str | None, timeout: float | None = 60) -> None:
        if not re.match(r"^https?://[^/\s]+/", url or ""):
            raise WeightsError(
                f"peer_url {scrub(net.printable(url, 200))!r} is not an http(s) URL ending in /; use the url "
                "weights_server returns"
            )
        url = cast(str, url)  # None was refused above
        super().__init__(url.rstrip("/"), None, timeout)
        self.base = url if url.endswith("/") else url + "/"

    @property
    def name(self) -> str:
        return f"peer {net.show_origin(self.base)}"

    def file_url(self, _repo_id: str, _sha: str, path: str) -> str:
        return self.base + urllib.parse.quote(path, safe="/")

    def open(
        self,
        url: str,
        what: str,
        repo_id: str,
        headers: Mapping[str, str] | None = None,
        deadline: net.Deadline | None = None,
        size: int | None = None,
    ) -> _ClosingResponse:
        """GET ``url`` on the peer's origin within ``deadline``; anything but 200 or 206 (a redirect included) is
        a WeightsError, a connection that fails, stalls, passes its deadline or breaks the protocol a NetError."""
        del size
        deadline = deadline or self.deadline(what)
        if net.origin(url) != self.origin:
            raise WeightsError(f"{self.name}: {what} of {repo_id} is not on the peer's origin; refused")
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = net.connection(*self.origin, deadline)
        try:
            conn.request("GET", target, headers={"User-Agent": USER_AGENT, **(headers or {})})
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError, ValueError) as exc:
            conn.close()
            raise net.describe(exc, deadline, url) from None
        if resp.status not in (200, 206):
            resp.close()
            conn.close()
            raise WeightsError(self._http_message(resp.status, None, what, repo_id))
        # An attribute of our own on the http.client response: _ClosingResponse closes the connection with it.
        resp.connection_to_close = conn  # type: ignore[attr-defined]
        return _ClosingResponse(resp)

    def _http_message(self, code: int, detail: str | None, what: str, repo_id: str) -> str:
        if 300 <= code < 400:
            return (
                f"{self.name} answered {what} of {repo_id} with a redirect (HTTP {code}); a weights_server never "
                "redirects and peer requests stay on the peer's origin: check peer_url"
            )
        return (
            f"{self.name} answered HTTP {code} for {what} of {repo_id}; the holder's server may have stopped "
            "or lack that file; run the role again (it restarts the server) or use another source"
        )

    def _net_message(self, what: str, repo_id: str, exc: Exception) -> str:
        return (
            f"cannot read {what} of {repo_id} from {self.name}: {exc}; check that the holder's weights_server runs "
            "and its port is open between the hosts"
        )

    def list(
        self,
        repo_id: str,
        revision: str,
        allow_patterns: Patterns = None,
        ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS,
    ) -> list[JSON]:
        manifest, _link = self.get_json(self.base + MANIFEST_NAME, "the manifest", repo_id)
        return manifest_files(manifest, repo_id, revision, self.name, allow_patterns, ignore_patterns)


# ---------------------------------------------------------------------------
# Manifest and staging state


def _read_manifest(dirfd: int | None, where: str) -> JSON | None:
    """The manifest in ``dirfd``, or None when it is absent or is no small regular file holding JSON (a link or
    FIFO planted in its place counts as absent: the files are then hashed and the manifest written anew)."""
    if dirfd is None:
        return None
    try:
        return read_json(dirfd, MANIFEST_NAME, _MANIFEST_MAX_BYTES, where=where)
    except SafeFileError:
        return None


def identity_of(
    source: str, repo_id: str | None = None, revision: str | None = None, path: str | None = None
) -> dict[str, str | None]:
    """What a manifest must record for its files to count as this source's files.

    A repository at a commit is the same bytes wherever they come from, so hf, s3 and peer share one
    identity (repository and revision): weights pulled from a peer or a bucket count as converged for the
    Hub source and the other way round. A path source is identified by its directory.
    """
    if source in COMMIT_SOURCES:
        return {"repo_id": repo_id, "revision": revision}
    return {"source": "path", "repo_id": repo_id, "path": path}


def manifest_matches(manifest: object, identity: Identity) -> bool:
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        return False
    if not isinstance(manifest.get("files"), dict):
        return False
    return all(manifest.get(key) == value for key, value in identity.items())


def build_manifest(
    identity: Identity,
    files: Iterable[JSON],
    endpoint: str | None = None,
    verified_at: str | None = None,
    source: str | None = None,
) -> JSON:
    data = dict(identity)
    data.setdefault("source", source)
    data.update(
        schema=MANIFEST_SCHEMA,
        endpoint=scrub(endpoint) if endpoint else None,
        files={item["path"]: {"size": item["size"], "sha256": item["sha256"]} for item in files},
        verified_at=verified_at,
    )
    return data


def _manifest_body(manifest: Mapping[str, Any] | None) -> JSON:
    # Where the files came from (hf, s3, a peer) is history, not state: the same repository and commit with
    # the same files is converged whichever source is named now.
    return {key: value for key, value in (manifest or {}).items() if key not in ("verified_at", "source", "endpoint")}


def write_manifest(dest: str, manifest: JSON, owner: Owner | None = None) -> str:
    """Replace the manifest of ``dest`` atomically (random temporary name, rename inside dest)."""
    with opened_dir(dest) as dirfd:
        write_json(dirfd, MANIFEST_NAME, manifest, FILE_MODE, owner, where=dest)
    return os.path.join(dest, MANIFEST_NAME)


def staging_dir(dest: str) -> str:
    """``<dest parent>/.ttfleet-staging/<dest name>``: same filesystem as dest, outside the mounted weights."""
    parent = os.path.dirname(os.path.normpath(dest))
    return os.path.join(parent, STAGING_NAME, os.path.basename(os.path.normpath(dest)))


def _ours(st: os.stat_result) -> bool:
    """Whether a directory is staging this process can trust: a real directory of its own user, mode 0700."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _open_staging_read(dest: str) -> int | None:
    """Descriptor of the staging directory of ``dest`` when it exists and is ours, else None (reads only)."""
    parent, name = os.path.split(dest)
    try:
        with opened_dir(parent) as pfd:
            top = open_subdir(pfd, STAGING_NAME)
    except (OSError, SafeFileError):
        return None
    try:
        if not _ours(os.fstat(top)):
            return None
        fd = open_subdir(top, name)
    except (OSError, SafeFileError):
        return None
    finally:
        os.close(top)
    if not _ours(os.fstat(fd)):
        os.close(fd)
        return None
    return fd


def _own_dir(parent_fd: int, name: str, where: str) -> int:
    """Descriptor of staging directory ``name`` in ``parent_fd``, ours and 0700. Whatever else holds the name
    (a link, a file, a directory of another user, as an older release left it chowned to the container) is
    removed first, without following a link: it is scratch space that nothing may be trusted from."""
    with contextlib.suppress(FileNotFoundError):
        if not _ours(os.lstat(name, dir_fd=parent_fd)):
            remove_tree(parent_fd, name)
    fd = ensure_dir(parent_fd, name, STAGING_MODE, None, where)[0]
    if not _ours(os.fstat(fd)):
        os.close(fd)
        raise WeightsError(f"{os.path.join(where, name)} was replaced while it was prepared; run again")
    return fd


def _read_staging_state(staging_fd: int | None, identity: Identity) -> JSON | None:
    """Files a previous run finished in staging, or None when staging is absent or was for another source."""
    if staging_fd is None:
        return None
    try:
        state = read_json(staging_fd, STAGING_STATE, _MANIFEST_MAX_BYTES)
    except SafeFileError:
        return None
    if not isinstance(state, dict) or state.get("identity") != identity or not isinstance(state.get("files"), dict):
        return None
    return state["files"]


def _open_staging(plan: JSON) -> tuple[int, JSON]:
    """``(descriptor, staged files)`` of staging ready for this source: kept when its state matches (resume),
    else cleared and started anew. The parent of dest must exist."""
    parent, name = os.path.split(plan["dest"])
    with opened_dir(parent) as pfd:
        top = _own_dir(pfd, STAGING_NAME, parent)
    try:
        if plan["staged"] is None:
            remove_tree(top, name)
        fd = _own_dir(top, name, os.path.join(parent, STAGING_NAME))
    finally:
        os.close(top)
    if plan["staged"] is None:
        try:
            write_json(fd, STAGING_STATE, {"identity": plan["identity"], "files": {}}, 0o600)
        except BaseException:
            os.close(fd)
            raise
        return fd, {}
    return fd, dict(plan["staged"])


def _expected_key(item: JSON) -> str:
    """What a staged file was checked against; it stays valid while the source lists the same digest."""
    if item.get("blob_sha1"):
        return f"blob:{item['blob_sha1']}"
    if item.get("lfs") or item.get("from_manifest"):
        return f"sha256:{item['sha256']}"
    return f"size:{item['size']}"


def _split(rel: str) -> tuple[str, str]:
    reldir, _sep, leaf = rel.rpartition("/")
    return reldir, leaf


def _size_at(dirfd: int | None, name: str) -> int | None:
    """Size of regular file ``name`` in ``dirfd``; None when absent or not a regular file."""
    if dirfd is None:
        return None
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _staged_size(staging_fd: int | None, rel: str, suffix: str = "") -> int | None:
    """Size of the staged file (or part, with ``suffix``) of ``rel``; None when there is none."""
    if staging_fd is None:
        return None
    reldir, leaf = _split(rel)
    try:
        fd = open_relative(staging_fd, reldir)
    except (OSError, SafeFileError):
        return None
    try:
        return _size_at(fd, leaf + suffix)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# Planning


def _open_existing(path: str) -> int | None:
    """Descriptor of directory ``path``, None when it does not exist; a link a non-root user could have planted
    on the way (``weights/<model>`` swapped for a link to a root-only directory) is refused, never followed."""
    try:
        return open_dir(path)
    except FileNotFoundError:
        return None
    except SafeFileError as exc:
        raise WeightsError(f"{exc}; move it away and run again") from None


def _dest_state(dest_fd: int | None, dest: str, rel: str) -> tuple[os.stat_result | None, str]:
    """``(lstat, kind)`` of ``rel`` below ``dest_fd``: missing, directory, not_regular or file. A link or a
    file in place of a directory between dest and the file is refused: writes must stay inside dest."""
    if dest_fd is None:
        return None, "missing"
    reldir, leaf = _split(rel)
    try:
        fd = open_relative(dest_fd, reldir, where=dest)
    except FileNotFoundError:
        return None, "missing"
    except SafeFileError as exc:
        raise WeightsError(
            f"{exc.path} is a symlink or file where the model needs a directory; move it away and run again"
        ) from None
    try:
        st = os.lstat(leaf, dir_fd=fd)
    except FileNotFoundError:
        return None, "missing"
    finally:
        os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        return st, "directory"
    if not stat.S_ISREG(st.st_mode):
        return st, "not_regular"
    return st, "file"


def wanted_mode(mode: int) -> int:
    """The mode a weights file gets: 0755 when it has an execute bit, else 0644 (directories 0755)."""
    if stat.S_ISDIR(mode):
        return DIR_MODE
    return EXEC_MODE if mode & 0o111 else FILE_MODE


def _attrs_ok(st: os.stat_result, owner: Owner | None) -> bool:
    if stat.S_IMODE(st.st_mode) != wanted_mode(st.st_mode):
        return False
    return owner is None or (st.st_uid, st.st_gid) == tuple(owner)


def _scan_dest(
    dest_fd: int | None, dest: str, wanted: Container[str], owner: Owner | None, limit: int = 50
) -> tuple[list[str], list[str], list[str]]:
    """One walk of dest (no link followed): ``(extra, reown, skipped)``. ``extra``: files that are not part of
    the source (at most ``limit``); ``reown``: directories and files whose owner or mode differ from the
    layout (``.`` is dest itself); ``skipped``: links and special files, which the layout leaves alone."""
    extra: list[str] = []
    reown: list[str] = []
    skipped: list[str] = []
    if dest_fd is None:
        return extra, reown, skipped
    if not _attrs_ok(os.fstat(dest_fd), owner):
        reown.append(".")
    for rel_dir, _fd, entries in walk(dest_fd, dest):
        for name, st in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                if not _attrs_ok(st, owner):
                    reown.append(rel)
            else:
                skipped.append(rel)
            if not stat.S_ISDIR(st.st_mode) and rel != MANIFEST_NAME and rel not in wanted and len(extra) < limit:
                extra.append(rel)
    return extra, reown, skipped


def plan_weights(
    files: Iterable[JSON],
    dest: str,
    identity: Identity,
    verify: str = "auto",
    workers: int = 4,
    owner: Owner | None = None,
    endpoint: str | None = None,
) -> JSON:
    """Compare the source's files with ``dest`` and its manifest; reads, never writes.

    ``verify``: ``sha256`` hashes every file already in dest, ``size`` trusts a manifest entry with the
    same size (and sha256 for LFS files), ``auto`` is size when the manifest matches the source and
    sha256 otherwise. A file the manifest does not cover is hashed in every mode. Returns a plan dict:
    files (with sha256 filled in where known), to_fetch, missing, wrong_size, corrupt, not_regular,
    extra, attrs (directories and files whose owner or mode need fixing), skipped (links and special files
    left in dest), bytes, staged state and the mode used.
    """
    dest = os.path.normpath(dest)
    dest_fd = _open_existing(dest)
    staging_fd = None
    try:
        manifest = _read_manifest(dest_fd, dest)
        matches = manifest_matches(manifest, identity)
        mode = verify if verify != "auto" else ("size" if matches else "sha256")
        # matches: manifest_matches found a manifest dict with files.
        recorded = cast("JSON", manifest)["files"] if matches else {}
        files = [dict(item) for item in files]
        plan: JSON = {
            "dest": dest,
            "identity": identity,
            "endpoint": endpoint,
            "verified": mode,
            "files": files,
            "manifest": manifest,
            "manifest_matches": matches,
            "to_fetch": [],
            "missing": [],
            "wrong_size": [],
            "corrupt": [],
            "not_regular": [],
            "attrs": [],
            "hashed": [],
        }
        to_hash = {}
        for item in files:
            rel = item["path"]
            st, kind = _dest_state(dest_fd, dest, rel)
            item["dest_ino"] = None
            if kind == "missing":
                plan["missing"].append(rel)
                continue
            if kind == "directory":
                raise WeightsError(f"{os.path.join(dest, rel)} is a directory where the model has a file; move it away")
            if kind == "not_regular":
                plan["not_regular"].append(rel)
                continue
            st = cast("os.stat_result", st)  # only a missing file comes without its lstat
            if st.st_size != item["size"]:
                plan["wrong_size"].append(rel)
                continue
            item["dest_ino"] = (st.st_dev, st.st_ino)
            if "src" in item and (item["dev"], item["ino"]) == (st.st_dev, st.st_ino):
                item["linked"] = True
            entry = recorded.get(rel)
            trusted = (
                mode == "size"
                and isinstance(entry, dict)
                and entry.get("size") == item["size"]
                and isinstance(entry.get("sha256"), str)
                and (item["sha256"] is None or entry["sha256"] == item["sha256"])
            )
            if trusted:
                item["sha256"] = cast("JSON", entry)["sha256"]  # trusted: entry is a dict
                continue
            if item.get("linked"):
                # Same inode as the source: identical by construction, one hash gives the manifest its digest.
                to_hash[("dest", rel)] = (os.path.join(dest, rel), False)
                continue
            to_hash[("dest", rel)] = (os.path.join(dest, rel), item["blob_sha1"] is not None)
            if "src" in item:
                to_hash[("src", rel)] = (item["src"], False)

        digests = hash_files(to_hash, workers)
        for item in files:
            rel = item["path"]
            got = digests.get(("dest", rel))
            if got is None:
                continue
            plan["hashed"].append(rel)
            if "error" in got:
                raise WeightsError(f"cannot read {got['error']}; fix its permissions or remove it")
            if item.get("linked"):
                ok = True
            elif "src" in item:
                src = digests[("src", rel)]
                if "error" in src:
                    raise WeightsError(f"cannot read source file {src['error']}")
                ok = got["sha256"] == src["sha256"]
            elif item["sha256"] is not None:
                ok = got["sha256"] == item["sha256"]
            else:
                ok = got["blob_sha1"] == item["blob_sha1"]
            if ok:
                item["sha256"] = got["sha256"]
            else:
                plan["corrupt"].append(rel)

        bad = set(plan["missing"]) | set(plan["wrong_size"]) | set(plan["corrupt"]) | set(plan["not_regular"])
        plan["to_fetch"] = [item["path"] for item in files if item["path"] in bad]
        by_path = {item["path"]: item for item in files}
        extra, reown, skipped = _scan_dest(dest_fd, dest, set(by_path), owner)
        plan["attrs"] = [rel for rel in reown if rel not in bad]
        plan["skipped"] = [rel for rel in skipped if rel not in bad]
        staging = staging_dir(dest)
        staging_fd = _open_staging_read(dest)
        staged = _read_staging_state(staging_fd, identity)
        bytes_to_fetch = bytes_on_disk = bytes_staged = 0
        for rel in plan["to_fetch"]:
            item = by_path[rel]
            done = (staged or {}).get(rel)
            if (
                isinstance(done, dict)
                and done.get("expected") == _expected_key(item)
                and _staged_size(staging_fd, rel) == item["size"]
            ):
                bytes_staged += item["size"]
                continue
            partial = min(_staged_size(staging_fd, rel, PART_SUFFIX) or 0, item["size"]) if staged is not None else 0
            bytes_staged += partial
            if "src" in item and _linkable(item, owner) and _same_filesystem(item, staging):
                continue
            bytes_to_fetch += item["size"] - partial
            bytes_on_disk += item["size"] - partial
    finally:
        for fd in (dest_fd, staging_fd):
            if fd is not None:
                os.close(fd)
    plan.update(
        staging=staging,
        staged=staged,
        extra=extra,
        files_total=len(files),
        bytes_total=sum(item["size"] for item in files),
        bytes_to_fetch=bytes_to_fetch,
        bytes_needed=bytes_on_disk,
        bytes_staged=bytes_staged,
        complete=not plan["to_fetch"],
    )
    return plan


def _device_near(path: str) -> int | None:
    """Device of ``path`` or of its nearest existing parent, opened without following a planted link."""
    try:
        fd = open_nearest(path)[0]
    except (OSError, SafeFileError):
        return None
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def _linkable(item: JSON, owner: Owner | None) -> bool:
    """Whether a path-source file may be shared by a hardlink: it must already be what the weights need (the
    owner and mode of the layout, so nothing has to change on an inode that the source shares). Any other
    file is copied, and the copy never takes the source's owner or mode."""
    mode = item["src_mode"]
    return stat.S_IMODE(mode) == wanted_mode(mode) and (owner is None or tuple(item["src_owner"]) == tuple(owner))


def _same_filesystem(item: JSON, staging: str) -> bool:
    """Whether a path-source file is on the filesystem of staging (so it can be hardlinked there)."""
    return _device_near(staging) == item["dev"]


def check_disk(dest: str, needed: int, margin_bytes: int, host: str, what: str) -> int | None:
    """Fail before anything is written when the filesystem of ``dest`` cannot take ``needed`` + margin."""
    if needed <= 0:
        return None
    where = nearest_existing(dest)
    free = free_bytes(where)
    if free < needed + margin_bytes:
        raise WeightsError(
            f"{host}: not enough free space for {what} in {dest}: the filesystem of {where} needs "
            f"{human_bytes(needed + margin_bytes)} ({human_bytes(needed)} still to fetch + "
            f"{human_bytes(margin_bytes)} margin, {needed + margin_bytes} bytes) and has {human_bytes(free)} free "
            f"({free} bytes). Free space there, lower disk_margin_gb, or put the volume on a bigger filesystem"
        )
    return free


# ---------------------------------------------------------------------------
# Progress


class Progress:
    """Counts bytes moved and reports them: ``callback(done, total, file)`` on every block, and a JSON
    status file (``done_bytes``, ``total_bytes``, ``rate``, ``eta``, ``file``) rewritten atomically at
    most every ``interval`` seconds."""

    def __init__(
        self,
        total: int,
        status_file: str | None = None,
        callback: ProgressCallback | None = None,
        interval: float = STATUS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self.file: str | None = None
        self.status_file = status_file
        self.callback = callback
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.written: float | None = None

    def advance(self, count: int, file: str) -> None:
        self.done += count
        self.file = file
        if self.callback is not None:
            self.callback(self.done, self.total, file)
        now = self.clock()
        if self.status_file and (self.written is None or now - self.written >= self.interval):
            self.write(now)

    def snapshot(self, now: float | None = None, state: str = "running") -> JSON:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        remaining = max(self.total - self.done, 0)
        return {
            "state": state,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "rate": round(rate, 1),
            "eta": round(remaining / rate, 1) if rate > 0 else None,
            "file": self.file,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def write(self, now: float | None = None, state: str = "running") -> None:
        if not self.status_file:
            return
        self.written = self.clock() if now is None else now
        directory, name = os.path.split(os.path.abspath(self.status_file))
        # Progress is advisory: a status file that cannot be written never stops a transfer.
        with contextlib.suppress(OSError, SafeFileError), opened_dir(directory) as dirfd:
            write_json(dirfd, name, self.snapshot(now, state), where=directory)


# ---------------------------------------------------------------------------
# Fetching into staging


def _record_staged(staging_fd: int, identity: Identity, staged: JSON, rel: str, item: JSON) -> None:
    staged[rel] = {"expected": _expected_key(item), "sha256": item["sha256"], "size": item["size"]}
    write_json(staging_fd, STAGING_STATE, {"identity": identity, "files": staged}, 0o600)


def _unstaged(plan: JSON, staged: JSON, staging_fd: int) -> Iterator[tuple[str, JSON, int, str]]:
    """``(path, item, directory descriptor, file name)`` of every file still to fetch, the descriptor being its
    directory in staging (the caller closes it); files already complete in staging are skipped."""
    by_path = {item["path"]: item for item in plan["files"]}
    for rel in plan["to_fetch"]:
        item = by_path[rel]
        done = staged.get(rel)
        if (
            isinstance(done, dict)
            and done.get("expected") == _expected_key(item)
            and _staged_size(staging_fd, rel) == item["size"]
        ):
            item["sha256"] = done["sha256"]
            continue
        reldir, leaf = _split(rel)
        yield rel, item, makedirs(staging_fd, reldir, STAGING_MODE, where=plan["staging"]), leaf


def _open_part(dirfd: int, name: str) -> int:
    """Descriptor of partial file ``name`` for reading and writing: the one in staging when it is a regular
    file, else a new empty one (O_EXCL, 0600) after whatever held the name is removed."""
    try:
        return open_file(dirfd, name, os.O_RDWR)[0]
    except FileNotFoundError:
        pass
    except SafeFileError:
        unlink(dirfd, name)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, 0o600, dir_fd=dirfd)


def _name_of(source: Hub | S3Files) -> str:
    """A source (Hub, peer, bucket) as messages name it."""
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else scrub(source.endpoint)


def fetch_hf(hub: Hub | S3Files, repo_id: str, sha: str, plan: JSON, progress: Progress) -> JSON:
    """Download every file of ``plan["to_fetch"]`` into staging, resuming ``.ttfleet-part`` files.

    A server that answers a ``Range`` request with 200 (olah does) makes that file start over, counted
    in ``restarts``. Each file is hashed while it streams and must match the digest of the tree API;
    only then is it renamed to its final name in staging and recorded in the staging state.
    Returns ``{"fetched_bytes", "restarts", "files"}``.
    """
    staging_fd, staged = _open_staging(plan)
    stats: JSON = {"fetched_bytes": 0, "restarts": 0, "files": []}
    try:
        for rel, item, dirfd, leaf in _unstaged(plan, staged, staging_fd):
            try:
                part = leaf + PART_SUFFIX
                got = _download(hub, repo_id, sha, item, dirfd, part, progress, stats)
                key = "blob_sha1" if item.get("blob_sha1") else "sha256"
                if got[key] != item[key]:
                    unlink(dirfd, part)
                    expected = item["sha256"] or f"git blob {item['blob_sha1']}"
                    actual = got["sha256"] if key == "sha256" else f"git blob {got['blob_sha1']}"
                    raise WeightsError(
                        f"{_name_of(hub)} sent {net.printable(rel)} of {repo_id}@{sha} with the wrong content "
                        f"(expected {expected}, got {actual}); the partial file was removed, run again or use another "
                        "source"
                    )
                item["sha256"] = got["sha256"]
                rename(dirfd, part, leaf)
            finally:
                os.close(dirfd)
            stats["files"].append(rel)
            _record_staged(staging_fd, plan["identity"], staged, rel, item)
    finally:
        os.close(staging_fd)
    return stats


def _hash_prefix(dirfd: int, name: str, count: int, digests: Digests) -> None:
    """Feed the first ``count`` bytes of the partial file to ``digests``."""
    fd = open_file(dirfd, name)[0]
    with os.fdopen(fd, "rb") as handle:
        while count:
            block = handle.read(min(HASH_CHUNK, count))
            if not block:
                break
            digests.update(block)
            count -= len(block)


class _Counted:
    """A response body whose bytes are counted: did the origin send more than the listing gives?"""

    def __init__(self, resp: _Response) -> None:
        self.resp = resp
        self.headers = resp.headers
        self.count = 0

    def read(self, amount: int | None = None) -> bytes:
        data = self.resp.read(amount)
        self.count += len(data)
        return data


def _download(
    hub: Hub | S3Files,
    repo_id: str,
    sha: str,
    item: JSON,
    dirfd: int,
    part: str,
    progress: Progress,
    stats: JSON,
) -> JSON:
    """Fetch one file into its partial file in staging, resuming it; returns the digests of the whole file.

    Each attempt is bounded: it writes at most the bytes the listing gives (``_net.copy_capped``), within a
    deadline (``timeout`` seconds without a byte, and ``TRANSFER_FLOOR`` plus a second per MiB overall). A body
    longer than the listing gives (declared or sent) fails at once, with the partial file removed: nothing beyond
    the listed size is ever written. Any other failed attempt (refused, reset, stalled, too slow, cut short, not
    HTTP) is retried from what the partial file holds, NET_ATTEMPTS times in all."""
    rel, size = item["path"], item["size"]
    url = hub.file_url(repo_id, sha, rel)
    where, shown = _name_of(hub), net.printable(rel)
    failure: Exception | str | None = None
    for _attempt in range(NET_ATTEMPTS):
        offset = _size_at(dirfd, part) or 0
        if offset > size:
            offset = 0
        digests = Digests(size if item.get("blob_sha1") else None)
        if offset:
            _hash_prefix(dirfd, part, offset, digests)
        if offset == size:
            if not size:
                os.close(_open_part(dirfd, part))
            return digests.result()
        deadline = net.Deadline.for_size(
            size - offset,
            stall=getattr(hub, "timeout", None) or net.DEFAULT_STALL,
            what=f"the transfer of {shown}",
            floor=TRANSFER_FLOOR,
        )
        state: JSON = {"digests": digests, "offset": offset, "deadline": deadline, "declared": None}
        state.update(written=0, expected=size - offset, sent=0)
        try:
            _attempt_download(hub, url, (rel, repo_id, sha, size), state, dirfd, part, progress, stats)
        except _RETRYABLE as exc:
            if state["sent"] <= state["expected"]:
                if state["written"] == state["expected"]:
                    # Every listed byte arrived, then the connection broke: the digest (checked by the caller)
                    # decides.
                    return state["digests"].result()
                failure = exc if isinstance(exc, net.NetError) else net.describe(exc, deadline, url)
                continue
        declared = state["declared"]
        if state["sent"] > state["expected"] or (declared is not None and declared > state["expected"]):
            unlink(dirfd, part)
            sent = "sent more" if declared is None or declared <= state["expected"] else f"declared {declared} bytes"
            raise WeightsError(
                f"{where} {sent} for {shown} of {repo_id}@{sha} where {state['expected']} were expected (the "
                f"listing gives {size}); nothing beyond that was written and the partial file was removed: the "
                "source serves another file than it lists. Use another source"
            )
        got = _size_at(dirfd, part)
        if got == size:
            return state["digests"].result()
        failure = f"{where} sent {got} bytes of {shown} where the listing gives {size}"
    raise WeightsError(
        scrub(
            f"downloading {shown} of {repo_id} from {where} failed {NET_ATTEMPTS} times: {failure}; run again to "
            "resume, or use another source",
            hub.token,
        )
    )


def _attempt_download(
    hub: Hub | S3Files,
    url: str,
    file: tuple[str, str, str, int],
    state: JSON,
    dirfd: int,
    part: str,
    progress: Progress,
    stats: JSON,
) -> None:
    """One attempt of ``_download``. ``state`` holds the digests (new ones when the source starts over), the
    offset, and the bytes written, expected, sent and declared: the caller reads them, also when this fails."""
    rel, repo_id, sha, size = file
    offset = state["offset"]
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    what = f"file {net.printable(rel)} at {sha}"
    with hub.open(url, what, repo_id, headers, deadline=state["deadline"], size=size) as resp:
        status = getattr(resp, "status", 200)
        start = content_range_start(resp.headers.get("Content-Range")) if status == 206 else None
        if offset and (status != 206 or start != offset):
            stats["restarts"] += 1
            progress.advance(-offset, rel)
            offset = 0
            state["digests"] = Digests(size if state["digests"].sha1 is not None else None)
            state["expected"] = size
        state["declared"] = net.content_length(resp)
        if state["declared"] is not None and state["declared"] > state["expected"]:
            return
        body = _Counted(resp)
        digests = state["digests"]
        with os.fdopen(_open_part(dirfd, part), "r+b") as handle:
            handle.seek(offset)
            handle.truncate()

            def write(block: bytes) -> None:
                handle.write(block)
                digests.update(block)
                state["written"] += len(block)
                stats["fetched_bytes"] += len(block)
                progress.advance(len(block), rel)

            try:
                net.copy_capped(body, write, state["expected"], f"file {net.printable(rel)}", url, state["deadline"])
            finally:
                state["sent"] = body.count
                handle.flush()
                os.fsync(handle.fileno())


def _source_error(item: JSON, exc: OSError | SafeFileError) -> WeightsError:
    why = exc.reason if isinstance(exc, SafeFileError) else (exc.strerror or exc)
    return WeightsError(
        f"cannot take {item['src']} from the path source: {why}. model_weights reads only regular files there and "
        "never follows a link; replace it with the file itself and run again"
    )


def _stage_from_path(item: JSON, dirfd: int, leaf: str, link: bool, owner: Owner | None) -> None:
    """Hardlink (``link``) or copy one path-source file into staging, relative to directory descriptors; the
    source must be a regular file (a link or special file put there since the listing is refused)."""
    src_dir, src_name = os.path.split(item["src"])
    for leftover in (leaf, leaf + PART_SUFFIX):
        unlink(dirfd, leftover)
    try:
        with opened_dir(src_dir) as sfd:
            if not link:
                # Root's own 0600 copy: the source's owner and mode never reach the weights.
                copy_file(sfd, src_name, dirfd, leaf + PART_SUFFIX, mode=0o600)
                return
            os.link(src_name, leaf, src_dir_fd=sfd, dst_dir_fd=dirfd, follow_symlinks=False)
    except (OSError, SafeFileError) as exc:
        raise _source_error(item, exc) from None
    st = os.lstat(leaf, dir_fd=dirfd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (item["dev"], item["ino"]) or not _attrs_ok(st, owner):
        unlink(dirfd, leaf)
        raise WeightsError(f"{item['src']} changed while linking it into staging; run again")


def fetch_path(plan: JSON, progress: Progress, workers: int, owner: Owner | None = None) -> JSON:
    """Hardlink (same filesystem, when the file already has the owner and mode of the layout) or copy the
    files of ``plan["to_fetch"]`` into staging.

    Copies are hashed against their source afterwards; links are checked to share the source's inode.
    """
    staging = plan["staging"]
    staging_fd, staged = _open_staging(plan)
    by_path = {item["path"]: item for item in plan["files"]}
    stats: JSON = {"fetched_bytes": 0, "restarts": 0, "files": [], "linked": [], "copied": []}
    try:
        for rel, item, dirfd, leaf in _unstaged(plan, staged, staging_fd):
            try:
                link = _linkable(item, owner) and _same_filesystem(item, staging)
                _stage_from_path(item, dirfd, leaf, link, owner)
            finally:
                os.close(dirfd)
            if link:
                item["linked"] = True
                stats["linked"].append(rel)
            else:
                stats["copied"].append(rel)
                stats["fetched_bytes"] += item["size"]
                progress.advance(item["size"], rel)
        requests = {}
        for rel in stats["copied"]:
            requests[("copy", rel)] = (os.path.join(staging, rel + PART_SUFFIX), False)
            requests[("src", rel)] = (by_path[rel]["src"], False)
        for rel in stats["linked"]:
            requests[("copy", rel)] = (os.path.join(staging, rel), False)
        digests = hash_files(requests, workers)
        for rel in stats["linked"] + stats["copied"]:
            got = digests[("copy", rel)]
            if "error" in got:
                raise WeightsError(f"cannot read {got['error']}")
            if rel in stats["copied"]:
                reldir, leaf = _split(rel)
                dirfd = open_relative(staging_fd, reldir)
                try:
                    src = digests[("src", rel)]
                    if "error" in src or src["sha256"] != got["sha256"] or got["size"] != by_path[rel]["size"]:
                        unlink(dirfd, leaf + PART_SUFFIX)
                        raise WeightsError(
                            f"the copy of {by_path[rel]['src']} differs from its source (changed while copying, or a "
                            "failing disk); run again"
                        )
                    rename(dirfd, leaf + PART_SUFFIX, leaf)
                finally:
                    os.close(dirfd)
            by_path[rel]["sha256"] = got["sha256"]
            stats["files"].append(rel)
            _record_staged(staging_fd, plan["identity"], staged, rel, by_path[rel])
    finally:
        os.close(staging_fd)
    return stats


# ---------------------------------------------------------------------------
# Placement and ownership


def place_files(plan: JSON, owner: Owner | None = None) -> None:
    """Move staged files into dest by renames between directory descriptors (dest created when missing),
    then clear staging.

    Only the planned paths are touched; a link at a planned path is replaced, never followed, and a link in
    place of a directory on the way is refused. Files hardlinked from a path source already have the owner and
    mode of the layout; every other file gets them on its descriptor before the rename.
    """
    dest = plan["dest"]
    parent, name = os.path.split(dest)
    by_path = {item["path"]: item for item in plan["files"]}
    try:
        pfd = make_path(parent, owner=owner)
        try:
            dest_fd = ensure_dir(pfd, name, DIR_MODE, owner, where=parent)[0]
            staging_fd = open_relative(pfd, f"{STAGING_NAME}/{name}", where=parent)
        finally:
            os.close(pfd)
    except SafeFileError as exc:
        raise WeightsError(f"{exc}; move it away and run again") from None
    try:
        for rel in plan["to_fetch"]:
            reldir, leaf = _split(rel)
            try:
                dfd = makedirs(dest_fd, reldir, DIR_MODE, owner, where=dest)
            except SafeFileError as exc:
                raise WeightsError(
                    f"{exc.path} is a symlink or file where the model needs a directory; move it away and run again"
                ) from None
            sfd = open_relative(staging_fd, reldir)
            try:
                if not by_path[rel].get("linked"):
                    ffd, st = open_file(sfd, leaf)
                    try:
                        set_attrs(ffd, EXEC_MODE if by_path[rel].get("src_mode", 0) & 0o111 else FILE_MODE, owner, st)
                    finally:
                        os.close(ffd)
                try:
                    rename(sfd, leaf, leaf, dst_dirfd=dfd)
                except SafeFileError as exc:
                    raise WeightsError(f"{dest}/{rel}: {exc.reason}") from None
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        os.close(dest_fd)
        os.close(staging_fd)
    clear_staging(plan["staging"])


def clear_staging(staging: str) -> None:
    """Remove this destination's staging directory (when it is ours) and ``.ttfleet-staging`` when it is left
    empty; nothing is followed on the way."""
    top, name = os.path.split(staging)
    weights, _top_name = os.path.split(top)
    try:
        with opened_dir(weights) as wfd:
            sfd = open_subdir(wfd, STAGING_NAME)
            try:
                if _ours(os.fstat(sfd)):
                    remove_tree(sfd, name)
            finally:
                os.close(sfd)
            with contextlib.suppress(OSError):
                os.rmdir(STAGING_NAME, dir_fd=wfd)
    except (OSError, SafeFileError):
        return


def _layout_volume(dest: str, container: Owner | None) -> str | None:
    """The volume of ``dest`` (``<volume>/weights/<model>``) to lay out, or None when no container owner is given."""
    return None if container is None else os.path.dirname(os.path.dirname(dest))


def plan_layout(dest: str, owner: Owner, container: Owner | None) -> list[str]:
    """What the volume around ``dest`` lacks, as text: the volume and ``weights`` directories not owned by
    ``owner`` with mode 0755, and the directories the container writes missing or not owned by ``container``.
    Reads only; an empty list when there is no layout to apply."""
    volume = _layout_volume(dest, container)
    if volume is None:
        return []
    container = cast("Owner", container)  # a volume is laid out only with a container owner
    changes = []
    try:
        vfd = open_dir(volume)
    except FileNotFoundError:
        vfd = None
    except SafeFileError as exc:
        raise WeightsError(f"{exc}; move it away and run again") from None
    try:
        for label, name in ((volume, None), (os.path.join(volume, "weights"), "weights")):
            st = None
            if vfd is not None:
                with contextlib.suppress(FileNotFoundError):
                    st = os.fstat(vfd) if name is None else os.lstat(name, dir_fd=vfd)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise WeightsError(f"{label} is a {kind_of(st.st_mode)}, not a directory; move it away and run again")
            if (st.st_uid, st.st_gid) != tuple(owner) or stat.S_IMODE(st.st_mode) != DIR_MODE:
                changes.append(
                    f"{label}: owner {st.st_uid}:{st.st_gid} mode {stat.S_IMODE(st.st_mode):04o} -> "
                    f"{owner[0]}:{owner[1]} {DIR_MODE:04o}"
                )
        for name in WRITABLE_SUBDIRS:
            label = os.path.join(volume, name)
            st = None
            if vfd is not None:
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(name, dir_fd=vfd)
            if st is None:
                changes.append(f"{label}: create, owner {container[0]}:{container[1]} mode {DIR_MODE:04o}")
            elif not stat.S_ISDIR(st.st_mode):
                raise WeightsError(f"{label} is a {kind_of(st.st_mode)}, not a directory; move it away and run again")
            elif (st.st_uid, st.st_gid) != tuple(container):
                changes.append(f"{label}: owner {st.st_uid}:{st.st_gid} -> {container[0]}:{container[1]}")
    finally:
        if vfd is not None:
            os.close(vfd)
    return changes


def apply_layout(dest: str, owner: Owner, container: Owner | None) -> list[str]:
    """Give dest and everything below it ``owner`` with modes 0755/0644 (0755 for files with an execute bit),
    and with ``container`` the volume layout (see ``plan_layout``); all on descriptors, never following a link.
    Returns the links and special files in dest that were left alone."""
    try:
        with opened_dir(dest) as dest_fd:
            _changed, skipped = own_tree(dest_fd, owner, DIR_MODE, FILE_MODE, where=dest, exec_mode=EXEC_MODE)
        volume = _layout_volume(dest, container)
        if volume is None:
            return skipped
        with opened_dir(volume) as vfd:
            set_attrs(vfd, DIR_MODE, owner)
            wfd = open_subdir(vfd, "weights", volume)
            try:
                set_attrs(wfd, DIR_MODE, owner)
            finally:
                os.close(wfd)
            for name in WRITABLE_SUBDIRS:
                fd = ensure_dir(vfd, name, DIR_MODE, container, volume)[0]
                try:
                    # Only the owner: the mode and the contents are the server's.
                    set_attrs(fd, None, container)
                finally:
                    os.close(fd)
    except SafeFileError as exc:
        raise WeightsError(f"cannot give {dest} its owner and modes: {exc}; move it away and run again") from None
    return skipped


# ---------------------------------------------------------------------------
# The whole step


def _listed(paths: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _summary(plan: JSON, label: str) -> list[str]:
    files_ok = plan["files_total"] - len(plan["to_fetch"])
    lines = [f"source: {label}"]
    lines.append(f"files: {files_ok} of {plan['files_total']} complete ({human_bytes(plan['bytes_total'])} in all)")
    for key in ("missing", "wrong_size", "corrupt", "not_regular"):
        if plan[key]:
            lines.append(f"{key.replace('_', ' ')}: {', '.join(plan[key])}")
    if plan["attrs"]:
        lines.append(f"owner or mode to fix: {_listed(plan['attrs'])}")
    return lines


def diff_of(
    plan: JSON, label: str, manifest_changed: bool, layout: Sequence[str] = (), owner: Owner | None = None
) -> dict[str, str]:
    before = _summary(plan, label)
    before.append(f"manifest: {'matches' if plan['manifest_matches'] else 'absent or for another source'}")
    after = [
        f"source: {label}",
        f"files: {plan['files_total']} of {plan['files_total']} complete ({human_bytes(plan['bytes_total'])} in all)",
    ]
    if plan["to_fetch"]:
        after.append(
            f"fetch: {len(plan['to_fetch'])} files, {human_bytes(plan['bytes_to_fetch'])} to move "
            f"({human_bytes(plan['bytes_staged'])} already staged)"
        )
    if plan["attrs"]:
        who = f"owner {owner[0]}:{owner[1]}, " if owner is not None else ""
        after.append(f"owner and modes: {who}directories 0755, files 0644 (0755 with an execute bit)")
    after.append(f"manifest: {'written' if manifest_changed else 'matches'}")
    if layout:
        before.extend(f"volume: {change}" for change in layout)
        after.append("volume: laid out (weights root's and read-only, the directories the server writes its own)")
    return {
        "before_header": plan["dest"],
        "after_header": plan["dest"],
        "before": "\n".join(before) + "\n",
        "after": "\n".join(after) + "\n",
    }


def _manifest_source(
    options: JSON, source: str, repo_id: str | None, allow: Patterns, ignore: Patterns
) -> tuple[PeerFiles | S3Files, str, list[JSON], str, str]:
    """``(files object, revision, file dicts, endpoint, label)`` of an s3 or peer source."""
    if not repo_id:
        raise WeightsError(f"source {source} needs repo_id, e.g. Qwen/Qwen3-32B")
    check_repo_id(repo_id)
    revision = options.get("revision")
    check_revision(repo_id, revision, options.get("allow_floating_revision"))
    if not revision:
        raise WeightsError(f"source {source} needs revision, the commit (or, floating, the name) the copy was made at")
    files_at: PeerFiles | S3Files
    if source == "peer":
        files_at = PeerFiles(options.get("peer_url"), options.get("timeout") or 60)
        label = f"{files_at.name} ({repo_id}@{revision})"
    else:
        missing = [
            name for name in ("s3_endpoint", "s3_bucket", "s3_access_key", "s3_secret_key") if not options.get(name)
        ]
        if missing:
            raise WeightsError(f"source s3 needs {', '.join(missing)}; set them (keep the keys in a vault)")
        try:
            client = S3Client(
                options["s3_endpoint"],
                options["s3_access_key"],
                options["s3_secret_key"],
                region=options.get("s3_region") or "us-east-1",
                session_token=options.get("s3_session_token") or None,
                ca_bundle=options.get("s3_ca_bundle"),
                verify=options.get("s3_verify", True) is not False,
                timeout=options.get("timeout") or 60,
            )
        except S3Error as exc:
            raise WeightsError(str(exc)) from None
        files_at = S3Files(client, options["s3_bucket"], options.get("s3_prefix"), repo_id, revision)
        label = f"s3 {repo_id}@{revision} from s3://{options['s3_bucket']}/{files_at.base} at {client.endpoint}"
    files = files_at.list(repo_id, revision, allow, ignore)
    # A peer's URL holds its token: the manifest records the peer's origin only.
    endpoint = net.show_origin(files_at.base) if source == "peer" else files_at.endpoint
    return files_at, revision, files, endpoint, label


def _owner_of(options: JSON, key: str, group_key: str, default: _T) -> Owner | _T:
    uid = options.get(key)
    if uid is None:
        return default
    gid = options.get(group_key)
    return (uid, uid if gid is None else gid)


def sync_weights(
    options: JSON,
    check_mode: bool = False,
    callback: ProgressCallback | None = None,
    hub: Hub | S3Files | None = None,
) -> JSON:
    """Plan, and unless ``check_mode`` fetch, place and record the weights, then give them (and, with
    ``container_owner``, their volume) the ownership layout. Returns the module's result.

    ``options`` holds the module's parameters (see plugins/modules/model_weights.py). ``callback`` gets
    ``(done_bytes, total_bytes, file)`` while bytes move.
    """
    dest = os.path.normpath(options["dest"])
    if not os.path.isabs(dest):
        raise WeightsError(f"dest {dest!r} must be an absolute path")
    source = options.get("source") or "hf"
    owner = _owner_of(options, "owner", "group", ROOT_OWNER)
    container = _owner_of(options, "container_owner", "container_group", None)
    if container is not None and os.path.basename(os.path.dirname(dest)) != "weights":
        raise WeightsError(
            f"dest {dest} is not <volume>/weights/<model>; container_owner lays out a tt-inference-server volume, "
            "so give the weights directory of one (or leave container_owner unset)"
        )
    workers = options.get("workers") or min(8, os.cpu_count() or 1)
    allow, ignore = options.get("allow_patterns"), options.get("ignore_patterns")
    host = options.get("host") or socket.gethostname()
    repo_id = options.get("repo_id")
    token = options.get("hf_token")
    secrets_seen = (
        token,
        options.get("s3_secret_key"),
        options.get("s3_session_token"),
        options.get("s3_access_key"),
    )
    plan = None
    try:
        if source in ("s3", "peer"):
            hub, sha, files, endpoint, label = _manifest_source(options, source, repo_id, allow, ignore)
            identity = identity_of(source, repo_id, sha)
        elif source == "hf":
            if not repo_id:
                raise WeightsError("source hf needs repo_id, e.g. Qwen/Qwen3-32B")
            # A hub passed in is a Hub (S3Files only comes from _manifest_source, for the other sources).
            hub = cast("Hub | None", hub) or Hub(options.get("hf_endpoint"), token, options.get("timeout") or 60)
            sha, files = list_hf_source(
                hub, repo_id, options.get("revision"), options.get("allow_floating_revision"), allow, ignore
            )
            identity = identity_of("hf", repo_id, sha)
            endpoint = hub.endpoint
            label = f"hf {repo_id}@{sha} from {scrub(endpoint)}"
        elif source == "none":
            # Weights already in place (a preseeded or aliased volume): nothing is listed, fetched or recorded.
            dest_fd = _open_existing(dest)
            if dest_fd is None:
                raise WeightsError(
                    f"dest {dest} does not exist; source none only gives weights already in place their owner, "
                    "modes and volume layout"
                )
            os.close(dest_fd)
            sha, files, endpoint, identity, label = None, [], None, {"source": "none"}, "none (the files in place)"
        else:
            root = options.get("path")
            if not root or not os.path.isabs(root):
                raise WeightsError(f"source path needs path, an absolute directory (got {root!r})")
            root = os.path.normpath(root)
            if os.path.realpath(root) == os.path.realpath(dest):
                raise WeightsError(f"path {root} is dest itself; point path at another copy of the model")
            sha, files, endpoint = None, list_path_source(root, allow, ignore), None
            identity = identity_of("path", repo_id, path=root)
            label = f"path {root}"
        if not files and source != "none":
            raise WeightsError(
                f"{label} has no files left after allow_patterns {list(allow or [])} and ignore_patterns "
                f"{list(ignore or [])}; check repo_id, revision and the patterns"
            )
        plan = plan_weights(files, dest, identity, options.get("verify") or "auto", workers, owner, endpoint)
        if source == "none":
            plan["extra"] = []
        layout = plan_layout(dest, owner, container)
        margin = int(float(options.get("disk_margin_gb", 10)) * (1 << 30))
        check_disk(dest, plan["bytes_needed"], margin, host, f"the weights of {repo_id or label}")
        probe = nearest_existing(dest)
        filesystem = {"device": _device_near(probe), "free_bytes": free_bytes(probe), "path": probe}

        stats = {"fetched_bytes": 0, "restarts": 0, "files": []}
        if plan["to_fetch"] and not check_mode:
            progress = Progress(plan["bytes_to_fetch"], options.get("status_file"), callback)
            parent_fd = make_path(os.path.dirname(dest), owner=owner)
            os.close(parent_fd)
            try:
                if source in COMMIT_SOURCES:
                    # A commit source (hf, s3, peer) has set hub, repo_id and sha above.
                    stats = fetch_hf(cast("Hub | S3Files", hub), cast(str, repo_id), cast(str, sha), plan, progress)
                else:
                    stats = fetch_path(plan, progress, workers, owner)
            finally:
                progress.write(state="stopped")
            place_files(plan, owner)
            progress.write(state="done")

        verified_at = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            if plan["hashed"] or plan["to_fetch"]
            else ((plan["manifest"] or {}).get("verified_at"))
        )
        manifest = build_manifest(identity, plan["files"], endpoint, verified_at, source)
        manifest_changed = source != "none" and (
            _manifest_body(manifest) != _manifest_body(plan["manifest"]) or not plan["manifest_matches"]
        )
        if not check_mode and manifest_changed:
            write_manifest(dest, manifest, owner)
        # The layout comes last, once the weights are complete and verified: a volume that an older release
        # (or the factory) gave to the container user is re-owned here, idempotently.
        skipped = [rel for rel in plan["skipped"] if not (manifest_changed and rel == MANIFEST_NAME)]
        if not check_mode and (plan["to_fetch"] or plan["attrs"] or layout or manifest_changed):
            skipped = apply_layout(dest, owner, container)
    except WeightsError as exc:
        raise WeightsError(scrub(exc, *secrets_seen)) from None
    except SafeFileError as exc:
        raise WeightsError(scrub(f"{host}: {exc}; move it away and run again", *secrets_seen)) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC and plan is not None and not check_mode:
            # The filesystem filled up after the preflight (another writer): keep no partial file in the volume.
            clear_staging(plan["staging"])
            where = nearest_existing(dest)
            raise WeightsError(
                scrub(
                    f"{host}: the filesystem of {where} filled up while writing the weights of {repo_id or dest} "
                    f"into {dest}: they need {human_bytes(plan['bytes_needed'])} ({plan['bytes_needed']} bytes) and "
                    f"{human_bytes(free_bytes(where))} ({free_bytes(where)} bytes) are free with the partial files "
                    "removed. Free space there (something else is filling it) or move the volume, then run again",
                    *secrets_seen,
                )
            ) from None
        raise WeightsError(
            scrub(f"{host}: writing the weights of {repo_id or dest} failed: {exc}", *secrets_seen)
        ) from None

    changed = bool(plan["to_fetch"] or plan["attrs"] or manifest_changed or layout)
    return {
        "changed": changed,
        "dest": dest,
        "plan": {
            "source": label,
            "revision": sha,
            "files_total": plan["files_total"],
            "bytes_total": plan["bytes_total"],
            "to_fetch": plan["to_fetch"],
            "bytes_to_fetch": plan["bytes_to_fetch"],
            "bytes_staged": plan["bytes_staged"],
            "missing": plan["missing"],
            "wrong_size": plan["wrong_size"],
            "corrupt": plan["corrupt"],
            "extra": plan["extra"],
            "complete": plan["complete"],
            "attrs": plan["attrs"],
            "layout": layout,
        },
        "revision": sha,
        "filesystem": filesystem,
        "bytes_needed": plan["bytes_needed"],
        "fetched_bytes": stats["fetched_bytes"],
        "restarts": stats["restarts"],
        "hashed": plan["hashed"],
        "verified": plan["verified"],
        "manifest": os.path.join(dest, MANIFEST_NAME),
        "skipped": skipped,
        "diff": diff_of(plan, label, manifest_changed, layout, owner),
    }
