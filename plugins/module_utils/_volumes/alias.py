# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Aliases: a volume name made a symbolic link to another volume directory, or removed.

Alias changes are computed as a plan first (``plan_alias``/``plan_absent``) and only ``apply_plan`` touches the
filesystem, which is what check mode relies on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import fsync_path
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import ASIDE_INFIX, moved_aside_name
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError, check_path_text
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import file_type

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    JSON = dict[str, Any]

_MAX_LINK_HOPS = 40


def lstat_kind(path: str) -> str:
    try:
        return file_type(os.lstat(path).st_mode)
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
    fsync_path(os.path.dirname(path))
    return plan
