# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""PEP 440 versions and specifiers, as far as tt-inference-server's ``system_requirements`` need them.

The version specifiers of ``system_requirements`` (``>=19.2.0``) are PEP 440 specifiers, which
tt-inference-server checks with ``packaging``. Target hosts may lack that package, so a small
evaluator of the same rules lives here. Standard library only.
"""

from __future__ import annotations

import re
from collections import namedtuple
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import NamedTuple

    # ``version_key``: (release without trailing zeros, pre-release rank, post number, dev rank).
    VersionKey = tuple[tuple[int, ...], tuple[int, int], int, tuple[int, int]]


class SpecifierError(FleetError, ValueError):
    """A version specifier that is not PEP 440."""


if TYPE_CHECKING:

    class Version(NamedTuple):
        """The namedtuple below, with its field types."""

        text: str
        release: tuple[int, ...]
        pre: tuple[int, int] | None  # (rank of a/b/rc, number)
        post: int | None
        dev: int | None

else:
    Version = namedtuple("Version", "text release pre post dev")

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|a|beta|b|c|rc|preview|pre)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_CLAUSE_RE = re.compile(r"^(~=|===|==|!=|<=|>=|<|>)\s*(\S+)$")


def parse_version(text: object) -> Version | None:
    """A PEP 440 version (``80.17.0.0``, ``2.4.1``, ``2.5.0rc1``, ``v1.2``) or None."""
    if not isinstance(text, str):
        return None
    match = _VERSION_RE.match(text)
    if not match:
        return None
    groups = match.groupdict()
    pre = (_PRE_RANK[groups["pre_l"].lower()], int(groups["pre_n"] or 0)) if groups["pre_l"] else None
    if groups["post_n1"] is not None:
        post = int(groups["post_n1"])
    elif groups["post_l"]:
        post = int(groups["post_n2"] or 0)
    else:
        post = None
    dev = int(groups["dev_n"] or 0) if groups["dev_l"] else None
    release = tuple(int(part) for part in groups["release"].split("."))
    return Version(text.strip(), release, pre, post, dev)


def is_prerelease(version: Version) -> bool:
    return version.pre is not None or version.dev is not None


def _strip_zeros(release: Iterable[int]) -> tuple[int, ...]:
    release = list(release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


def version_key(version: Version) -> VersionKey:
    """Total order of PEP 440: ``1.0.dev0 < 1.0a1 < 1.0 == 1.0.0 < 1.0.post1``."""
    if version.pre is None and version.post is None and version.dev is not None:
        pre = (-1, 0)
    elif version.pre is None:
        pre = (3, 0)
    else:
        pre = version.pre
    post = -1 if version.post is None else version.post
    dev = (1, 0) if version.dev is None else (0, version.dev)
    return (_strip_zeros(version.release), pre, post, dev)


def _padded(release: tuple[int, ...], length: int) -> tuple[int, ...]:
    return tuple(release[:length]) + (0,) * (length - len(release))


def parse_specifier(specifier: object) -> list[tuple[str, Version, bool]]:
    """Clauses ``(operator, Version, wildcard)`` of a comma separated specifier; raises SpecifierError."""
    if specifier is None:
        return []
    if not isinstance(specifier, str):
        raise SpecifierError(f"version specifier {specifier!r} is not a string")
    clauses: list[tuple[str, Version, bool]] = []
    for part in specifier.split(","):
        part = part.strip()
        if not part:
            continue
        match = _CLAUSE_RE.match(part)
        if not match:
            raise SpecifierError(f"{part!r} in {specifier!r} is not a version clause such as >=19.2.0")
        operator, text = match.groups()
        wildcard = text.endswith(".*")
        if wildcard:
            if operator not in ("==", "!="):
                raise SpecifierError(f"{part!r}: only == and != take a trailing .*")
            text = text[:-2]
        version = parse_version(text)
        if operator != "===" and version is None:
            raise SpecifierError(f"{part!r} in {specifier!r} has no valid version")
        # Only === takes a text that is no version (refused just above for every other operator).
        if operator == "~=" and len(cast(Version, version).release) < 2:
            raise SpecifierError(f"{part!r}: ~= needs at least two release numbers (~=2.4)")
        clauses.append((operator, version if version else Version(text, (), None, None, None), wildcard))
    return clauses


def _clause_holds(operator: str, wanted: Version, wildcard: bool, measured: Version) -> bool:
    if operator == "===":
        return measured.text.lower() == wanted.text.lower()
    if wildcard:
        prefix = wanted.release
        same = _padded(measured.release, len(prefix)) == prefix
        return same if operator == "==" else not same
    have, want = version_key(measured), version_key(wanted)
    if operator == "~=":
        prefix = wanted.release[:-1]
        return have >= want and _padded(measured.release, len(prefix)) == prefix
    return {
        "==": have == want,
        "!=": have != want,
        "<=": have <= want,
        ">=": have >= want,
        "<": have < want,
        ">": have > want,
    }[operator]


def check_specifier(version_text: object, specifier: object) -> tuple[bool, str | None]:
    """``(ok, reason)``: whether a version satisfies a specifier (all clauses, as ``packaging`` does).

    As in ``packaging``, a pre-release only satisfies a specifier that itself names a pre-release.
    Raises SpecifierError for a malformed specifier.
    """
    clauses = parse_specifier(specifier)
    measured = parse_version(version_text)
    if measured is None:
        return False, f"{version_text!r} is not a version"
    if is_prerelease(measured) and not any(is_prerelease(wanted) for _op, wanted, _w in clauses if wanted.release):
        return False, f"{measured.text} is a pre-release, which {specifier} does not admit"
    for operator, wanted, wildcard in clauses:
        if not _clause_holds(operator, wanted, wildcard, measured):
            suffix = ".*" if wildcard else ""
            return False, f"{measured.text} is not {operator}{wanted.text}{suffix}"
    return True, None


def satisfies(version_text: object, specifier: object) -> bool:
    return check_specifier(version_text, specifier)[0]
