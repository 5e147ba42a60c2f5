# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Reusing a volume of another model version without sharing its kernel cache.

Private to the collection. A volume of an earlier model version holds weights the new version can reuse, but its
``tt_metal_cache`` was compiled by the ``tt_metal_commit`` of the release that made it. An alias (a symlink) would
make both releases read and write one kernel cache; when the commits differ, the expected volume is instead made a
directory of its own whose weights are hardlinks of the old volume's (zero bytes copied) and whose kernel cache
starts empty (compiled on the first start, or deployed from a kernel cache store).

``annotate_candidates`` works out which commit each candidate was made for and how to reuse it;
``plan_hardlink``/``apply_hardlink`` build the new directory, planning first so that check mode writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX, temp_name, write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import fsync_path, open_subdir, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json, read_json_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import remove_tree, walk
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import MARKER_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import ASIDE_INFIX, tensor_cache_parent
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.alias import (
    aside_name,
    check_source_root,
    is_within,
    lstat_kind,
    path_diff,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError, check_path_text

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]
    # (directory relative to the volume, its descriptor, [(name, lstat)]), as _fs.trees.walk yields them.
    Listing = tuple[str, int, list[tuple[str, os.stat_result]]]

RECORD_NAME = ".ttfleet-volume.json"
RECORD_SCHEMA = 1
# Per-release state under a volume that a new volume must not inherit: the kernel cache, logs, and the symlink
# map the container recreates on every start.
NOT_SHARED = ("tt_metal_cache", "logs", "model_file_symlinks_map")
_STAGING_PREFIXES = (".ttfleet-staging", TEMP_PREFIX)
_RECORD_MAX_BYTES = 1 << 16
# The layout of a volume (see model_weights): the volume and what it shares are root's, read-only to the container.
_DIR_MODE = 0o755
_ROOT = (0, 0)


def _read_json(path: str) -> JSON | None:
    """A small JSON object of ours, or None; a link or special file in its place is never followed or opened."""
    try:
        return read_json_path(path, limit=_RECORD_MAX_BYTES)
    except (OSError, SafeFileError):
        return None


def read_record(volume_path: str) -> JSON | None:
    """The record a hardlinked volume carries (``.ttfleet-volume.json``), or None."""
    data = _read_json(os.path.join(volume_path, RECORD_NAME))
    if data is None or data.get("schema") != RECORD_SCHEMA:
        return None
    return data


def same_commit(one: object, other: object) -> bool:
    """Whether two commit SHAs name the same commit; a short SHA (7+ hex digits) matches its full form."""
    if not one or not other:
        return False
    one, other = str(one).lower(), str(other).lower()
    shorter = min(len(one), len(other))
    return shorter >= 7 and one[:shorter] == other[:shorter]


def recorded_commit(volume_path: str, model_name: str, mesh: str | None) -> tuple[str | None, str | None]:
    """``(tt_metal_commit, evidence)`` the volume's own files record, else ``(None, None)``.

    Evidence, in order: the record of a volume this module made, then the marker a kernel cache deploy or harvest
    wrote for the mesh (any mesh when that one has none).
    """
    record = read_record(volume_path)
    if record and record.get("tt_metal_commit"):
        return record["tt_metal_commit"], os.path.join(volume_path, RECORD_NAME)
    cache_dir = os.path.join(volume_path, tensor_cache_parent(model_name))
    try:
        with opened_dir(cache_dir) as dirfd:
            with os.scandir(dirfd) as found:
                names = [entry.name for entry in found]
            names = [name for name in names if name.startswith(MARKER_PREFIX) and name.endswith(".json")]
            # The expected mesh's marker first, then the others by name.
            for name in sorted(names, key=lambda name: (name != f"{MARKER_PREFIX}{mesh}.json", name)):
                try:
                    marker = read_json(dirfd, name, _RECORD_MAX_BYTES)
                except (OSError, SafeFileError):
                    continue
                key = (marker or {}).get("key")
                if isinstance(key, dict) and key.get("tt_metal_commit"):
                    return key["tt_metal_commit"], os.path.join(cache_dir, name)
    except (OSError, SafeFileError):
        pass
    return None, None


def release_commits(
    catalogs: Iterable[Mapping[str, Any]],
    derived: Mapping[str, Any],
    iter_specs: Callable[[Mapping[str, Any]], Iterable[Mapping[str, Any]]],
) -> dict[str, tuple[str, str]]:
    """``{version: (tt_metal_commit, release)}`` of the model on the expected device in other releases' specs."""
    found: dict[str, tuple[str, str]] = {}
    for catalog in catalogs:
        release: str | None = str(catalog.get("release_version") or "")
        release = (release if release.startswith("v") else f"v{release}") if release else catalog.get("path")
        for spec in iter_specs(catalog):
            impl = spec.get("impl") or {}
            if (
                spec.get("model_name") != derived["model_name"]
                or impl.get("impl_id") != derived["impl_id"]
                or str(spec.get("device_type", "")).upper() != derived["device_type"]
                or not spec.get("tt_metal_commit")
            ):
                continue
            found.setdefault(str(spec.get("version")), (spec["tt_metal_commit"], f"the spec of release {release}"))
    return found


def _device_of(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def annotate_candidates(
    candidates: list[JSON],
    derived: Mapping[str, Any],
    root: str,
    lookup: Callable[[str], tuple[str, str] | None] | None = None,
    isolate: bool = True,
) -> list[JSON]:
    """Add to each candidate the commit its kernel cache was made for and how the expected volume reuses it.

    Keys added: ``tt_metal_commit`` and ``tt_metal_commit_from`` (evidence, or None when unknown), ``kernels``
    (``same``, ``other`` or ``unknown`` against the expected spec's commit), ``same_filesystem`` (as ``root``),
    ``reuse`` (``symlink``: alias the volume, kernel cache included; ``hardlink``: a new directory with the weights
    hardlinked and a kernel cache of its own) and ``reuse_reason``. ``lookup(version)`` returns
    ``(commit, evidence)`` from other releases' specs, or None; it is only called when the volume records nothing.

    Candidates of the spec's commit come first, in their order, then the others in theirs.

    A build label (a factory ``-vqb2_launch`` volume) whose commit is unknown is aliased: it was made for the image
    it shipped with. A version pin whose commit is unknown is not: version pins of a model move with its commits.
    """
    target = derived.get("tt_metal_commit")
    root_device = _device_of(root)
    for candidate in candidates:
        commit, evidence = recorded_commit(candidate["path"], derived["model_name"], derived.get("mesh"))
        if commit is None and lookup is not None and candidate.get("version"):
            found = lookup(candidate["version"])
            if found:
                commit, evidence = found
        candidate["tt_metal_commit"] = commit
        candidate["tt_metal_commit_from"] = evidence
        if commit and target:
            candidate["kernels"] = "same" if same_commit(commit, target) else "other"
        else:
            candidate["kernels"] = "unknown"
        candidate["same_filesystem"] = root_device is not None and _device_of(candidate["path"]) == root_device
        name = candidate.get("name") or os.path.basename(candidate["path"])
        if not isolate:
            reuse, reason = "symlink", "kernel_isolation is off"
        elif candidate["kernels"] == "same":
            reuse, reason = "symlink", f"its kernel cache is for tt_metal_commit {commit} too ({evidence})"
        elif candidate["kernels"] == "unknown" and not candidate.get("version"):
            reuse, reason = "symlink", f"{name} is a build label made for the image it shipped with"
        elif not candidate["same_filesystem"]:
            reuse = "symlink"
            reason = (
                f"{name} is on another filesystem than {root}, so its weights cannot be hardlinked; the alias shares "
                f"its kernel cache ({'tt_metal_commit ' + commit if commit else 'tt_metal_commit unknown'}) with "
                f"tt_metal_commit {target}. Move the volume under {root} to get a kernel cache of its own"
            )
        elif candidate["kernels"] == "other":
            reuse = "hardlink"
            reason = f"its kernel cache is for tt_metal_commit {commit} ({evidence}), the spec wants {target}"
        else:
            reuse = "hardlink"
            reason = f"nothing records which tt_metal_commit compiled its kernel cache; the spec wants {target}"
        candidate["reuse"], candidate["reuse_reason"] = reuse, reason
    # A volume of the same commit first (its kernel cache is warm and valid); otherwise the order stays.
    return sorted(candidates, key=lambda candidate: candidate["kernels"] != "same")


# ---------------------------------------------------------------------------
# A new volume with hardlinked weights


def _shared(rel: str, name: str) -> bool:
    """Whether entry ``name`` of shared directory ``rel`` of a volume goes into a volume hardlinked from it."""
    if not rel and name in (*NOT_SHARED, RECORD_NAME):
        return False
    return not name.startswith(_STAGING_PREFIXES)


def _walk_shared(src_fd: int, where: str = "") -> Iterator[Listing]:
    """``(directory, its descriptor, [(name, lstat)])`` of everything under ``src_fd`` that a new volume shares,
    parents before children, without following a link. Top-level directories that are not shared (the kernel
    cache can hold many thousands of files) are never walked."""
    with os.scandir(src_fd) as found:
        top = sorted((entry.name, os.lstat(entry.name, dir_fd=src_fd)) for entry in found)
    top = [(name, st) for name, st in top if _shared("", name)]
    yield "", src_fd, top
    for name, st in top:
        if not stat.S_ISDIR(st.st_mode):
            continue
        fd = open_subdir(src_fd, name, where)
        try:
            for rel, dirfd, entries in walk(fd, os.path.join(where, name)):
                if any(part.startswith(_STAGING_PREFIXES) for part in rel.split("/")):
                    continue
                rel = f"{name}/{rel}" if rel else name
                yield rel, dirfd, [(child, cst) for child, cst in entries if _shared(rel, child)]
        finally:
            os.close(fd)


def _existing_kind(path: str, src_real: str) -> str:
    """What is at ``path``: absent, link, directory, file, other, or ``made`` (a volume hardlinked from src)."""
    kind = lstat_kind(path)
    if kind == "directory" and (read_record(path) or {}).get("weights_from") == src_real:
        return "made"
    return kind


def plan_hardlink(
    path: str,
    src: str,
    tt_metal_commit: str | None = None,
    force: bool = False,
    allowed_roots: Iterable[str] | None = None,
    now: float | None = None,
) -> JSON:
    """How to make ``path`` a new volume whose files are hardlinks of ``src``'s, minus its per-release state.

    Returns a plan for ``apply_hardlink``: action none (``path`` is already such a volume of ``src``), create or
    move_aside (``force`` and something else at ``path``), files, bytes (shared, not copied), and a diff.
    """
    check_path_text(path, "path")
    check_path_text(src, "src")
    path, src = os.path.normpath(path), os.path.normpath(src)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise VolumeError(f"the directory {parent} that should hold volume {path} does not exist; create it first")
    if not os.path.isdir(src):
        raise VolumeError(f"source {src} for volume {path} is not a directory; point src at an existing volume")
    src_real = check_source_root(src, allowed_roots)
    parent_real = os.path.realpath(parent)
    node = os.path.join(parent_real, os.path.basename(path))
    if is_within(node, src_real) or is_within(src_real, node):
        raise VolumeError(f"volume {path} and its source {src} overlap; point src at another volume directory")
    if os.stat(src_real).st_dev != os.stat(parent_real).st_dev:
        raise VolumeError(
            f"{src} and {parent} are on different filesystems, so the weights cannot be hardlinked into {path}; "
            "use link: symlink, or move the source volume onto the filesystem of the volume root"
        )
    kind = _existing_kind(path, src_real)
    moved_aside = None
    if kind == "made":
        action = "none"
    elif kind == "absent":
        action = "create"
    elif not force:
        raise VolumeError(
            f"{path} is already a {kind}; refusing to replace it with a volume hardlinked from {src}. Move it away "
            f"yourself, or set force: true to rename it aside (to {path}{ASIDE_INFIX}<UTC timestamp>)"
        )
    else:
        action = "move_aside"
        moved_aside = aside_name(path, time.time() if now is None else now)
    files = size = 0
    if action != "none":
        with opened_dir(src_real) as src_fd:
            for _rel, _fd, entries in _walk_shared(src_fd, src_real):
                for _name, st in entries:
                    if stat.S_ISREG(st.st_mode):
                        files += 1
                        size += st.st_size
    after = (
        f"<directory: {files} files ({size} bytes) hardlinked from {src_real}, "
        f"an empty tt_metal_cache for tt_metal_commit {tt_metal_commit or 'unknown'}>"
    )
    if kind == "absent":
        before = "absent"
    elif kind == "made":
        before = f"<directory hardlinked from {src_real}>"
    else:
        before = f"<{kind}>"
    return {
        "path": path,
        "src": src,
        "src_real": src_real,
        "tt_metal_commit": tt_metal_commit,
        "target": None,
        "previous_target": None,
        "action": action,
        "changed": action != "none",
        "previous_state": "directory" if kind == "made" else kind,
        "moved_aside": moved_aside,
        "files": files,
        "bytes": size,
        "diff": path_diff(path, before, before if action == "none" else after),
    }


def _build(parent_fd: int, temp: str, src_fd: int, src_real: str, tt_metal_commit: str | None, now: float) -> None:
    """Fill the new directory ``temp`` in ``parent_fd`` from the volume open at ``src_fd``, on descriptors: the
    source may be writable by the container user, so no name in it is followed, and nothing of it but the
    hardlinked files' inodes reaches the new volume (directories and links are root's)."""
    os.mkdir(temp, 0o700, dir_fd=parent_fd)
    temp_fd = open_subdir(parent_fd, temp)
    try:
        dirs: dict[str, int] = {"": temp_fd}
        try:
            for rel, src_dir, entries in _walk_shared(src_fd, src_real):
                target = dirs[rel]
                for name, st in entries:
                    if stat.S_ISDIR(st.st_mode):
                        os.mkdir(name, _DIR_MODE, dir_fd=target)
                        fd = open_subdir(target, name)
                        set_attrs(fd, _DIR_MODE, _ROOT)
                        dirs[f"{rel}/{name}" if rel else name] = fd
                    elif stat.S_ISREG(st.st_mode):
                        os.link(name, name, src_dir_fd=src_dir, dst_dir_fd=target, follow_symlinks=False)
                        if not stat.S_ISREG(os.lstat(name, dir_fd=target).st_mode):
                            # Swapped for something else since it was listed: not ours to share.
                            os.unlink(name, dir_fd=target)
                    elif stat.S_ISLNK(st.st_mode):
                        os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=target)
        finally:
            for rel, fd in dirs.items():
                if rel:
                    os.close(fd)
        cache_fd = None
        with contextlib.suppress(OSError, SafeFileError):
            cache_fd = open_subdir(src_fd, "tt_metal_cache")
        try:
            # The kernel cache is the container's: it gets the owner of the source's (or of the source volume).
            cache_st = os.fstat(cache_fd if cache_fd is not None else src_fd)
        finally:
            if cache_fd is not None:
                os.close(cache_fd)
        os.mkdir("tt_metal_cache", _DIR_MODE, dir_fd=temp_fd)
        fd = open_subdir(temp_fd, "tt_metal_cache")
        try:
            set_attrs(fd, _DIR_MODE, (cache_st.st_uid, cache_st.st_gid))
        finally:
            os.close(fd)
        record: JSON = {
            "schema": RECORD_SCHEMA,
            "weights_from": src_real,
            "tt_metal_commit": tt_metal_commit,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        }
        write_json(temp_fd, RECORD_NAME, record, 0o644, _ROOT)
        set_attrs(temp_fd, _DIR_MODE, _ROOT)
    finally:
        os.close(temp_fd)


def apply_hardlink(plan: JSON, now: float | None = None) -> JSON:
    """Build the volume of a plan from ``plan_hardlink`` under a temporary name, then rename it into place."""
    if plan["action"] == "none":
        return plan
    path = plan["path"]
    parent, name = os.path.split(path)
    kind = _existing_kind(path, plan["src_real"])
    if kind != plan["previous_state"]:
        raise VolumeError(f"{path} changed while planning (was {plan['previous_state']}, now {kind}); run again")
    temp = temp_name()
    try:
        with opened_dir(parent) as parent_fd:
            try:
                with opened_dir(plan["src_real"]) as src_fd:
                    _build(
                        parent_fd,
                        temp,
                        src_fd,
                        plan["src_real"],
                        plan["tt_metal_commit"],
                        time.time() if now is None else now,
                    )
                if plan["action"] == "move_aside":
                    aside = os.path.basename(plan["moved_aside"])
                    if _exists_at(parent_fd, aside):
                        raise VolumeError(f"{plan['moved_aside']} appeared while planning; run again")
                    os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                if _exists_at(parent_fd, name):
                    raise VolumeError(f"{path} appeared while the volume was built; nothing was replaced, run again")
                os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            finally:
                # Only hardlinks, links and directories of our own are in it: removing them leaves the source intact.
                with contextlib.suppress(OSError):
                    remove_tree(parent_fd, temp)
    except (OSError, SafeFileError) as exc:
        why = exc.reason if isinstance(exc, SafeFileError) else f"{exc.strerror or exc} ({exc.filename or ''})"
        raise VolumeError(
            f"cannot build {path} from hardlinks of {plan['src_real']}: {why}; nothing of the source was changed"
        ) from None
    fsync_path(parent)
    return plan


def _exists_at(dirfd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return False
    return True
