# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""disk_prune's scan of the host: the volume root, the kernel caches moved aside in it, stale staging, the spools,
the release root, the trash an earlier run left, and what the Docker engine and the live peer servers hold.

Every path is opened relative to a directory descriptor without following a link; what is unsafe is recorded as a
``problem`` that ``_plan/prune.py`` turns into a message naming the path. Removal is ``_plan/prune_host.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import (
    open_dir,
    open_relative,
    open_subdir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, kind_of
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.reclaim import (
    TRASH_NAME,
    check_top,
    open_trash,
    trash_label,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import (
    KINDS,
    gate,
    item,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.releases import MARKER, RELEASE_TAG
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    ASIDE_INFIX,
    TENSOR_CACHE_DIR,
    TENSOR_CACHE_PREFIX,
    VOLUME_PREFIX,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import name_is_clean
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import STAGING_NAME

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    JSON = dict[str, Any]

SPOOL_DEPTH = 5  # <model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm_commit>
_KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")


def list_names(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return sorted(entry.name for entry in entries)


def join_path(*parts: str) -> str:
    return "/".join(part.rstrip("/") for part in parts if part)


def where_of(root: str, parent: str) -> str:
    return join_path(root, parent) if parent else root


@contextlib.contextmanager
def opened_root(path: str) -> Iterator[int]:
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


def place_entry(found: JSON, root: str, parent: str, entry: str, owners: tuple[int, ...] = (0,)) -> JSON:
    found.update(_root=root, _parent=parent, _entry=entry, _owners=owners)
    return found


def scan_volumes(host: Host, root: str, root_fd: int) -> list[JSON]:
    entries = []
    for name in list_names(root_fd):
        if not name.startswith(VOLUME_PREFIX):
            continue
        path = join_path(root, name)
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
            levels = [(TENSOR_CACHE_DIR, open_relative(vfd, TENSOR_CACHE_DIR, join_path(root, name)))]
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
                for entry in list_names(fd):
                    st = os.lstat(entry, dir_fd=fd)
                    path = join_path(root, name, rel, entry)
                    if ASIDE_INFIX in entry:
                        aside: JSON = {"name": join_path(name, rel, entry), "path": path, "problem": None}
                        if not stat.S_ISDIR(st.st_mode):
                            aside["problem"] = f"{path} is a {kind_of(st.st_mode)}, not a directory; it is left alone"
                        found.append(place_entry(aside, root, join_path(name, rel), entry, owners=(0, st.st_uid)))
                    elif rel == TENSOR_CACHE_DIR and entry.startswith(TENSOR_CACHE_PREFIX):
                        try:
                            levels.append((join_path(rel, entry), open_subdir(fd, entry, join_path(root, name, rel))))
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
    where = join_path(root, STAGING_NAME)
    found = []
    try:
        for name in list_names(sfd):
            entry: JSON = {"name": name, "path": join_path(where, name), "problem": None}
            try:
                check_top(sfd, name, where)
            except SafeFileError as exc:
                entry["problem"] = str(exc)
            found.append(place_entry(entry, root, STAGING_NAME, name))
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
            for name in list_names(fd):
                if name.startswith("."):
                    continue
                path = join_path(spool, rel, name)
                st = os.lstat(name, dir_fd=fd)
                if depth + 1 == SPOOL_DEPTH:
                    parts = [*rel.split("/"), name]
                    entry: JSON = {"name": f"{spool}:{join_path(rel, name)}", "path": path, "problem": None}
                    entry["live"] = None
                    entry["key"] = dict(zip(_KEY_FIELDS, parts, strict=True))
                    if live is not None:
                        entry["live"] = f"a live peer server (pid {live.get('pid')}) serves the spool {spool}"
                    try:
                        check_top(fd, name, join_path(spool, rel))
                    except SafeFileError as exc:
                        entry["problem"] = str(exc)
                    found.append(place_entry(entry, spool, rel, name))
                elif stat.S_ISDIR(st.st_mode):
                    try:
                        stack.append((join_path(rel, name), open_subdir(fd, name, join_path(spool, rel))))
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
                for tag in list_names(sfd):
                    if not RELEASE_TAG.match(tag):
                        continue
                    rel = f"{sub}/{tag}"
                    path = join_path(release_root, rel)
                    found["dirs"].setdefault(tag, []).append(rel)
                    places.append(place_entry({"path": path}, release_root, sub, tag))
                    try:
                        check_top(sfd, tag, join_path(release_root, sub))
                    except SafeFileError as exc:
                        found["problems"][path] = str(exc)
                        continue
                    if sub == "releases":
                        with contextlib.suppress(OSError, SafeFileError):
                            tfd = open_subdir(sfd, tag)
                            try:
                                mst = os.lstat(MARKER, dir_fd=tfd)
                                found["markers"].append({"path": join_path(path, MARKER), "mtime": mst.st_mtime})
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
        with opened_root(root) as rfd:
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
        for name in list_names(tfd):
            label, original = trash_label(name)
            path = join_path(root, TRASH_NAME, name)
            entry = item(label if label in KINDS else "volumes", original, path, "left by an earlier run", "remove")
            entry["note"] = "resumed"
            gate(entry, kinds)
            found.append(place_entry(entry, root, TRASH_NAME, name, owners=()))
            entry["_trash"] = name
    finally:
        os.close(tfd)
    return found


# ---------------------------------------------------------------------------------------------
# Sizes and removal
