# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: filling staging, by download (hf, s3, peer; resumed, bounded, verified while it streams) or
from a path source (hardlinked or copied, then verified).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import rename, unlink
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import makedirs, open_relative, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import copy_file
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import content_length, copy_capped, describe
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import DEFAULT_STALL
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import content_range_start
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import HASH_CHUNK, Digests, hash_files
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import RETRYABLE
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    PART_SUFFIX,
    STAGING_MODE,
    WeightsError,
    scrub,
    split_relpath,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.plan import attrs_ok, linkable, same_filesystem
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.staging import (
    expected_key,
    open_staging,
    record_staged,
    size_at,
    staged_size,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import Hub, Response
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Owner
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import S3Files


NET_ATTEMPTS = 3
# The floor of one file's overall limit, which grows by a second per MiB (_net.deadline.Deadline.for_size); each of the
# NET_ATTEMPTS attempts has its own.
TRANSFER_FLOOR = 300.0


def _unstaged(plan: JSON, staged: JSON, staging_fd: int) -> Iterator[tuple[str, JSON, int, str]]:
    """``(path, item, directory descriptor, file name)`` of every file still to fetch, the descriptor being its
    directory in staging (the caller closes it); files already complete in staging are skipped."""
    by_path = {item["path"]: item for item in plan["files"]}
    for rel in plan["to_fetch"]:
        item = by_path[rel]
        done = staged.get(rel)
        if (
            isinstance(done, dict)
            and done.get("expected") == expected_key(item)
            and staged_size(staging_fd, rel) == item["size"]
        ):
            item["sha256"] = done["sha256"]
            continue
        reldir, leaf = split_relpath(rel)
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
    staging_fd, staged = open_staging(plan)
    stats: JSON = {"fetched_bytes": 0, "restarts": 0, "files": []}
    try:
        for rel, item, dirfd, leaf in _unstaged(plan, staged, staging_fd):
            try:
                part = leaf + PART_SUFFIX
                got, resumed = _download(hub, repo_id, sha, item, dirfd, part, progress, stats)
                key = "blob_sha1" if item.get("blob_sha1") else "sha256"
                if got[key] != item[key] and resumed:
                    # The bytes before the resume point came from an earlier attempt, perhaps from another holder
                    # that lied and died: nobody can tell whose bytes are wrong. Start over from byte 0 here, so
                    # that this source is blamed only for bytes it sent itself.
                    unlink(dirfd, part)
                    stats["restarts"] += 1
                    got, resumed = _download(hub, repo_id, sha, item, dirfd, part, progress, stats)
                if got[key] != item[key]:
                    unlink(dirfd, part)
                    expected = item["sha256"] or f"git blob {item['blob_sha1']}"
                    actual = got["sha256"] if key == "sha256" else f"git blob {got['blob_sha1']}"
                    raise WeightsError(
                        f"{_name_of(hub)} sent {printable(rel)} of {repo_id}@{sha} with the wrong content "
                        f"(expected {expected}, got {actual}, all of it sent by {_name_of(hub)} from byte 0); the "
                        "partial file was removed, run again or use another source"
                    )
                item["sha256"] = got["sha256"]
                rename(dirfd, part, leaf)
            finally:
                os.close(dirfd)
            stats["files"].append(rel)
            record_staged(staging_fd, plan["identity"], staged, rel, item)
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

    def __init__(self, resp: Response) -> None:
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
) -> tuple[JSON, bool]:
    """Fetch one file into its partial file in staging, resuming it; returns the digests of the whole file and
    whether some of its bytes were there before the attempt that finished it (a resume: they may be another
    source's, or an earlier attempt's).

    Each attempt is bounded: it writes at most the bytes the listing gives (``_net.http.copy_capped``), within a
    deadline (``timeout`` seconds without a byte, and ``TRANSFER_FLOOR`` plus a second per MiB overall). A body
    longer than the listing gives (declared or sent) fails at once, with the partial file removed: nothing beyond
    the listed size is ever written. Any other failed attempt (refused, reset, stalled, too slow, cut short, not
    HTTP) is retried from what the partial file holds, NET_ATTEMPTS times in all."""
    rel, size = item["path"], item["size"]
    url = hub.file_url(repo_id, sha, rel)
    where, shown = _name_of(hub), printable(rel)
    failure: Exception | str | None = None
    for _attempt in range(NET_ATTEMPTS):
        offset = size_at(dirfd, part) or 0
        if offset > size:
            offset = 0
        digests = Digests(size if item.get("blob_sha1") else None)
        if offset:
            _hash_prefix(dirfd, part, offset, digests)
        if offset == size:
            if not size:
                os.close(_open_part(dirfd, part))
            return digests.result(), offset > 0
        deadline = Deadline.for_size(
            size - offset,
            stall=getattr(hub, "timeout", None) or DEFAULT_STALL,
            what=f"the transfer of {shown}",
            floor=TRANSFER_FLOOR,
        )
        state: JSON = {"digests": digests, "offset": offset, "deadline": deadline, "declared": None}
        state.update(written=0, expected=size - offset, sent=0)
        try:
            _attempt_download(hub, url, (rel, repo_id, sha, size), state, dirfd, part, progress, stats)
        except RETRYABLE as exc:
            if state["sent"] <= state["expected"]:
                if state["written"] == state["expected"]:
                    # Every listed byte arrived, then the connection broke: the digest (checked by the caller)
                    # decides.
                    return state["digests"].result(), state["offset"] > 0
                failure = exc if isinstance(exc, NetError) else describe(exc, deadline, url)
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
        got = size_at(dirfd, part)
        if got == size:
            return state["digests"].result(), state["offset"] > 0
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
    what = f"file {printable(rel)} at {sha}"
    with hub.open(url, what, repo_id, headers, deadline=state["deadline"], size=size) as resp:
        status = getattr(resp, "status", 200)
        start = content_range_start(resp.headers.get("Content-Range")) if status == 206 else None
        if offset and (status != 206 or start != offset):
            stats["restarts"] += 1
            progress.advance(-offset, rel)
            offset = 0
            state["offset"] = 0
            state["digests"] = Digests(size if state["digests"].sha1 is not None else None)
            state["expected"] = size
        state["declared"] = content_length(resp)
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
                copy_capped(body, write, state["expected"], f"file {printable(rel)}", url, state["deadline"])
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
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (item["dev"], item["ino"]) or not attrs_ok(st, owner):
        unlink(dirfd, leaf)
        raise WeightsError(f"{item['src']} changed while linking it into staging; run again")


def fetch_path(plan: JSON, progress: Progress, workers: int, owner: Owner | None = None) -> JSON:
    """Hardlink (same filesystem, when the file already has the owner and mode of the layout) or copy the
    files of ``plan["to_fetch"]`` into staging.

    Copies are hashed against their source afterwards; links are checked to share the source's inode.
    """
    staging = plan["staging"]
    staging_fd, staged = open_staging(plan)
    by_path = {item["path"]: item for item in plan["files"]}
    stats: JSON = {"fetched_bytes": 0, "restarts": 0, "files": [], "linked": [], "copied": []}
    try:
        for rel, item, dirfd, leaf in _unstaged(plan, staged, staging_fd):
            try:
                link = linkable(item, owner) and same_filesystem(item, staging)
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
                reldir, leaf = split_relpath(rel)
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
            record_staged(staging_fd, plan["identity"], staged, rel, by_path[rel])
    finally:
        os.close(staging_fd)
    return stats
