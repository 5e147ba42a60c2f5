# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Host volumes of tt-inference-server: scanning, candidate selection, aliases.

Private to the collection. Everything here works on plain paths and dicts so
that it can be tested without Ansible. Alias changes are computed as a plan
first (``plan_alias``/``plan_absent``) and only ``apply_plan`` touches the
filesystem, which is what check mode relies on.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import json
import os
import posixpath
import re
import secrets
import stat
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._safefile import (
    SafeFileError,
    open_dir,
    open_file,
    open_relative,
    open_subdir,
    opened_dir,
    read_bytes,
    walk,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import (
    ASIDE_INFIX,
    VOLUME_PREFIX,
    match_volume_name,
    moved_aside_name,
    parse_volume_name,
    tensor_cache_parent,
    version_key,
    volume_name,
    weights_subdir,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]

MANIFEST_NAME = ".ttfleet-manifest.json"
TEMP_PREFIX = ".ttfleet-tmp-"

# The weight layouts TTIS (workflows/setup_host.py, check_model_weights_dir)
# accepts as an already completed setup, in its order: weights glob, tokenizer
# glob, params glob, tokenizer optional. Globs are relative to weights/<model>/.
WEIGHT_FORMATS = (
    ("meta", "*.pth", "tokenizer.model", "params.json", False),
    ("hf", "model*.safetensors", "tokenizer.json", "config.json", False),
    ("hf_bin", "pytorch_model*.bin", "tokenizer_config.json", "config.json", False),
    ("diffusers", "**/*.safetensors", "tokenizer.json", "model_index.json", True),
)

# Sharded checkpoints list every shard in an index; a shard missing from disk
# means an interrupted download even when the upstream rule above passes.
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_INDEX_MAX_BYTES = 16 << 20
_MANIFEST_MAX_BYTES = 1 << 20

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_MAX_LINK_HOPS = 40


class VolumeError(Exception):
    """A request that cannot be carried out safely; the message says why and how to fix it."""


# ---------------------------------------------------------------------------
# Path checks


def check_path_text(value: object, what: str) -> str:
    """Return ``value`` if it is a usable absolute path string, else raise VolumeError.

    Runs before any filesystem call: NUL and control characters, text that is
    not valid UTF-8 and relative paths are refused.
    """
    if not isinstance(value, str) or not value:
        raise VolumeError(f"{what} must be a non-empty path, got {value!r}")
    if _CONTROL_RE.search(value):
        raise VolumeError(f"{what} {value!r} contains NUL or control characters; pass a plain path")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise VolumeError(f"{what} {value!r} is not valid UTF-8") from None
    if not os.path.isabs(value):
        raise VolumeError(f"{what} {value!r} must be an absolute path")
    return value


def _name_is_clean(name: str) -> bool:
    if _CONTROL_RE.search(name):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---------------------------------------------------------------------------
# Contents of one volume


def _names(dirfd: int) -> list[str]:
    try:
        return os.listdir(dirfd)
    except OSError:
        return []


def _any_below(dirfd: int, pattern: str) -> bool:
    # Upstream's "**" (Path.glob) matches at every depth and does not descend into symlinked directories;
    # walk() never follows a link either.
    for _rel, _fd, entries in walk(dirfd, onerror=lambda _exc: None):
        if any(fnmatch.fnmatchcase(name, pattern) for name, _st in entries):
            return True
    return False


def _first_match(dirfd: int, names: list[str], pattern: str) -> bool:
    if pattern.startswith("**/"):
        return _any_below(dirfd, pattern[3:])
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def _shard_present(dirfd: int, shard: str) -> bool:
    """Whether ``shard`` (relative, from an index) is a file below ``dirfd``, without following a link on the way.
    The shard itself may be a link (older Hugging Face downloads link shards into the hub cache): it is stat'ed,
    never opened."""
    parent, name = posixpath.split(shard)
    try:
        fd = open_relative(dirfd, parent) if parent else os.dup(dirfd)
    except (OSError, SafeFileError):
        return False
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=fd).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def _missing_shards(dirfd: int, where: str, problems: list[str]) -> tuple[list[str], bool]:
    """``(missing shards, checked)``: shards named by a checkpoint index that are absent; ``checked`` is False when
    an index is a link or a special file (it is never opened), which makes the weights unusable."""
    missing: set[str] = set()
    checked = True
    for index_name in SHARD_INDEXES:
        try:
            fd, st = open_file(dirfd, index_name, where=where)
        except FileNotFoundError:
            continue
        except SafeFileError as exc:
            problems.append(f"{exc}; the shards it lists cannot be checked, so the weights count as unusable")
            checked = False
            continue
        except OSError as exc:
            problems.append(f"cannot read {os.path.join(where, index_name)}: {exc.strerror or exc}")
            continue
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(_INDEX_MAX_BYTES + 1) if st.st_size <= _INDEX_MAX_BYTES else None
        try:
            if raw is None or len(raw) > _INDEX_MAX_BYTES:
                raise ValueError(f"larger than {_INDEX_MAX_BYTES} bytes")
            weight_map = json.loads(raw.decode("utf-8")).get("weight_map") or {}
        except (ValueError, AttributeError, RecursionError) as exc:
            # As before: a broken index does not decide completeness, the upstream rule does.
            problems.append(f"{os.path.join(where, index_name)} was ignored: {exc}")
            continue
        if not isinstance(weight_map, dict):
            continue
        for shard in set(weight_map.values()):
            if not isinstance(shard, str) or not shard or os.path.isabs(shard) or ".." in shard.split("/"):
                continue
            if not _shard_present(dirfd, shard):
                missing.add(shard)
    return sorted(missing), checked


def _weights_status_fd(dirfd: int, weights_dir: str, problems: list[str]) -> JSON:
    status: JSON = {"path": weights_dir, "complete": False, "format": None, "missing_shards": [], "usable": False}
    names = _names(dirfd)
    for fmt_name, weights_glob, tokenizer_glob, params_glob, tokenizer_optional in WEIGHT_FORMATS:
        if (
            _first_match(dirfd, names, weights_glob)
            and (tokenizer_optional or _first_match(dirfd, names, tokenizer_glob))
            and _first_match(dirfd, names, params_glob)
        ):
            status["complete"] = True
            status["format"] = fmt_name
            break
    if status["complete"]:
        status["missing_shards"], checked = _missing_shards(dirfd, weights_dir, problems)
        status["usable"] = checked and not status["missing_shards"]
    return status


def _absent_weights(weights_dir: str) -> JSON:
    return {"path": weights_dir, "complete": False, "format": None, "missing_shards": [], "usable": False}


def weights_status(weights_dir: str) -> JSON:
    """Describe ``weights/<model_name>/`` of a volume.

    ``complete`` is exactly the upstream rule (some weights file, a tokenizer
    unless optional, and the params file, for any accepted format), ``format``
    names the first format that matched, ``missing_shards`` lists shards named
    by a checkpoint index that are absent, and ``usable`` is complete with no
    missing shard. ``volume_contents`` also says why something could not be read.
    """
    try:
        with opened_dir(weights_dir) as dirfd:
            return _weights_status_fd(dirfd, weights_dir, [])
    except (OSError, SafeFileError):
        return _absent_weights(weights_dir)


def _meshes_fd(volume_fd: int, model_name: str, where: str, problems: list[str]) -> list[str]:
    meshes: list[str] = []
    try:
        cache_fd = open_relative(volume_fd, tensor_cache_parent(model_name), where=where)
    except FileNotFoundError:
        return meshes
    except (OSError, SafeFileError) as exc:
        problems.append(f"tensor cache not inspected: {exc}")
        return meshes
    try:
        for name in sorted(_names(cache_fd)):
            try:
                mesh_fd = open_subdir(cache_fd, name)
            except (OSError, SafeFileError):
                # Files and links beside the mesh directories are not meshes.
                continue
            try:
                if _names(mesh_fd):
                    meshes.append(name)
            finally:
                os.close(mesh_fd)
    finally:
        os.close(cache_fd)
    return meshes


def tensor_cache_meshes(volume_path: str, model_name: str) -> list[str]:
    """Mesh directories under ``tt_metal_cache/cache_<model_name>/`` that hold anything."""
    try:
        with opened_dir(volume_path) as dirfd:
            return _meshes_fd(dirfd, model_name, volume_path, [])
    except (OSError, SafeFileError):
        return []


def _manifest_fd(dirfd: int, weights_path: str) -> JSON:
    result: JSON = {"path": os.path.join(weights_path, MANIFEST_NAME), "present": False, "data": None, "error": None}
    try:
        os.lstat(MANIFEST_NAME, dir_fd=dirfd)
    except OSError:
        return result
    result["present"] = True
    try:
        data = read_bytes(dirfd, MANIFEST_NAME, _MANIFEST_MAX_BYTES, where=weights_path)
        result["data"] = json.loads(data.decode("utf-8")) if data is not None else None
    except SafeFileError as exc:
        result["error"] = exc.reason
    except (OSError, ValueError, RecursionError) as exc:
        result["error"] = str(exc)
    return result


def read_manifest(weights_path: str) -> JSON:
    """Presence and content of the manifest that ttfleet.inference.model_weights writes beside the weights."""
    try:
        with opened_dir(weights_path) as dirfd:
            return _manifest_fd(dirfd, weights_path)
    except (OSError, SafeFileError):
        return {"path": os.path.join(weights_path, MANIFEST_NAME), "present": False, "data": None, "error": None}


def volume_contents(path: str, model_name: str) -> JSON:
    """Weights status, tensor cache meshes and weights manifest of the volume ``path`` of ``model_name``.

    The volume's own link (an alias made by volume_alias) is resolved; below it nothing is followed: a link or a
    special file where a directory, an index or the manifest belongs is reported in ``problems`` (never opened,
    so a FIFO cannot block)."""
    weights_dir = os.path.join(path, weights_subdir(model_name))
    result: JSON = {
        "weights": _absent_weights(weights_dir),
        "tensor_cache_meshes": [],
        "manifest": {"path": os.path.join(weights_dir, MANIFEST_NAME), "present": False, "data": None, "error": None},
        "problems": [],
    }
    problems = result["problems"]
    try:
        volume_fd = open_dir(os.path.realpath(path))
    except (OSError, SafeFileError) as exc:
        problems.append(f"cannot open the volume: {exc}")
        return result
    try:
        try:
            weights_fd: int | None = open_relative(volume_fd, weights_subdir(model_name), where=path)
        except FileNotFoundError:
            weights_fd = None
        except (OSError, SafeFileError) as exc:
            problems.append(f"weights not inspected: {exc}")
            weights_fd = None
        if weights_fd is not None:
            try:
                result["weights"] = _weights_status_fd(weights_fd, weights_dir, problems)
                result["manifest"] = _manifest_fd(weights_fd, weights_dir)
            finally:
                os.close(weights_fd)
        result["tensor_cache_meshes"] = _meshes_fd(volume_fd, model_name, path, problems)
    finally:
        os.close(volume_fd)
    if result["manifest"]["error"]:
        problems.append(f"{result['manifest']['path']}: {result['manifest']['error']}")
    return result


def tree_size(path: str) -> tuple[int, int, bool]:
    """du-like totals for a tree, never following symlinks, hard links counted once.

    Returns ``(apparent_bytes, disk_bytes, complete)``; ``complete`` is False
    when some part could not be read.
    """
    try:
        top = os.lstat(path)
    except OSError:
        return 0, 0, False
    apparent = top.st_size
    disk = top.st_blocks * 512
    if not stat.S_ISDIR(top.st_mode):
        return apparent, disk, True
    complete = True
    seen: set[tuple[int, int]] = set()

    def incomplete(_exc: BaseException) -> None:
        nonlocal complete
        complete = False

    try:
        with opened_dir(path) as dirfd:
            for _rel, _fd, entries in walk(dirfd, path, onerror=incomplete):
                for _name, st in entries:
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    apparent += st.st_size
                    disk += st.st_blocks * 512
    except (OSError, SafeFileError):
        complete = False
    return apparent, disk, complete


def _file_type(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def describe_volume(path: str, model_name: str | None = None, sizes: bool = False) -> JSON:
    """Everything volume_facts reports about one ``volume_id_*`` entry.

    ``model_name`` overrides the name parsed from the entry (weights and
    tensor cache directories are named after the model).
    """
    name = os.path.basename(path)
    info: JSON = {"name": name, "path": path, "root": os.path.dirname(path)}
    info.update(parse_volume_name(name))
    if model_name is not None:
        info["model_name"] = model_name
    lst = os.lstat(path)
    info["type"] = _file_type(lst.st_mode)
    info["is_link"] = info["type"] == "link"
    info["link_target"] = os.readlink(path) if info["is_link"] else None
    info["realpath"] = os.path.realpath(path)
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError:
        st = None
    info["exists"] = st is not None and stat.S_ISDIR(st.st_mode)
    info["uid"] = st.st_uid if st is not None else lst.st_uid
    info["gid"] = st.st_gid if st is not None else lst.st_gid
    info["mtime"] = st.st_mtime if st is not None else lst.st_mtime
    model = info["model_name"]
    if info["exists"] and model:
        info.update(volume_contents(path, model))
    else:
        weights_dir = os.path.join(path, weights_subdir(model or ""))
        info["weights"] = _absent_weights(weights_dir)
        info["tensor_cache_meshes"] = []
        info["manifest"] = {
            "path": os.path.join(weights_dir, MANIFEST_NAME),
            "present": False,
            "data": None,
            "error": None,
        }
        info["problems"] = []
    if sizes:
        if info["exists"]:
            apparent, disk, complete = tree_size(info["realpath"])
        else:
            apparent, disk, complete = 0, 0, False
        info["size_bytes"] = apparent
        info["disk_usage_bytes"] = disk
        info["size_complete"] = complete
    return info


# ---------------------------------------------------------------------------
# Roots


def expand_roots(patterns: Iterable[str | None]) -> list[str]:
    """Expand ``~`` and globs; keep existing directories once each (by realpath), in order."""
    roots: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if not pattern:
            continue
        expanded = os.path.expanduser(pattern)
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        for match in matches:
            match = os.path.normpath(os.path.abspath(match))
            if not os.path.isdir(match):
                continue
            real = os.path.realpath(match)
            if real in seen:
                continue
            seen.add(real)
            roots.append(match)
    return roots


def scan_root(root: str, sizes: bool = False) -> tuple[list[JSON], list[str]]:
    """Describe every ``volume_id_*`` entry directly under ``root``.

    Returns ``(volumes, warnings)``. Entries whose names hold control
    characters or bytes that are not UTF-8 are skipped with a warning.
    """
    volumes: list[JSON] = []
    warnings: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return volumes, warnings
    except OSError as exc:
        warnings.append(f"cannot list volume root {root}: {exc.strerror or exc}")
        return volumes, warnings
    for name in names:
        if not name.startswith(VOLUME_PREFIX):
            continue
        if not _name_is_clean(name):
            warnings.append(f"skipped an entry under {root} with an unusable name: {name!a}")
            continue
        try:
            volumes.append(describe_volume(os.path.join(root, name), sizes=sizes))
        except OSError as exc:
            warnings.append(f"cannot inspect {os.path.join(root, name)}: {exc.strerror or exc}")
    return volumes, warnings


def scan_roots(roots: Iterable[str], sizes: bool = False) -> tuple[list[JSON], list[str]]:
    """``scan_root`` over several roots; returns ``(volumes, warnings)``."""
    volumes = []
    warnings = []
    for root in roots:
        found, warned = scan_root(root, sizes=sizes)
        volumes.extend(found)
        warnings.extend(warned)
    return volumes, warnings


# ---------------------------------------------------------------------------
# Expected volume and alias candidates


def expected_volume(
    root: str, derived: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]] = (), sizes: bool = False
) -> JSON:
    """The volume the spec expects under ``root``.

    ``derived`` is the spec resolution: it needs ``impl_id``, ``model_name``
    and ``version``, and may carry ``volume_name`` and ``mesh``.
    """
    root = os.path.normpath(root)
    name = derived.get("volume_name") or volume_name(derived["impl_id"], derived["model_name"], derived["version"])
    path = os.path.join(root, name)
    for volume in volumes:
        if volume["path"] == path:
            entry: JSON = dict(volume)
            break
    else:
        try:
            entry = describe_volume(path, model_name=derived["model_name"], sizes=sizes)
        except FileNotFoundError:
            entry = {
                "name": name,
                "path": path,
                "root": root,
                "type": "absent",
                "is_link": False,
                "link_target": None,
                "realpath": None,
                "exists": False,
                "problems": [],
            }
    entry["is_alias"] = entry["type"] == "link"
    entry["mesh"] = derived.get("mesh")
    entry["tensor_cache_for_mesh"] = bool(
        derived.get("mesh") and derived.get("mesh") in entry.get("tensor_cache_meshes", ())
    )
    return entry


def _candidate_sort_key(candidate: Mapping[str, Any]) -> tuple[bool, bool, tuple[int, ...], float, bool, str]:
    vkey = version_key(candidate["version"])
    return (
        not candidate["tensor_cache_for_mesh"],
        vkey is None,
        tuple(-part for part in vkey) if vkey else (),
        -candidate["mtime"],
        candidate["is_link"],
        candidate["path"],
    )


def select_candidates(
    volumes: Iterable[Mapping[str, Any]], derived: Mapping[str, Any], expected: Mapping[str, Any]
) -> list[JSON]:
    """Volumes the expected name could be aliased to, best first.

    A candidate has the expected impl_id and model name (another version, a
    build label, or the expected name under another root), is a directory or a
    link to one with usable weights, and is not already what the expected path
    resolves to. Entries resolving to the same directory count once, the real
    directory preferred over links to it. Order: tensor cache for the expected
    mesh first, then versions before build labels and higher versions first,
    then newest mtime, then real directories before links.
    """
    impl_id = derived["impl_id"]
    model_name = derived["model_name"]
    mesh = derived.get("mesh")
    expected_real = expected.get("realpath") if expected.get("exists") else None
    chosen: dict[str, JSON] = {}
    for volume in volumes:
        if volume["path"] == expected["path"]:
            continue
        matched = match_volume_name(volume["name"], impl_id, model_name)
        if matched is None or not volume["exists"]:
            continue
        candidate: JSON = dict(volume)
        if candidate["model_name"] != model_name:
            # The generic parse split a label holding "-v" differently.
            candidate = describe_volume(volume["path"], model_name=model_name, sizes="size_bytes" in volume)
        candidate["impl_id"] = impl_id
        candidate["version"], candidate["label"] = matched
        if not candidate["weights"]["usable"]:
            continue
        if expected_real is not None and candidate["realpath"] == expected_real:
            continue
        candidate["tensor_cache_for_mesh"] = bool(mesh and mesh in candidate["tensor_cache_meshes"])
        previous = chosen.get(candidate["realpath"])
        if previous is None or (previous["is_link"] and not candidate["is_link"]):
            chosen[candidate["realpath"]] = candidate
    return sorted(chosen.values(), key=_candidate_sort_key)


# ---------------------------------------------------------------------------
# Aliases


def lstat_kind(path: str) -> str:
    try:
        return _file_type(os.lstat(path).st_mode)
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        raise VolumeError(f"a component of {path} is not a directory") from None
    except OSError as exc:
        raise VolumeError(f"cannot inspect {path}: {exc.strerror or exc}") from None


def _passes_through(path: str, node: str) -> bool:
    """True if resolving ``path`` visits ``node`` (a path with resolved parents), or loops."""
    pending = [part for part in path.split("/") if part][::-1]
    current = "/"
    hops = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if candidate == node:
            return True
        if os.path.islink(candidate):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return True
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(part for part in target.split("/")[::-1] if part)
        else:
            current = candidate
    return False


def is_within(path: str, root: str) -> bool:
    return path == root or os.path.commonpath([path, root]) == root


def check_source_root(src: str, allowed_roots: Iterable[str] | None) -> str:
    """The real path of ``src``; raises VolumeError when ``allowed_roots`` is set and it resolves outside them."""
    roots = [check_path_text(root, "allowed_roots entry") for root in (allowed_roots or [])]
    src_real = os.path.realpath(src)
    if roots and not any(is_within(src_real, os.path.realpath(root)) for root in roots):
        raise VolumeError(
            f"source {src} (resolving to {src_real}) is outside allowed_roots {roots}; "
            "pick a source under one of them or add its root to allowed_roots"
        )
    return src_real


def _state_text(kind: str, link_target: str | None) -> str | None:
    if kind == "link":
        return link_target
    if kind == "absent":
        return "absent"
    return f"<{kind}>"


def aside_name(path: str, now: float) -> str:
    base = moved_aside_name(path, now)
    candidate = base
    counter = 1
    while os.path.lexists(candidate):
        candidate = f"{base}-{counter}"
        counter += 1
    return candidate


def path_diff(path: str, before: str | None, after: str | None) -> dict[str, str]:
    return {"before_header": path, "after_header": path, "before": f"{before}\n", "after": f"{after}\n"}


def plan_alias(
    path: str,
    src: str,
    force: bool = False,
    relative: bool = True,
    allowed_roots: Iterable[str] | None = None,
    now: float | None = None,
) -> JSON:
    """Compute how to make ``path`` a symlink to the directory ``src``; touches nothing.

    Returns a plan dict for ``apply_plan``: ``action`` is one of none, create,
    replace, move_aside; plus path, src, target (the link text), previous_state
    (absent, link, directory, file, other), previous_target, moved_aside, changed
    and diff. Raises VolumeError for every request that is refused.
    """
    check_path_text(path, "path")
    check_path_text(src, "src")
    roots = [check_path_text(root, "allowed_roots entry") for root in (allowed_roots or [])]
    path = os.path.normpath(path)
    src = os.path.normpath(src)
    parent = os.path.dirname(path)
    if not os.path.basename(path):
        raise VolumeError(f"path {path!r} names no directory entry; give the alias's full path")
    if not os.path.isdir(parent):
        raise VolumeError(
            f"the directory {parent} that should hold alias {path} does not exist; create the volume root first"
        )

    if not os.path.isdir(src):
        if os.path.islink(src):
            problem = "is a dangling symlink"
        elif os.path.lexists(src):
            problem = "is not a directory"
        else:
            problem = "does not exist"
        raise VolumeError(f"source {src} for alias {path} {problem}; point src at an existing volume directory")
    src_real = check_source_root(src, roots)

    parent_real = os.path.realpath(parent)
    node = os.path.join(parent_real, os.path.basename(path))
    if _passes_through(src, node):
        loop: str | None = f"{src} resolves through {path}"
    elif is_within(parent_real, src_real):
        loop = f"{src} contains {path}"
    else:
        loop = None
    if loop:
        raise VolumeError(
            f"alias {path} -> {src} would create a loop ({loop}); point src at a volume directory "
            "that is neither the alias, inside it, nor one of its parents"
        )

    if relative:
        src_physical = os.path.join(os.path.realpath(os.path.dirname(src)), os.path.basename(src))
        target = os.path.relpath(src_physical, parent_real)
    else:
        target = src

    kind = lstat_kind(path)
    previous_target = os.readlink(path) if kind == "link" else None
    moved_aside = None
    if kind == "absent":
        action = "create"
    elif kind == "link":
        action = "none" if previous_target == target else "replace"
    elif not force:
        raise VolumeError(
            f"{path} is a real {kind}, not a symlink; refusing to replace it with an alias to {src}. "
            f"Move {path} away yourself, or set force: true to rename it aside "
            f"(to {path}{ASIDE_INFIX}<UTC timestamp>) before linking"
        )
    else:
        action = "move_aside"
        moved_aside = aside_name(path, time.time() if now is None else now)

    return {
        "state": "present",
        "path": path,
        "src": src,
        "target": target,
        "action": action,
        "changed": action != "none",
        "previous_state": kind,
        "previous_target": previous_target,
        "moved_aside": moved_aside,
        "diff": path_diff(path, _state_text(kind, previous_target), target),
    }


def plan_absent(path: str) -> JSON:
    """Compute how to remove the alias ``path``; only symlinks are ever removed."""
    check_path_text(path, "path")
    path = os.path.normpath(path)
    kind = lstat_kind(path)
    if kind not in ("absent", "link"):
        raise VolumeError(
            f"{path} is a real {kind}, not a symlink; state: absent removes only aliases and "
            "left it untouched. Remove or move it yourself if it is no longer needed"
        )
    previous_target = os.readlink(path) if kind == "link" else None
    action = "remove" if kind == "link" else "none"
    return {
        "state": "absent",
        "path": path,
        "src": None,
        "target": None,
        "action": action,
        "changed": action != "none",
        "previous_state": kind,
        "previous_target": previous_target,
        "moved_aside": None,
        "diff": path_diff(path, _state_text(kind, previous_target), "absent"),
    }


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _replace_with_symlink(target: str, path: str) -> None:
    parent = os.path.dirname(path)
    for _attempt in range(100):
        temp = os.path.join(parent, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        try:
            os.symlink(target, temp)
            break
        except FileExistsError:
            continue
    else:
        raise VolumeError(f"cannot create a temporary link in {parent}")
    try:
        kind = lstat_kind(path)
        if kind not in ("absent", "link"):
            raise VolumeError(f"{path} became a real {kind} while linking; nothing was replaced")
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def apply_plan(plan: JSON) -> JSON:
    """Carry out a plan from ``plan_alias``/``plan_absent``; re-checks the state it relies on."""
    action = plan["action"]
    path = plan["path"]
    if action == "none":
        return plan
    kind = lstat_kind(path)
    if kind != plan["previous_state"]:
        raise VolumeError(f"{path} changed while planning (was {plan['previous_state']}, now {kind}); run again")
    try:
        if action == "remove":
            os.unlink(path)
        else:
            if action == "move_aside":
                if os.path.lexists(plan["moved_aside"]):
                    raise VolumeError(f"{plan['moved_aside']} appeared while planning; run again")
                os.rename(path, plan["moved_aside"])
            _replace_with_symlink(plan["target"], path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise VolumeError(f"a name derived from {path} is too long for the filesystem") from None
        raise VolumeError(f"cannot {action.replace('_', ' ')} {path}: {exc.strerror or exc}") from None
    fsync_dir(os.path.dirname(path))
    return plan
