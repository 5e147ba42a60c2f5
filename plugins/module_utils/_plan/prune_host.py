# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""disk_prune on the host: the scan (``_plan/prune_scan.py``) of the volume root, the spools, the release root and
the Docker engine, the sizes, and the removal through ``_fs/reclaim`` (a root-only trash per root, emptied under a
deadline, resumed by the next run). The decisions are ``_plan/prune.py``'s.

Every path is opened relative to a directory descriptor without following a link; an entry is checked again
(type, owner) right before it is renamed into the trash, so what a user changed since the scan is refused then.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import (
    make_path,
    open_relative,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import (
    TRASH_NAME,
    Usage,
    check_top,
    empty,
    freed,
    open_trash,
    to_trash,
    usage,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import (
    KINDS,
    REPORT_ONLY,
    check_options,
    listing,
    plan_images,
    plan_kernel_caches,
    plan_releases,
    plan_spool,
    plan_staging,
    plan_volumes,
    summary,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune_scan import (
    Host,
    join_path,
    opened_root,
    place_entry,
    scan_kernel_caches,
    scan_releases,
    scan_spool,
    scan_staging,
    scan_trash,
    scan_volumes,
    where_of,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    PRUNE_REPORT,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import check_path_text

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

_PRIVATE = ("_root", "_parent", "_entry", "_owners", "_usage", "_link", "_trash", "_problem")


def _size(items: list[JSON], host: Host) -> None:
    for found in items:
        if found["action"] != "remove" and found["note"] != REPORT_ONLY:
            continue
        if found["kind"] == "images":
            continue
        root, parent, entry = found["_root"], found["_parent"], found["_entry"]
        try:
            with opened_root(root) as rfd:
                pfd = open_relative(rfd, parent, root)
                try:
                    found["_usage"] = usage(pfd, entry, where_of(root, parent))
                finally:
                    os.close(pfd)
        except FileNotFoundError:
            found["action"], found["note"] = "skip", f"{found['path']} vanished during the scan"
            continue
        except (OSError, SafeFileError) as exc:
            found["action"], found["note"] = "skip", str(exc)
            host.skipped.append(str(exc))
            continue
        found["bytes"] = found["_usage"].bytes


def _to_trash(found: JSON, trash: dict[str, tuple[int, list[str]]]) -> None:
    """Rename one item into its root's trash (an alias is only unlinked), checking it again first."""
    root, parent, entry = found["_root"], found["_parent"], found["_entry"]
    with opened_root(root) as rfd:
        pfd = open_relative(rfd, parent, root)
        try:
            st = os.lstat(entry, dir_fd=pfd)
            if found.get("_link"):
                if not stat.S_ISLNK(st.st_mode):
                    raise SafeFileError(found["path"], "is no longer a link; it is left alone")
                os.unlink(entry, dir_fd=pfd)
                return
            check_top(pfd, entry, where_of(root, parent), found["_owners"])
            if root not in trash:
                # With create, a descriptor or an error: never None.
                trash[root] = (cast(int, open_trash(rfd, root, create=True)), [])
            tfd, names = trash[root]
            names.append(to_trash(pfd, entry, tfd, found["kind"]))
            found["_trash"] = names[-1]
            if found["kind"] == "spool":
                _tidy(rfd, parent)
        finally:
            os.close(pfd)


def _tidy(rfd: int, parent: str) -> None:
    """Remove the spool directories an entry leaves empty (best effort, by descriptor, never past the spool)."""
    parts = parent.split("/")
    while parts:
        name = parts.pop()
        with contextlib.suppress(OSError, SafeFileError):
            up = open_relative(rfd, "/".join(parts), None)
            try:
                os.rmdir(name, dir_fd=up)
            finally:
                os.close(up)
            continue
        break


def remove(
    items: list[JSON], host: Host, until: float, progress: Progress | None = None
) -> tuple[int, list[str], dict[str, int]]:
    """Rename every item to remove into its trash, remove the images, then empty the trash until ``until``, telling
    ``progress`` the bytes freed. Returns ``(bytes freed, pending paths, bytes freed by kind)``."""
    trash: dict[str, tuple[int, list[str]]] = {}
    by_kind: dict[str, int] = {}
    pending: list[str] = []
    reclaimed = 0
    try:
        for found in items:
            if found["action"] != "remove":
                continue
            try:
                if found["kind"] == "images":
                    host.engine.remove(found["ref"])
                    reclaimed += found["bytes"]
                    by_kind["images"] = by_kind.get("images", 0) + found["bytes"]
                elif found.get("_trash") and found["_parent"] == TRASH_NAME:
                    if found["_root"] not in trash:
                        with opened_root(found["_root"]) as rfd:
                            trash[found["_root"]] = (open_trash(rfd, found["_root"], create=False) or -1, [])
                    trash[found["_root"]][1].append(found["_trash"])
                else:
                    _to_trash(found, trash)
            except (OSError, SafeFileError, ImageError) as exc:
                found["action"], found["note"] = "skip", str(exc)
                host.skipped.append(f"{found['path'] if 'path' in found else found['ref']}: not removed: {exc}")
        kinds_of = {(f["_root"], f.get("_trash")): f["kind"] for f in items if f.get("_trash")}
        for root, (tfd, names) in trash.items():
            for name in names:
                advance = progress.advance if progress is not None else None
                _done, left, freed_bytes, problems = empty(tfd, [name], until, advance)
                host.skipped.extend(f"{join_path(root, TRASH_NAME, text)}" for text in problems)
                reclaimed += freed_bytes
                kind = kinds_of.get((root, name), "volumes")
                by_kind[kind] = by_kind.get(kind, 0) + freed_bytes
                pending.extend(join_path(root, TRASH_NAME, left_name) for left_name in left)
            # Gone when it is empty; an entry left for the next run keeps it.
            with contextlib.suppress(OSError), opened_root(root) as rfd:
                os.rmdir(TRASH_NAME, dir_fd=rfd)
    finally:
        for tfd, _names in trash.values():
            if tfd >= 0:
                os.close(tfd)
    return reclaimed, pending, by_kind


def write_report(path: str, report: Mapping[str, Any]) -> None:
    directory, name = os.path.split(os.path.normpath(path))
    fd = make_path(directory, mode=0o755)
    try:
        write_json(fd, name, dict(report), mode=0o644)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# The run


def prune(
    options: Mapping[str, Any], check_mode: bool, engine: Engine | None = None, peers: list[JSON] | None = None
) -> JSON:
    """The whole run: scan, decide, size, and (unless ``check_mode``, and unless kinds is empty) remove. ``peers``:
    the states of the live peer servers."""
    check_options(options)
    kinds = list(options.get("kinds") or [])
    root = os.path.normpath(check_path_text(options["volume_root"], "volume_root"))
    release_root = os.path.normpath(check_path_text(options.get("release_root"), "release_root"))
    spools = [os.path.normpath(check_path_text(s, "spool_dirs")) for s in options.get("spool_dirs") or []]
    needed = list(options.get("needed_volumes") or [])
    named = list(options.get("remove") or [])
    until = time.monotonic() + int(options["time_limit"])
    host = Host(engine, peers or [])
    host.read_engine(bool(options.get("image_repositories")))

    items: list[JSON] = []
    for place in [root, *spools, release_root]:
        items.extend(scan_trash(host, place, kinds))
    try:
        with opened_root(root) as rfd:
            entries = scan_volumes(host, root, rfd)
            volumes = plan_volumes(root, entries, needed, named, kinds)
            for volume, entry in zip(volumes, entries, strict=True):
                place_entry(volume, root, "", volume["name"])
                volume["_link"] = entry["is_link"]
                volume["_problem"] = entry["problem"]
            items.extend(volumes)
            caches = scan_kernel_caches(host, root, rfd, volumes)
            items.extend(_carry(plan_kernel_caches(caches, kinds), caches))
            staging = scan_staging(host, root, rfd)
            items.extend(_carry(plan_staging(staging, needed, kinds), staging))
    except FileNotFoundError:
        host.skipped.append(f"volume_root {root} does not exist: no volumes to look at")
    except SafeFileError as exc:
        raise SafeFileError(exc.path, f"{exc.reason} (volume_root {root}); give the real directory") from None
    spool_entries = [entry for spool in spools for entry in scan_spool(host, spool)]
    items.extend(_carry(plan_spool(spool_entries, options.get("needed_kernel_keys") or [], kinds), spool_entries))
    found, places = scan_releases(host, release_root)
    by_path = {place["path"]: place for place in places}
    for release in plan_releases(release_root, found, int(options["release_keep"]), named, kinds):
        items.append({**by_path.get(release["path"], {}), **release})
    if host.images is not None:
        images = plan_images(
            host.images, options.get("image_repositories") or [], options.get("needed_images") or [], named, kinds
        )
        items.extend(images)
    _refusals(items, named, host)
    _size(items, host)
    items.sort(key=lambda found: (found["kind"], found["name"]))

    counted = [f for f in items if f["action"] == "remove" or f["note"] == REPORT_ONLY]
    usages: list[Usage] = [f["_usage"] for f in counted if f.get("_usage") is not None]
    reclaimable = freed(usages) + sum(f["bytes"] for f in counted if f["kind"] == "images")
    by_kind = {kind: 0 for kind in KINDS}
    for kind in KINDS:
        of_kind = [f for f in counted if f["kind"] == kind]
        by_kind[kind] = (
            sum(f["bytes"] for f in of_kind)
            if kind == "images"
            else freed(f["_usage"] for f in of_kind if f.get("_usage"))
        )
    before = listing(items)
    reclaimed = 0
    pending: list[str] = []
    freed_by_kind: dict[str, int] = {}
    to_remove = [f for f in items if f["action"] == "remove"]
    if not check_mode and to_remove:
        status = options.get("status_file")
        progress = Progress(reclaimable - by_kind["images"], status) if status else None
        reclaimed, pending, freed_by_kind = remove(items, host, until, progress)
        if progress is not None:
            progress.write(state="done")
    after = listing(f for f in items if f["action"] != "remove")
    result: JSON = {
        "items": [{k: v for k, v in f.items() if k not in _PRIVATE} for f in items],
        "reclaimable_bytes": reclaimable,
        "reclaimed_bytes": reclaimed,
        "pending": pending,
        "left_alone": host.skipped,
        "changed": bool(to_remove),
        "diff": {"before": before, "after": after},
        "msg": summary(items, reclaimable, by_kind)
        + ("" if check_mode or not to_remove else f"; reclaimed {human_bytes(reclaimed)}")
        + (f"; {len(pending)} left for the next run (time_limit)" if pending else ""),
    }
    if not check_mode:
        left = {kind: max(0, by_kind[kind] - freed_by_kind.get(kind, 0)) for kind in KINDS}
        write_report(
            options.get("report_file") or PRUNE_REPORT,
            {
                "time": int(time.time()),
                "reclaimable_bytes": sum(left.values()) if to_remove else reclaimable,
                "items_count": len(pending) if to_remove else len(counted),
                "by_kind": left if to_remove else by_kind,
                "volume_root": root,
            },
        )
    return result


def _carry(items: list[JSON], entries: list[JSON]) -> list[JSON]:
    """Give the decided items the places (root, parent, name, owners) their scanned entries had, in order."""
    for found, entry in zip(items, entries, strict=True):
        found.update({key: value for key, value in entry.items() if key in _PRIVATE})
    return items


def _refusals(items: list[JSON], named: list[str], host: Host) -> None:
    """Name every entry of ``remove`` that is refused (needed or in use) or found nowhere."""
    for name in named:
        matches = [f for f in items if f["name"] == name or f["name"].endswith("/" + name)]
        if not matches:
            host.skipped.append(f"remove names {name}, which is not found under the roots or in the engine")
        for found in matches:
            if found["action"] == "keep":
                host.skipped.append(f"remove names {name}, but it is kept: {found['note']}")
