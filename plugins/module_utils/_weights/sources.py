# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: the other sources, a local or NFS path and the sources that carry our own manifest
(an S3 bucket, a peer host's weights_server).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import stat
import urllib.parse
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, kind_of
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import connection, describe
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_JSON_BYTES, MAX_LISTED_FILES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of, show_origin
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import (
    MAX_JSON_ITEMS,
    USER_AGENT,
    Hub,
    json_items,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import MANIFEST_SCHEMA
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_IGNORE_PATTERNS,
    HEX64_RE,
    PART_SUFFIX,
    STAGING_NAME,
    TEMP_PREFIX,
    WeightsError,
    check_relpath,
    filter_paths,
    scrub,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NoReturn

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Patterns


# Path sources: top-level directories that are never model files.
_SKIPPED_TOP = (STAGING_NAME, ".cache", ".git")


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
            f"{origin} holds {printable(got[0], 200)}@{printable(got[1], 100)}, not {repo_id}@{revision}; "
            "point it at a copy of that revision"
        )
    if len(manifest["files"]) > MAX_LISTED_FILES:
        raise WeightsError(f"{origin} lists more than {MAX_LISTED_FILES} files in its manifest; refused")
    by_path = {}
    for path, entry in manifest["files"].items():
        check_relpath(path, origin)
        size = entry.get("size") if isinstance(entry, dict) else None
        digest = str(entry.get("sha256") or "") if isinstance(entry, dict) else ""
        if not isinstance(size, int) or size < 0 or not HEX64_RE.match(digest):
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
        deadline: Deadline | None = None,
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
                "GET", self.bucket, self.base + MANIFEST_NAME, expect=(200, 404), limit=MAX_JSON_BYTES
            )
            if status == 404:
                raise WeightsError(
                    f"{origin} has no {MANIFEST_NAME}; upload the whole weights directory of {repo_id}@{revision} "
                    f"(as this collection writes it, manifest included) under that prefix, or check "
                    "s3_bucket and s3_prefix"
                )
            if json_items(body) > MAX_JSON_ITEMS:
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
    connection per request (``_net.http.connection``, with the same deadlines as the Hub's), no redirect followed,
    and messages name the origin, never the token."""

    def __init__(self, url: str | None, timeout: float | None = 60) -> None:
        if not re.match(r"^https?://[^/\s]+/", url or ""):
            raise WeightsError(
                f"peer_url {scrub(printable(url, 200))!r} is not an http(s) URL ending in /; use the url "
                "weights_server returns"
            )
        url = cast(str, url)  # None was refused above
        super().__init__(url.rstrip("/"), None, timeout)
        self.base = url if url.endswith("/") else url + "/"

    @property
    def name(self) -> str:
        return f"peer {show_origin(self.base)}"

    def file_url(self, _repo_id: str, _sha: str, path: str) -> str:
        return self.base + urllib.parse.quote(path, safe="/")

    def open(
        self,
        url: str,
        what: str,
        repo_id: str,
        headers: Mapping[str, str] | None = None,
        deadline: Deadline | None = None,
        size: int | None = None,
    ) -> _ClosingResponse:
        """GET ``url`` on the peer's origin within ``deadline``; anything but 200 or 206 (a redirect included) is
        a WeightsError, a connection that fails, stalls, passes its deadline or breaks the protocol a NetError."""
        del size
        deadline = deadline or self.deadline(what)
        if origin_of(url) != self.origin:
            raise WeightsError(f"{self.name}: {what} of {repo_id} is not on the peer's origin; refused")
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn = connection(*self.origin, deadline)
        try:
            conn.request("GET", target, headers={"User-Agent": USER_AGENT, **(headers or {})})
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError, ValueError) as exc:
            conn.close()
            raise describe(exc, deadline, url) from None
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
