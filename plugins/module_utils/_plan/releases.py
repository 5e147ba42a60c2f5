# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Releases of tt-inference-server on a host: which are kept, which are pruned, where previous points.

Pure functions, standard library only. The role inference_server installs each release under
``<tt_release_root>/releases/<tag>`` (with its marker file) and its venv under ``venvs/<tag>``, and keeps two
links beside them: ``current`` (the release in use) and ``previous`` (the one to roll back to). Its main entry
point installs and prunes; the ``switch`` entry point (the rollback) only moves the links and prunes nothing.
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# A release tag as the role names its directories (inference_server_version is checked against the same rule).
RELEASE_TAG = re.compile(r"^v\d+\.\d+\.\d+$")
# The marker an install writes last in ``releases/<tag>`` (the role's __inference_server_marker).
MARKER = ".ttfleet-release.json"


class ReleasesError(FleetError, ValueError):
    """Bad input; the message names it and says how to fix it."""


def installed(found: Iterable[Mapping[str, Any]] | None) -> list[str]:
    """Tags of the installed releases, oldest install first.

    ``found`` lists the release markers (``releases/<tag>/<marker>``, the ``files`` of ansible.builtin.find), each
    with its ``path`` and ``mtime``: the marker is written last by an install, so its mtime orders the installs.
    Anything under ``releases/`` that is not named like a release tag is not the role's and is never counted.
    """
    files = sorted(found or [], key=lambda item: item["mtime"])
    tags = [posixpath.basename(posixpath.dirname(str(item["path"]))) for item in files]
    return [tag for tag in tags if RELEASE_TAG.match(tag)]


def link_name(stat_result: Mapping[str, Any] | None) -> str:
    """The release a link points at (the last part of its target), '' when it is missing or not a link."""
    stat = (stat_result or {}).get("stat") or {}
    if not stat.get("islnk"):
        return ""
    return posixpath.basename(str(stat.get("lnk_target") or ""))


def _keep_count(keep: int | str) -> int:
    try:
        count = int(keep)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ReleasesError(
            f"inference_server_keep_releases is {keep!r}; set it to 1 or more (2 keeps one release to roll back to)."
        )
    return count


def plan_links(
    found: Iterable[Mapping[str, Any]] | None,
    target: str,
    keep: int | str,
    prune: bool,
    links: list[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """What the links and the release directories of a host become when ``current`` moves to ``target``.

    ``found``: the release markers (see :func:`installed`); ``keep``: inference_server_keep_releases (1 or more);
    ``prune``: whether this run prunes (main does, the switch entry point does not); ``links``: the stat results of
    ``current`` and ``previous``, in that order, as they were before this run.

    Returns:
      ``installed``: tags found, oldest first; ``known``: those plus ``target`` (last) when a check run has not
      really installed it; ``kept``: the releases that stay, in install order: the newest ``keep`` of ``known`` and
      ``target`` always, or all of them without ``prune``; ``pruned``: the others, whose release and venv are
      removed; ``old_current``, ``old_previous``: the links' releases before this run ('' for none);
      ``previous``: the release to roll back to: the one ``current`` left, or, when current already was ``target``
      (a converged host, a repeated switch), the release previous already named; ``link_previous``: whether the
      previous link is (re)pointed at it; ``unlink_previous``: whether the link goes because its release is pruned;
      ``published_previous``: the release published as the fact inference_server_previous (None when there is none
      or it is pruned).
    """
    target = str(target)
    tags = installed(found)
    known = tags + ([] if target in tags else [target])
    if prune:
        window = [*known[-_keep_count(keep) :], target]
        kept = [tag for tag in known if tag in window]
    else:
        kept = list(known)
    pruned = list(dict.fromkeys(tag for tag in known if tag not in kept))
    pair = list(links or [])
    old_current = link_name(pair[0] if len(pair) > 0 else None)
    old_previous = link_name(pair[1] if len(pair) > 1 else None)
    previous = old_current if old_current not in ("", target) else old_previous
    return {
        "installed": tags,
        "known": known,
        "kept": kept,
        "pruned": pruned,
        "old_current": old_current,
        "old_previous": old_previous,
        "previous": previous,
        "link_previous": previous not in ["", old_previous, *pruned],
        "unlink_previous": previous in pruned,
        "published_previous": None if previous in ["", *pruned] else previous,
    }
