# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: moving staged files into place and the ownership layout of the weights and their volume."""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import rename
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import (
    ensure_dir,
    make_path,
    makedirs,
    open_dir,
    open_relative,
    open_subdir,
    opened_dir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_file
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, kind_of
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import own_tree, remove_tree
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    STAGING_NAME,
    WeightsError,
    split_relpath,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.staging import trusted_staging

if TYPE_CHECKING:
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Owner


# The directories of a volume the serving container writes (kernel caches, logs, its symlink map, its HF home).
WRITABLE_SUBDIRS = ("tt_metal_cache", "logs", "model_file_symlinks_map", "huggingface")


def place_files(plan: JSON, owner: Owner | None = None) -> None:
    """Move staged files into dest by renames between directory descriptors (dest created when missing),
    then clear staging.

    Only the planned paths are touched; a link at a planned path is replaced, never followed, and a link in
    place of a directory on the way is refused. Files hardlinked from a path source already have the owner and
    mode of the layout; every other file gets them on its descriptor before the rename.
    """
    dest = plan["dest"]
    parent, name = os.path.split(dest)
    by_path = {item["path"]: item for item in plan["files"]}
    try:
        pfd = make_path(parent, owner=owner)
        try:
            dest_fd = ensure_dir(pfd, name, DIR_MODE, owner, where=parent)[0]
            staging_fd = open_relative(pfd, f"{STAGING_NAME}/{name}", where=parent)
        finally:
            os.close(pfd)
    except SafeFileError as exc:
        raise WeightsError(f"{exc}; move it away and run again") from None
    try:
        for rel in plan["to_fetch"]:
            reldir, leaf = split_relpath(rel)
            try:
                dfd = makedirs(dest_fd, reldir, DIR_MODE, owner, where=dest)
            except SafeFileError as exc:
                raise WeightsError(
                    f"{exc.path} is a symlink or file where the model needs a directory; move it away and run again"
                ) from None
            sfd = open_relative(staging_fd, reldir)
            try:
                if not by_path[rel].get("linked"):
                    ffd, st = open_file(sfd, leaf)
                    try:
                        set_attrs(ffd, EXEC_MODE if by_path[rel].get("src_mode", 0) & 0o111 else FILE_MODE, owner, st)
                    finally:
                        os.close(ffd)
                try:
                    rename(sfd, leaf, leaf, dst_dirfd=dfd)
                except SafeFileError as exc:
                    raise WeightsError(f"{dest}/{rel}: {exc.reason}") from None
            finally:
                os.close(sfd)
                os.close(dfd)
    finally:
        os.close(dest_fd)
        os.close(staging_fd)
    clear_staging(plan["staging"])


def clear_staging(staging: str) -> None:
    """Remove this destination's staging directory (when it is ours) and ``.ttfleet-staging`` when it is left
    empty; nothing is followed on the way."""
    top, name = os.path.split(staging)
    weights, _top_name = os.path.split(top)
    try:
        with opened_dir(weights) as wfd:
            sfd = open_subdir(wfd, STAGING_NAME)
            try:
                if trusted_staging(os.fstat(sfd)):
                    remove_tree(sfd, name)
            finally:
                os.close(sfd)
            with contextlib.suppress(OSError):
                os.rmdir(STAGING_NAME, dir_fd=wfd)
    except (OSError, SafeFileError):
        return


def _layout_volume(dest: str, container: Owner | None) -> str | None:
    """The volume of ``dest`` (``<volume>/weights/<model>``) to lay out, or None when no container owner is given."""
    return None if container is None else os.path.dirname(os.path.dirname(dest))


def plan_layout(dest: str, owner: Owner, container: Owner | None) -> list[str]:
    """What the volume around ``dest`` lacks, as text: the volume and ``weights`` directories not owned by
    ``owner`` with mode 0755, and the directories the container writes missing or not owned by ``container``.
    Reads only; an empty list when there is no layout to apply."""
    volume = _layout_volume(dest, container)
    if volume is None:
        return []
    container = cast("Owner", container)  # a volume is laid out only with a container owner
    changes = []
    try:
        vfd = open_dir(volume)
    except FileNotFoundError:
        vfd = None
    except SafeFileError as exc:
        raise WeightsError(f"{exc}; move it away and run again") from None
    try:
        for label, name in ((volume, None), (os.path.join(volume, "weights"), "weights")):
            st = None
            if vfd is not None:
                with contextlib.suppress(FileNotFoundError):
                    st = os.fstat(vfd) if name is None else os.lstat(name, dir_fd=vfd)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise WeightsError(f"{label} is a {kind_of(st.st_mode)}, not a directory; move it away and run again")
            if (st.st_uid, st.st_gid) != tuple(owner) or stat.S_IMODE(st.st_mode) != DIR_MODE:
                changes.append(
                    f"{label}: owner {st.st_uid}:{st.st_gid} mode {stat.S_IMODE(st.st_mode):04o} -> "
                    f"{owner[0]}:{owner[1]} {DIR_MODE:04o}"
                )
        for name in WRITABLE_SUBDIRS:
            label = os.path.join(volume, name)
            st = None
            if vfd is not None:
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(name, dir_fd=vfd)
            if st is None:
                changes.append(f"{label}: create, owner {container[0]}:{container[1]} mode {DIR_MODE:04o}")
            elif not stat.S_ISDIR(st.st_mode):
                raise WeightsError(f"{label} is a {kind_of(st.st_mode)}, not a directory; move it away and run again")
            elif (st.st_uid, st.st_gid) != tuple(container):
                changes.append(f"{label}: owner {st.st_uid}:{st.st_gid} -> {container[0]}:{container[1]}")
    finally:
        if vfd is not None:
            os.close(vfd)
    return changes


def apply_layout(dest: str, owner: Owner, container: Owner | None) -> list[str]:
    """Give dest and everything below it ``owner`` with modes 0755/0644 (0755 for files with an execute bit),
    and with ``container`` the volume layout (see ``plan_layout``); all on descriptors, never following a link.
    Returns the links and special files in dest that were left alone."""
    try:
        with opened_dir(dest) as dest_fd:
            _changed, skipped = own_tree(dest_fd, owner, DIR_MODE, FILE_MODE, where=dest, exec_mode=EXEC_MODE)
        volume = _layout_volume(dest, container)
        if volume is None:
            return skipped
        with opened_dir(volume) as vfd:
            set_attrs(vfd, DIR_MODE, owner)
            wfd = open_subdir(vfd, "weights", volume)
            try:
                set_attrs(wfd, DIR_MODE, owner)
            finally:
                os.close(wfd)
            for name in WRITABLE_SUBDIRS:
                fd = ensure_dir(vfd, name, DIR_MODE, container, volume)[0]
                try:
                    # Only the owner: the mode and the contents are the server's.
                    set_attrs(fd, None, container)
                finally:
                    os.close(fd)
    except SafeFileError as exc:
        raise WeightsError(f"cannot give {dest} its owner and modes: {exc}; move it away and run again") from None
    return skipped
