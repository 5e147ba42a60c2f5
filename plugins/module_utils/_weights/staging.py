# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: the staging directory beside the destination and its state file.

Staging is root's 0700 scratch space on the destination's filesystem; its state records the files a run
finished there, so that an interrupted run resumes without fetching them again.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import (
    ensure_dir,
    open_relative,
    open_subdir,
    opened_dir,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import remove_tree
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import MANIFEST_MAX_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    STAGING_MODE,
    STAGING_NAME,
    WeightsError,
    split_relpath,
)

if TYPE_CHECKING:
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Identity


# The state file sits beside the staged files, so its name must be one that no source can list: check_relpath
# refuses STAGING_NAME as the first component of any listed path (a repository file named like the state of an
# older release, ``.ttfleet-staging.json``, is an ordinary file now, staged and placed like any other).
STAGING_STATE = STAGING_NAME


def staging_dir(dest: str) -> str:
    """``<dest parent>/.ttfleet-staging/<dest name>``: same filesystem as dest, outside the mounted weights."""
    parent = os.path.dirname(os.path.normpath(dest))
    return os.path.join(parent, STAGING_NAME, os.path.basename(os.path.normpath(dest)))


def trusted_staging(st: os.stat_result) -> bool:
    """Whether a directory is staging this process can trust: a real directory of its own user, mode 0700."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def open_staging_read(dest: str) -> int | None:
    """Descriptor of the staging directory of ``dest`` when it exists and is ours, else None (reads only)."""
    parent, name = os.path.split(dest)
    try:
        with opened_dir(parent) as pfd:
            top = open_subdir(pfd, STAGING_NAME)
    except (OSError, SafeFileError):
        return None
    try:
        if not trusted_staging(os.fstat(top)):
            return None
        fd = open_subdir(top, name)
    except (OSError, SafeFileError):
        return None
    finally:
        os.close(top)
    if not trusted_staging(os.fstat(fd)):
        os.close(fd)
        return None
    return fd


def _own_dir(parent_fd: int, name: str, where: str) -> int:
    """Descriptor of staging directory ``name`` in ``parent_fd``, ours and 0700. Whatever else holds the name
    (a link, a file, a directory of another user, as an older release left it chowned to the container) is
    removed first, without following a link: it is scratch space that nothing may be trusted from."""
    with contextlib.suppress(FileNotFoundError):
        if not trusted_staging(os.lstat(name, dir_fd=parent_fd)):
            remove_tree(parent_fd, name)
    fd = ensure_dir(parent_fd, name, STAGING_MODE, None, where)[0]
    if not trusted_staging(os.fstat(fd)):
        os.close(fd)
        raise WeightsError(f"{os.path.join(where, name)} was replaced while it was prepared; run again")
    return fd


def read_staging_state(staging_fd: int | None, identity: Identity) -> JSON | None:
    """Files a previous run finished in staging, or None when staging is absent or was for another source."""
    if staging_fd is None:
        return None
    try:
        state = read_json(staging_fd, STAGING_STATE, MANIFEST_MAX_BYTES)
    except SafeFileError:
        return None
    if not isinstance(state, dict) or state.get("identity") != identity or not isinstance(state.get("files"), dict):
        return None
    return state["files"]


def open_staging(plan: JSON) -> tuple[int, JSON]:
    """``(descriptor, staged files)`` of staging ready for this source: kept when its state matches (resume),
    else cleared and started anew. The parent of dest must exist."""
    parent, name = os.path.split(plan["dest"])
    with opened_dir(parent) as pfd:
        top = _own_dir(pfd, STAGING_NAME, parent)
    try:
        if plan["staged"] is None:
            remove_tree(top, name)
        fd = _own_dir(top, name, os.path.join(parent, STAGING_NAME))
    finally:
        os.close(top)
    if plan["staged"] is None:
        try:
            write_json(fd, STAGING_STATE, {"identity": plan["identity"], "files": {}}, 0o600)
        except BaseException:
            os.close(fd)
            raise
        return fd, {}
    return fd, dict(plan["staged"])


def expected_key(item: JSON) -> str:
    """What a staged file was checked against; it stays valid while the source lists the same digest."""
    if item.get("blob_sha1"):
        return f"blob:{item['blob_sha1']}"
    if item.get("lfs") or item.get("from_manifest"):
        return f"sha256:{item['sha256']}"
    return f"size:{item['size']}"


def size_at(dirfd: int | None, name: str) -> int | None:
    """Size of regular file ``name`` in ``dirfd``; None when absent or not a regular file."""
    if dirfd is None:
        return None
    try:
        st = os.lstat(name, dir_fd=dirfd)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def staged_size(staging_fd: int | None, rel: str, suffix: str = "") -> int | None:
    """Size of the staged file (or part, with ``suffix``) of ``rel``; None when there is none."""
    if staging_fd is None:
        return None
    reldir, leaf = split_relpath(rel)
    try:
        fd = open_relative(staging_fd, reldir)
    except (OSError, SafeFileError):
        return None
    try:
        return size_at(fd, leaf + suffix)
    finally:
        os.close(fd)


def record_staged(staging_fd: int, identity: Identity, staged: JSON, rel: str, item: JSON) -> None:
    staged[rel] = {"expected": expected_key(item), "sha256": item["sha256"], "size": item["size"]}
    write_json(staging_fd, STAGING_STATE, {"identity": identity, "files": staged}, 0o600)
