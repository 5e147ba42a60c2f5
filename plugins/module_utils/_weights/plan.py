# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: planning, comparing a source's files with the destination (reads only), and the disk check."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir, open_nearest, open_relative
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import (
    free_bytes,
    human_bytes,
    nearest_existing,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hashing import hash_files
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import manifest_matches, read_manifest
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    PART_SUFFIX,
    WeightsError,
    split_relpath,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.staging import (
    expected_key,
    open_staging_read,
    read_staging_state,
    staged_size,
    staging_dir,
)

if TYPE_CHECKING:
    from collections.abc import Container, Iterable

    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Identity, Owner


def open_existing(path: str) -> int | None:
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
    reldir, leaf = split_relpath(rel)
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


def attrs_ok(st: os.stat_result, owner: Owner | None) -> bool:
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
    if not attrs_ok(os.fstat(dest_fd), owner):
        reown.append(".")
    for rel_dir, _fd, entries in walk(dest_fd, dest):
        for name, st in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                if not attrs_ok(st, owner):
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
    dest_fd = open_existing(dest)
    staging_fd = None
    try:
        manifest = read_manifest(dest_fd, dest)
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
        staging_fd = open_staging_read(dest)
        staged = read_staging_state(staging_fd, identity)
        bytes_to_fetch = bytes_on_disk = bytes_staged = 0
        for rel in plan["to_fetch"]:
            item = by_path[rel]
            done = (staged or {}).get(rel)
            if (
                isinstance(done, dict)
                and done.get("expected") == expected_key(item)
                and staged_size(staging_fd, rel) == item["size"]
            ):
                bytes_staged += item["size"]
                continue
            partial = min(staged_size(staging_fd, rel, PART_SUFFIX) or 0, item["size"]) if staged is not None else 0
            bytes_staged += partial
            if "src" in item and linkable(item, owner) and same_filesystem(item, staging):
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


def device_near(path: str) -> int | None:
    """Device of ``path`` or of its nearest existing parent, opened without following a planted link."""
    try:
        fd = open_nearest(path)[0]
    except (OSError, SafeFileError):
        return None
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def linkable(item: JSON, owner: Owner | None) -> bool:
    """Whether a path-source file may be shared by a hardlink: it must already be what the weights need (the
    owner and mode of the layout, so nothing has to change on an inode that the source shares). Any other
    file is copied, and the copy never takes the source's owner or mode."""
    mode = item["src_mode"]
    return stat.S_IMODE(mode) == wanted_mode(mode) and (owner is None or tuple(item["src_owner"]) == tuple(owner))


def same_filesystem(item: JSON, staging: str) -> bool:
    """Whether a path-source file is on the filesystem of staging (so it can be hardlinked there)."""
    return device_near(staging) == item["dev"]


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
