# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights: the vocabulary of the step and the checks of what a source lists.

The errors, the names of our own files beside the weights, the modes the layout gives, and the checks of a
repository id, a revision and a listed path; allow/ignore patterns. Nothing here touches the network or
the disk.
"""

from __future__ import annotations

import fnmatch
import re
import urllib.parse
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import hide_userinfo, printable
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, Optional, TypeGuard

    # Decoded JSON and the dicts built like it: module options, file items, plans, manifests, digests, stats.
    JSON = dict[str, Any]
    # (uid, gid)
    Owner = tuple[int, int]
    # allow_patterns / ignore_patterns (fnmatch patterns; None for none).
    Patterns = Optional[Iterable[str]]  # noqa: UP045 - ansible-test pylint reads `|` here as an operation
    # What a manifest records for its source: repo_id and revision, or a path (see identity_of).
    Identity = Mapping[str, object]


STAGING_NAME = ".ttfleet-staging"
PART_SUFFIX = ".ttfleet-part"
TEMP_PREFIX = ".ttfleet-tmp-"
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_IGNORE_PATTERNS = ("original/**",)
# Weights are root's and read-only to the serving container: files 0644 (0755 with an execute bit), dirs 0755.
FILE_MODE = 0o644
EXEC_MODE = 0o755
DIR_MODE = 0o755
# Staging is root's scratch space: nobody else may add, swap or read partial files there.
STAGING_MODE = 0o700
# A listed path: at most 4096 bytes, each component at most 255 (what Linux filesystems take).
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


class WeightsError(FleetError):
    """A request that cannot be carried out; the message says what, which input and how to fix it."""


def scrub(text: object, *secret_values: str | None) -> str:
    """``text`` with every secret value (and URL user info) replaced by ``********``."""
    text = str(text)
    for value in secret_values:
        if value:
            text = text.replace(value, "********")
    return hide_userinfo(text)


def is_commit_sha(revision: object) -> TypeGuard[str]:
    return isinstance(revision, str) and bool(SHA_RE.match(revision))


def check_revision(
    repo_id: str, revision: str | None, allow_floating: bool | None, endpoint: str = DEFAULT_ENDPOINT
) -> bool:
    """Refuse a branch, tag or short SHA unless ``allow_floating``; return True when it is a pinned commit."""
    if is_commit_sha(revision):
        return True
    if allow_floating:
        return False
    base = endpoint.rstrip("/")
    if not revision:
        raise WeightsError(
            f"no revision given for {repo_id}; pin a 40-character commit SHA "
            f"(see {base}/{repo_id}/commits/main) or set allow_floating_revision: true to follow main"
        )
    if re.match(r"^[0-9a-fA-F]{7,39}$", revision) or re.match(r"^[0-9A-F]{40}$", revision):
        kind = "an abbreviated or upper-case commit id"
    else:
        kind = "a branch or tag, not a commit"
    raise WeightsError(
        f"revision {revision!r} of {repo_id} is {kind}; pin a 40-character lower-case commit SHA "
        f"(see {base}/{repo_id}/commits/{urllib.parse.quote(revision, safe='')}) or set allow_floating_revision: true"
    )


def check_repo_id(repo_id: object) -> str:
    if not isinstance(repo_id, str) or not _REPO_RE.match(repo_id) or ".." in repo_id:
        raise WeightsError(f"repo_id {repo_id!r} is not a Hugging Face repository id; use the form org/name")
    return repo_id


def _path_bytes(path: str) -> list[int] | None:
    try:
        return [len(part.encode("utf-8")) for part in path.split("/")]
    except UnicodeError:
        return None


def check_relpath(path: Any, origin: str) -> str:
    """Refuse a file path from a source that could escape the destination, clash with our own files, not fit a
    filesystem, or show as something else on a terminal (control characters: ESC, newlines, bidi overrides)."""
    parts = path.split("/") if isinstance(path, str) else []
    lengths = _path_bytes(path) if parts else None
    if (
        not parts
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or printable(path, limit=len(path)) != path
        or lengths is None
        or sum(lengths) + len(lengths) - 1 > MAX_PATH_BYTES
        or max(lengths) > MAX_NAME_BYTES
        or any(part in ("", ".", "..") for part in parts)
        or parts[0] in (MANIFEST_NAME, STAGING_NAME)
        or path.endswith(PART_SUFFIX)
        or any(part.startswith(TEMP_PREFIX) for part in parts)
    ):
        text = path.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(path, str) else repr(path)
        shown = printable(text, 200)
        reserved = parts and parts[0] in (MANIFEST_NAME, STAGING_NAME)
        raise WeightsError(
            f"{origin} lists an unusable file path '{shown}'; refusing to write it"
            + (
                f" ({parts[0]} at the top of the weights is this collection's own manifest or staging; a repository "
                "holding such a file cannot be placed as it is: leave it out with ignore_patterns)"
                if reserved
                else ""
            )
        )
    return path


def _normalize_patterns(patterns: Patterns) -> list[str]:
    # As huggingface_hub does: "dir/" means everything below dir.
    return [pattern + "*" if pattern.endswith("/") else pattern for pattern in (patterns or [])]


def filter_paths(
    paths: Iterable[str], allow_patterns: Patterns = None, ignore_patterns: Patterns = DEFAULT_IGNORE_PATTERNS
) -> list[str]:
    """Keep paths matching any allow pattern (all when none) and no ignore pattern (fnmatch, ``*`` crosses ``/``)."""
    allow = _normalize_patterns(allow_patterns)
    ignore = _normalize_patterns(ignore_patterns)
    kept = []
    for path in paths:
        if allow and not any(fnmatch.fnmatchcase(path, pattern) for pattern in allow):
            continue
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in ignore):
            continue
        kept.append(path)
    return kept


def split_relpath(rel: str) -> tuple[str, str]:
    reldir, _sep, leaf = rel.rpartition("/")
    return reldir, leaf
