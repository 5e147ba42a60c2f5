# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The kernel cache in place on this host: its directories, the marker that records where it came from, and
what a deploy would find there (inspect).

``tt_metal_cache/`` and everything below it belong to the container UID, which is often a login user:
every path there is hostile. All of it goes through module_utils._fs, relative to directory
descriptors: no link is followed, no special file is opened, new names are random and created
exclusively, ownership is set on descriptors.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX, write_atomic
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path, open_dir, open_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, kind_of
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import remove_tree
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    FILE_MODE,
    MANIFEST_MAX,
    KernelError,
    cache_parent,
    cache_path,
    check_key,
    key_mismatch,
    key_text,
    marker_name,
    marker_path,
    mismatch_text,
    refusal,
    refusing,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import json_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key, Owner


def open_parent(volume: str, key: Key, create: bool = False, owner: Owner | None = None) -> int | None:
    """A descriptor of ``cache_<model_name>`` of the volume; None when it does not exist and ``create`` is off.

    Created, a missing volume is root-owned (the volume itself is never given to the container UID) while
    ``tt_metal_cache`` and ``cache_<model_name>`` get ``owner``: the server writes its kernels there."""
    path = cache_parent(volume, key)
    try:
        if not create:
            return open_dir(path)
        os.close(make_path(volume))
        return make_path(path, owner=owner)
    except FileNotFoundError:
        if create:
            raise
        return None
    except SafeFileError as exc:
        raise refusal(
            exc, f"make {exc.path} a real directory; kernel caches never go through a link that a user can plant"
        ) from None


def open_cache(parent_fd: int | None, name: str, path: str) -> int | None:
    """A descriptor of the cache directory ``name`` in ``parent_fd`` (None when it is missing); anything but a
    directory there, a link included, is refused."""
    if parent_fd is None:
        return None
    try:
        return open_subdir(parent_fd, name)
    except FileNotFoundError:
        return None
    except SafeFileError:
        kind = kind_of(os.lstat(name, dir_fd=parent_fd).st_mode)
        raise KernelError(
            f"{path} exists but is not a directory; move it away so the kernel cache can go there (it is a {kind}; "
            "links are never followed)"
        ) from None


def clear_leftovers(parent_fd: int, mesh: str) -> list[str]:
    """Remove the staging directories of an interrupted deploy of ``mesh`` (ours: TEMP_PREFIX + mesh) from
    ``parent_fd``, never following a link in them."""
    prefix = f"{TEMP_PREFIX}{mesh}-"
    with os.scandir(parent_fd) as entries:
        names = sorted(entry.name for entry in entries if entry.name.startswith(prefix))
    for name in names:
        with contextlib.suppress(OSError, SafeFileError):
            remove_tree(parent_fd, name)
    return names


def read_marker(parent_fd: int | None, volume: str, key: Key) -> tuple[str, JSON | None]:
    """``(path, data)`` of the marker of ``key``; data is None when there is none. A link, FIFO or other special
    file in its place is refused at once (never opened blocking)."""
    path = marker_path(volume, key)
    if parent_fd is None:
        return path, None
    fix = "remove it (it only records where the cache came from) and run again"
    try:
        data = read_json(parent_fd, marker_name(key), MANIFEST_MAX, where=os.path.dirname(path))
    except SafeFileError as exc:
        raise refusal(exc, fix) from None
    if data is not None and not isinstance(data.get("key"), dict):
        raise KernelError(f"{path} has no key; {fix}")
    return path, data


def write_marker(parent_fd: int, key: Key, data: JSON, owner: Owner | None) -> None:
    """Replace the marker through a random O_EXCL temporary name; owner and mode are set on its descriptor."""
    write_atomic(parent_fd, marker_name(key), json_bytes(data), FILE_MODE, owner)


def dir_state(parent_fd: int | None, name: str, path: str) -> str:
    """``absent``, ``empty`` or ``nonempty`` for the cache directory ``name`` in ``parent_fd`` (None: absent);
    anything but a directory there is an error."""
    fd = open_cache(parent_fd, name, path)
    if fd is None:
        return "absent"
    try:
        with os.scandir(fd) as entries:
            return "nonempty" if next(entries, None) is not None else "empty"
    finally:
        os.close(fd)


@refusing
def local_state(options: Mapping[str, Any]) -> JSON:
    """What is at the cache path of the key: ``{"path", "marker_file", "kind", "in_place", "aside", "reason"}``.

    ``in_place``: a cache deployed or harvested with this key is there. ``aside``: the cache in the way that a
    deploy moves aside first (only with ``force``). ``reason`` is set when a deploy has nothing to do. A cache
    recorded for another key is refused without ``force``.
    """
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    where = f"{host}:{path}"
    parent_fd = open_parent(volume, key)
    try:
        marker_file, marker = read_marker(parent_fd, volume, key)
        # Only whether something is there: a converged host must not walk a cache of tens of thousands of files.
        kind = dir_state(parent_fd, key["mesh"], path)
    finally:
        if parent_fd is not None:
            os.close(parent_fd)
    state: JSON = {
        "path": path,
        "marker_file": marker_file,
        "kind": kind,
        "in_place": False,
        "aside": None,
        "reason": None,
    }
    if kind != "nonempty":
        return state
    if marker is not None and not key_mismatch(marker["key"], key):
        state["in_place"] = True
        state["reason"] = f"{where} already holds {key_text(key)} ({marker.get('source')}, {marker.get('at')})"
    elif marker is not None:
        text = mismatch_text(f"the kernel cache {where} (recorded in {marker_file})", marker["key"], key)
        if not options.get("force"):
            raise KernelError(
                f"{text}. Fix: set force: true to move it aside and deploy {key_text(key)}, or serve the spec "
                "it was built for"
            )
        state["aside"] = path
    elif not options.get("force"):
        state["reason"] = (
            f"{where} holds a kernel cache that no store deployed (compiled here or preseeded); it is left as "
            "it is. Set force: true to move it aside and deploy from the store"
        )
    else:
        state["aside"] = path
    return state


def inspect(options: Mapping[str, Any]) -> JSON:
    """Read-only: whether a deploy of the key would change anything, without asking a store."""
    key = check_key(options)
    state = local_state(options)
    return {
        "changed": False,
        "action": "none",
        "cache_path": state["path"],
        "key": key,
        "in_place": state["in_place"],
        "deployable": state["reason"] is None,
        "reason": state["reason"] or f"{state['path']} can take the kernel cache of {key_text(key)} from a store",
    }
