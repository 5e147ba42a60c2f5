# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What one volume holds: the weights (complete and usable by the upstream rule and the shard indexes), the tensor
cache meshes and the weights manifest, read below the volume without following a link; and a tree's size."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import (
    open_dir,
    open_relative,
    open_subdir,
    opened_dir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file, read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import walk
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import tensor_cache_parent, weights_subdir

if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]

MANIFEST_NAME = ".ttfleet-manifest.json"

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


def absent_weights(weights_dir: str) -> JSON:
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
        return absent_weights(weights_dir)


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
        "weights": absent_weights(weights_dir),
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
