# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: the Hugging Face Hub HTTP protocol (revision, tree and resolve endpoints).

Spoken with the standard library, so target hosts need no huggingface_hub; every request is bounded
(docs/security.md).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, ProxyError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import describe, open_url, read_capped
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import (
    DEFAULT_STALL,
    MAX_JSON_BYTES,
    MAX_LISTED_FILES,
    MAX_REDIRECTS,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of, show_origin
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_ENDPOINT,
    DEFAULT_IGNORE_PATTERNS,
    HEX64_RE,
    SHA_RE,
    WeightsError,
    check_relpath,
    check_repo_id,
    check_revision,
    filter_paths,
    is_commit_sha,
    scrub,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from email.message import Message
    from types import TracebackType
    from typing import Any, Protocol

    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Patterns

    class Response(Protocol):
        """An open answer of a source: an http.client response, or a ``_ClosingResponse`` around one."""

        @property
        def headers(self) -> Message:
            ...

        def read(self, amount: int | None = ..., /) -> bytes:
            ...

        def __enter__(self) -> Response:
            ...

        def __exit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
        ) -> object:
            ...


# Network bounds (docs/security.md). The stall limit of every request is the module's ``timeout``.
# The overall limit of one small request: the revision, one page of the file list, a peer's manifest.
REQUEST_TOTAL = 300.0
# The overall limit of a whole listing, every page of the tree API included.
LISTING_TOTAL = 1800.0
# Pages of one file list (a Hub page holds up to 1000 entries; _net.limits.MAX_LISTED_FILES caps the entries).
MAX_LIST_PAGES = 10000
# JSON items (commas and opened objects or arrays) a reply may hold per file it can list: a Hub tree entry of an
# LFS file has about 10, a manifest entry 3. Counted in the raw bytes before json.loads builds anything.
JSON_ITEMS_PER_FILE = 16
MAX_JSON_ITEMS = JSON_ITEMS_PER_FILE * (MAX_LISTED_FILES + 1) + 1024
USER_AGENT = "ttfleet.inference/model_weights"
# Failures of one attempt at a file: retried (NET_ATTEMPTS in all), resuming what was verified.
RETRYABLE = (
    NetError,
    urllib.error.URLError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    socket.timeout,
)


def json_items(body: bytes) -> int:
    """An upper bound on the values ``json.loads(body)`` builds, from the raw bytes: every value but the first of a
    container follows a comma, and every container opens with ``{`` or ``[``."""
    return body.count(b",") + body.count(b"{") + body.count(b"[") + 1


class Hub:
    """The three Hub endpoints a snapshot needs.

    The token is sent only once the repository needs it: requests go out anonymously first and a 401/403 from
    the configured endpoint's origin is retried once with ``Authorization: Bearer``, which is kept from then on.

    Every request goes through ``_net.http.open_url``: the token only ever reaches the origin (scheme, host, port)
    of ``hf_endpoint`` (never a CDN it redirects to, never another page origin, never over http after https),
    redirects go to http(s) only and at most five times, and each request has a deadline: ``timeout``
    seconds without a byte (stall) and an overall limit (``REQUEST_TOTAL`` for an answer, a file's growing with
    its size). Every JSON answer is capped (``_net.limits.MAX_JSON_BYTES``) and a listing holds at most
    ``_net.limits.MAX_LISTED_FILES`` entries. Requests honour the proxy environment (``_net.proxy.proxy_for``); the
    token crosses a proxy only inside the TLS tunnel of an https endpoint.
    """

    def __init__(
        self, endpoint: str | None = DEFAULT_ENDPOINT, token: str | None = None, timeout: float | None = 60
    ) -> None:
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        if not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise WeightsError(
                f"hf_endpoint {scrub(self.endpoint)!r} is not an http(s) URL; use e.g. https://huggingface.co"
            )
        self.origin = origin_of(self.endpoint)
        self.token = token or None
        self.use_token = False
        self.timeout = float(timeout or DEFAULT_STALL)

    @property
    def name(self) -> str:
        """The source as messages name it."""
        return scrub(self.endpoint)

    def deadline(self, what: str, total: float | None = None) -> Deadline:
        """The limits of one request: ``timeout`` seconds without a byte, ``total`` (REQUEST_TOTAL) in all."""
        return Deadline(total=REQUEST_TOTAL if total is None else total, stall=self.timeout, what=what)

    def _open_url(self, url: str, deadline: Deadline, headers: dict[str, str]) -> Response:
        credentials = {"Authorization": f"Bearer {self.token}"} if self.use_token else None
        return open_url(
            url, deadline, headers=headers, credentials=credentials, credential_origin=self.origin, use_proxy=True
        )

    def open(
        self,
        url: str,
        what: str,
        repo_id: str,
        headers: Mapping[str, str] | None = None,
        deadline: Deadline | None = None,
        size: int | None = None,
    ) -> Response:
        """Open ``url`` within ``deadline``; HTTP errors become WeightsError naming ``what`` and the fix, a
        connection that fails, stalls, passes its deadline or breaks the protocol a ``_net.errors.NetError``. ``size``
        (of the whole file) is for sources that need it. Never shows the token."""
        del size
        deadline = deadline or self.deadline(what)
        send = {"User-Agent": USER_AGENT, **(headers or {})}
        try:
            try:
                return self._open_url(url, deadline, send)
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403) and self.token and not self.use_token and origin_of(url) == self.origin:
                    exc.close()
                    self.use_token = True
                    return self._open_url(url, deadline, send)
                raise
        except urllib.error.HTTPError as exc:
            detail = exc.headers.get("X-Error-Message") if exc.headers else None
            exc.close()
            raise WeightsError(scrub(self._http_message(exc.code, detail, what, repo_id), self.token)) from None

    def _http_message(self, code: int, detail: str | None, what: str, repo_id: str) -> str:
        why = f" ({printable(detail, 300)})" if detail else ""
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
                f"to another scheme than http or https, more than {MAX_REDIRECTS} times, or in a loop; check "
                "hf_endpoint"
            )
        return f"{self.name} answered HTTP {code}{why} for {what} of {repo_id}; retry later or use another hf_endpoint"

    def _net_message(self, what: str, repo_id: str, exc: Exception) -> str:
        if isinstance(exc, ProxyError):
            # The proxy failed, not the Hub: its message names the proxy and the fix.
            return f"{what} of {repo_id} from {self.name} failed: {exc}"
        return (
            f"{self.name}: {what} of {repo_id} failed: {exc}; check hf_endpoint and the network, or retry later "
            "(timeout is the stall limit in seconds)"
        )

    def get_json(
        self, url: str, what: str, repo_id: str, deadline: Deadline | None = None, max_items: int | None = None
    ) -> tuple[Any, str]:
        """``(decoded JSON, Link header)`` of ``url``: at most ``_net.limits.MAX_JSON_BYTES`` and ``max_items`` values
        (counted before decoding), within ``deadline``."""
        deadline = deadline or self.deadline(what)
        if max_items is None:
            max_items = MAX_JSON_ITEMS
        try:
            with self.open(url, what, repo_id, {"Accept": "application/json"}, deadline=deadline) as resp:
                body = read_capped(resp, MAX_JSON_BYTES, what, url, deadline)
                link = resp.headers.get("Link", "") if resp.headers is not None else ""
        except RETRYABLE as exc:
            error = exc if isinstance(exc, NetError) else describe(exc, deadline, url)
            raise WeightsError(scrub(self._net_message(what, repo_id, error), self.token)) from None
        return self._loads(body, what, repo_id, max_items), link

    def _loads(self, body: bytes, what: str, repo_id: str, max_items: int) -> Any:
        if json_items(body) > max_items:
            raise WeightsError(
                f"{self.name} sent {what} of {repo_id} holding more than {max_items} JSON values, more than a "
                f"listing of at most {MAX_LISTED_FILES} files needs; refused before decoding it"
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

        The pages together hold at most ``_net.limits.MAX_LISTED_FILES`` entries and take at most ``LISTING_TOTAL``
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
            left = MAX_LISTED_FILES - count
            deadline = Deadline.within(listing, REQUEST_TOTAL, self.timeout, what)
            data, link = self.get_json(url, what, repo_id, deadline, JSON_ITEMS_PER_FILE * (left + 1) + 64)
            if not isinstance(data, list):
                raise WeightsError(f"{self.name} sent a file list of {repo_id} that is not a list")
            count += len(data)
            if count > MAX_LISTED_FILES:
                raise WeightsError(
                    f"{self.name} lists more than {MAX_LISTED_FILES} entries for {repo_id}@{sha}; refused (a "
                    "model has hundreds of files)"
                )
            entries.extend(_tree_entry(entry) for entry in data if _is_file(entry))
            del data
            match = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link or "")
            if not match:
                return entries
            following = urllib.parse.urljoin(url, match.group(1).strip())
            if origin_of(following) != self.origin:
                raise WeightsError(
                    f"{self.name} sent the next page of {what} of {repo_id} at "
                    f"{printable(show_origin(following), 200)}, another origin; refused (a Hub pages on its "
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
            if not HEX64_RE.match(oid):
                raise WeightsError(f"{origin} lists LFS file {path} without a sha256 oid")
            item["sha256"] = oid
        else:
            oid = str(entry.get("oid", "")).lower()
            if not SHA_RE.match(oid):
                raise WeightsError(f"{origin} lists {path} without a git blob id")
            item["blob_sha1"] = oid
        by_path[path] = item
    return [by_path[path] for path in filter_paths(sorted(by_path), allow_patterns, ignore_patterns)]
