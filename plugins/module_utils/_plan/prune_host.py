# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""disk_prune on the host: the scan of the volume root, the spools, the release root and the Docker engine, the
sizes, and the removal through ``_fs/reclaim`` (a root-only trash per root, emptied under a deadline, resumed by the
next run). The decisions are ``_plan/prune.py``'s.

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
    open_dir,
    open_relative,
    open_subdir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, kind_of
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import (
    TRASH_NAME,
    Usage,
    check_top,
    empty,
    freed,
    open_trash,
    to_trash,
    trash_label,
    usage,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import (
    KINDS,
    REPORT_ONLY,
    check_options,
    gate,
    item,
    listing,
    plan_images,
    plan_kernel_caches,
    plan_releases,
    plan_spool,
    plan_staging,
    plan_volumes,
    summary,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.releases import MARKER, RELEASE_TAG
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    ASIDE_INFIX,
    PRUNE_REPORT,
    TENSOR_CACHE_DIR,
    TENSOR_CACHE_PREFIX,
    VOLUME_PREFIX,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import check_path_text, name_is_clean
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import STAGING_NAME

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]

SPOOL_DEPTH = 5  # <model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm_commit>
_KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")
_PRIVATE = ("_root", "_parent", "_entry", "_owners", "_usage", "_link", "_trash", "_problem")


def _listdir(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return sorted(entry.name for entry in entries)


def _join(*parts: str) -> str:
    return "/".join(part.rstrip("/") for part in parts if part)


def _where(root: str, parent: str) -> str:
    return _join(root, parent) if parent else root


@contextlib.contextmanager
def _opened(path: str) -> Iterator[int]:
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


class Host:
    """One run's view of the host: what the engine runs, what peers serve, and the messages of what was skipped."""

    def __init__(self, engine: Engine | None, peers: list[JSON]) -> None:
        self.engine = engine or Engine()
        self.skipped: list[str] = []
        self.images: list[JSON] | None = None
        self.mount_sources: list[tuple[str, str]] = []
        self.mount_inodes: dict[tuple[int, int], str] = {}
        self.engine_broken: str | None = None
        # The states of the live peer servers (module_utils._peer.state.live_states): what they serve stays.
        self.peers = peers

    def read_engine(self, want_images: bool) -> None:
        try:
            containers = self.engine.containers()
            images = self.engine.images() if want_images else []
        except EngineAbsent as exc:
            self.skipped.append(f"{exc}: images are skipped (and no container can hold a volume)")
            return
        except ImageError as exc:
            self.engine_broken = f"the Docker engine could not list its containers ({exc}); nothing mounted is known"
            self.skipped.append(self.engine_broken + ": images and volumes are kept")
            return
        used: dict[str, list[str]] = {}
        for container in containers:
            name = ",".join(str(n).lstrip("/") for n in container.get("Names") or []) or str(container.get("Id"))[:12]
            used.setdefault(str(container.get("ImageID")), []).append(name)
            for mount in container.get("Mounts") or []:
                source = mount.get("Source") if isinstance(mount, dict) else None
                if not isinstance(source, str) or not source.startswith("/"):
                    continue
                self.mount_sources.append((os.path.normpath(source), name))
                # The directory and each parent by (st_dev, st_ino): a mount through an alias or of a subdirectory.
                path = os.path.normpath(source)
                while True:
                    with contextlib.suppress(OSError):
                        st = os.stat(path)
                        self.mount_inodes.setdefault((st.st_dev, st.st_ino), f"container {name} mounts {source}")
                    if path == "/":
                        break
                    path = os.path.dirname(path)
        self.images = [
            {
                "id": image.get("Id"),
                "tags": [tag for tag in image.get("RepoTags") or [] if isinstance(tag, str) and tag != "<none>:<none>"],
                "size": image.get("Size") or 0,
                "used_by": used.get(str(image.get("Id")), []),
            }
            for image in images
        ]

    def in_use(self, path: str, st: os.stat_result | None) -> str | None:
        """What holds ``path``: a container's mount (by path text or by the directory's inode), a live peer."""
        if self.engine_broken:
            return self.engine_broken
        for source, name in self.mount_sources:
            if source == path or source.startswith(path + "/"):
                return f"container {name} mounts {source}"
        if st is not None and (st.st_dev, st.st_ino) in self.mount_inodes:
            return self.mount_inodes[(st.st_dev, st.st_ino)]
        for state in self.peers:
            served = os.path.normpath(str(state.get("path")))
            if served == path or served.startswith(path + "/"):
                return f"a live peer server (pid {state.get('pid')}) serves {served}"
        return None


# ---------------------------------------------------------------------------------------------
# The scan


def _place(found: JSON, root: str, parent: str, entry: str, owners: tuple[int, ...] = (0,)) -> JSON:
    found.update(_root=root, _parent=parent, _entry=entry, _owners=owners)
    return found


def scan_volumes(host: Host, root: str, root_fd: int) -> list[JSON]:
    entries = []
    for name in _listdir(root_fd):
        if not name.startswith(VOLUME_PREFIX):
            continue
        path = _join(root, name)
        if not name_is_clean(name):
            host.skipped.append(f"skipped an entry under {root} with an unusable name: {name!a}")
            continue
        st = os.lstat(name, dir_fd=root_fd)
        entry: JSON = {"name": name, "is_link": stat.S_ISLNK(st.st_mode), "target": None, "problem": None}
        if entry["is_link"]:
            entry["target"] = os.readlink(name, dir_fd=root_fd)
            entry["in_use"] = host.in_use(path, None)
        elif stat.S_ISDIR(st.st_mode):
            entry["in_use"] = host.in_use(path, st)
            if st.st_uid != 0:
                entry["problem"] = f"{path} is owned by uid {st.st_uid}, not root; it is left alone (remove it by hand)"
        else:
            entry["problem"] = f"{path} is a {kind_of(st.st_mode)}, not a directory; it is left alone"
        entries.append(entry)
    return entries


def scan_kernel_caches(host: Host, root: str, root_fd: int, volumes: list[JSON]) -> list[JSON]:
    """Tensor caches moved aside (``*.ttfleet-aside-*``) in ``tt_metal_cache`` and its ``cache_<model>`` directories of
    the volumes that stay (real directories only: an alias's target is scanned as itself)."""
    found = []
    for volume in volumes:
        if volume["action"] == "remove" or volume.get("_link") or volume.get("_problem"):
            continue
        name = volume["name"]
        try:
            vfd = open_subdir(root_fd, name, root)
        except (OSError, SafeFileError):
            continue
        try:
            levels = [(TENSOR_CACHE_DIR, open_relative(vfd, TENSOR_CACHE_DIR, _join(root, name)))]
        except FileNotFoundError:
            levels = []
        except (OSError, SafeFileError) as exc:
            host.skipped.append(f"{exc}; its kernel caches are not looked at")
            levels = []
        finally:
            os.close(vfd)
        while levels:
            rel, fd = levels.pop()
            try:
                for entry in _listdir(fd):
                    st = os.lstat(entry, dir_fd=fd)
                    path = _join(root, name, rel, entry)
                    if ASIDE_INFIX in entry:
                        aside: JSON = {"name": _join(name, rel, entry), "path": path, "problem": None}
                        if not stat.S_ISDIR(st.st_mode):
                            aside["problem"] = f"{path} is a {kind_of(st.st_mode)}, not a directory; it is left alone"
                        found.append(_place(aside, root, _join(name, rel), entry, owners=(0, st.st_uid)))
                    elif rel == TENSOR_CACHE_DIR and entry.startswith(TENSOR_CACHE_PREFIX):
                        try:
                            levels.append((_join(rel, entry), open_subdir(fd, entry, _join(root, name, rel))))
                        except SafeFileError as exc:
                            host.skipped.append(f"{exc}; the kernel caches in it are not looked at")
            finally:
                os.close(fd)
    return found


def scan_staging(host: Host, root: str, root_fd: int) -> list[JSON]:
    try:
        sfd = open_subdir(root_fd, STAGING_NAME, root)
    except FileNotFoundError:
        return []
    except SafeFileError as exc:
        host.skipped.append(f"{exc}; staging is not looked at")
        return []
    where = _join(root, STAGING_NAME)
    found = []
    try:
        for name in _listdir(sfd):
            entry: JSON = {"name": name, "path": _join(where, name), "problem": None}
            try:
                check_top(sfd, name, where)
            except SafeFileError as exc:
                entry["problem"] = str(exc)
            found.append(_place(entry, root, STAGING_NAME, name))
    finally:
        os.close(sfd)
    return found


def scan_spool(host: Host, spool: str) -> list[JSON]:
    """The entries ``<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm>`` of a kernel spool; links and other files on
    the way are named in a message and never entered."""
    try:
        top = open_dir(spool)
    except FileNotFoundError:
        return []
    except (OSError, SafeFileError) as exc:
        host.skipped.append(f"spool {spool}: {exc}; it is not looked at")
        return []
    live = next(
        (s for s in host.peers if s.get("kind") == "kernels" and os.path.normpath(str(s.get("path"))) == spool), None
    )
    found = []
    stack = [("", top)]
    while stack:
        rel, fd = stack.pop()
        try:
            depth = len(rel.split("/")) if rel else 0
            for name in _listdir(fd):
                if name.startswith("."):
                    continue
                path = _join(spool, rel, name)
                st = os.lstat(name, dir_fd=fd)
                if depth + 1 == SPOOL_DEPTH:
                    parts = [*rel.split("/"), name]
                    entry: JSON = {"name": f"{spool}:{_join(rel, name)}", "path": path, "problem": None, "live": None}
                    entry["key"] = dict(zip(_KEY_FIELDS, parts, strict=True))
                    if live is not None:
                        entry["live"] = f"a live peer server (pid {live.get('pid')}) serves the spool {spool}"
                    try:
                        check_top(fd, name, _join(spool, rel))
                    except SafeFileError as exc:
                        entry["problem"] = str(exc)
                    found.append(_place(entry, spool, rel, name))
                elif stat.S_ISDIR(st.st_mode):
                    try:
                        stack.append((_join(rel, name), open_subdir(fd, name, _join(spool, rel))))
                    except SafeFileError as exc:
                        host.skipped.append(str(exc))
                else:
                    host.skipped.append(
                        f"{path} is a {kind_of(st.st_mode)} where a spool directory belongs; left alone"
                    )
        finally:
            os.close(fd)
    return found


def scan_releases(host: Host, release_root: str) -> tuple[JSON, list[JSON]]:
    found: JSON = {"markers": [], "current": "", "previous": "", "dirs": {}, "problems": {}}
    places: list[JSON] = []
    try:
        rfd = open_dir(release_root)
    except FileNotFoundError:
        return found, places
    except (OSError, SafeFileError) as exc:
        host.skipped.append(f"release_root {release_root}: {exc}; releases are not looked at")
        return found, places
    try:
        for link in ("current", "previous"):
            with contextlib.suppress(OSError):
                found[link] = os.path.basename(os.readlink(link, dir_fd=rfd).rstrip("/"))
        for sub in ("releases", "venvs"):
            try:
                sfd = open_subdir(rfd, sub, release_root)
            except FileNotFoundError:
                continue
            except SafeFileError as exc:
                host.skipped.append(f"{exc}; releases are not looked at")
                continue
            try:
                for tag in _listdir(sfd):
                    if not RELEASE_TAG.match(tag):
                        continue
                    rel = f"{sub}/{tag}"
                    path = _join(release_root, rel)
                    found["dirs"].setdefault(tag, []).append(rel)
                    places.append(_place({"path": path}, release_root, sub, tag))
                    try:
                        check_top(sfd, tag, _join(release_root, sub))
                    except SafeFileError as exc:
                        found["problems"][path] = str(exc)
                        continue
                    if sub == "releases":
                        with contextlib.suppress(OSError, SafeFileError):
                            tfd = open_subdir(sfd, tag)
                            try:
                                mst = os.lstat(MARKER, dir_fd=tfd)
                                found["markers"].append({"path": _join(path, MARKER), "mtime": mst.st_mtime})
                            finally:
                                os.close(tfd)
            finally:
                os.close(sfd)
    finally:
        os.close(rfd)
    return found, places


def scan_trash(host: Host, root: str, kinds: list[str]) -> list[JSON]:
    """What an earlier run left in ``<root>/.ttfleet-prune``: removed first (reported as resumed)."""
    try:
        with _opened(root) as rfd:
            tfd = open_trash(rfd, root, create=False)
    except FileNotFoundError:
        return []
    except (OSError, SafeFileError) as exc:
        host.skipped.append(f"{exc}; it is not emptied")
        return []
    if tfd is None:
        return []
    found = []
    try:
        for name in _listdir(tfd):
            label, original = trash_label(name)
            path = _join(root, TRASH_NAME, name)
            entry = item(label if label in KINDS else "volumes", original, path, "left by an earlier run", "remove")
            entry["note"] = "resumed"
            gate(entry, kinds)
            found.append(_place(entry, root, TRASH_NAME, name, owners=()))
            entry["_trash"] = name
    finally:
        os.close(tfd)
    return found


# ---------------------------------------------------------------------------------------------
# Sizes and removal


def _size(items: list[JSON], host: Host) -> None:
    for found in items:
        if found["action"] != "remove" and found["note"] != REPORT_ONLY:
            continue
        if found["kind"] == "images":
            continue
        root, parent, entry = found["_root"], found["_parent"], found["_entry"]
        try:
            with _opened(root) as rfd:
                pfd = open_relative(rfd, parent, root)
                try:
                    found["_usage"] = usage(pfd, entry, _where(root, parent))
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
    with _opened(root) as rfd:
        pfd = open_relative(rfd, parent, root)
        try:
            st = os.lstat(entry, dir_fd=pfd)
            if found.get("_link"):
                if not stat.S_ISLNK(st.st_mode):
                    raise SafeFileError(found["path"], "is no longer a link; it is left alone")
                os.unlink(entry, dir_fd=pfd)
                return
            check_top(pfd, entry, _where(root, parent), found["_owners"])
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
                        with _opened(found["_root"]) as rfd:
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
                host.skipped.extend(f"{_join(root, TRASH_NAME, text)}" for text in problems)
                reclaimed += freed_bytes
                kind = kinds_of.get((root, name), "volumes")
                by_kind[kind] = by_kind.get(kind, 0) + freed_bytes
                pending.extend(_join(root, TRASH_NAME, left_name) for left_name in left)
            # Gone when it is empty; an entry left for the next run keeps it.
            with contextlib.suppress(OSError), _opened(root) as rfd:
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
        with _opened(root) as rfd:
            entries = scan_volumes(host, root, rfd)
            volumes = plan_volumes(root, entries, needed, named, kinds)
            for volume, entry in zip(volumes, entries, strict=True):
                _place(volume, root, "", volume["name"])
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
