# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What disk_prune may remove: pure decisions over what the host scan found (``_plan/prune_host.py``).

Every item found gets an ``action``: ``remove`` (not needed, and its kind is allowed), ``keep`` (needed or protected:
the note says by what) or ``skip`` (not needed but left: its kind is not allowed, it is unsafe to touch, or the run
only reports). Conservative defaults (issue 33): a factory volume (a label, not X.Y.Z, after ``-v``) and a volume an
alias points to are kept unless named in ``remove``; a volume needed by a kept release, mounted by a container or
served by a live peer is never removed, named or not.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError, parse_reference
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KEY_FIELDS, NO_VLLM, key_text
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.releases import plan_links
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import aside_stamp, parse_volume_name

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]

KINDS = ("volumes", "kernel_caches", "staging", "spool", "images", "releases")
REPORT_ONLY = "report only: kinds is empty, nothing is removed"


class PruneError(FleetError):
    """Bad input to disk_prune; the message names it and the fix."""


def item(kind: str, name: str, path: str, reason: str = "", action: str = "keep", note: str = "") -> JSON:
    return {"kind": kind, "name": name, "path": path, "bytes": 0, "reason": reason, "action": action, "note": note}


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse bad input before anything is read, naming the option and the fix."""
    unknown = sorted(set(options.get("kinds") or []) - set(KINDS))
    if unknown:
        raise PruneError(f"kinds lists {', '.join(unknown)}; use some of {', '.join(KINDS)} (or [] to only report)")
    for name in options.get("needed_volumes") or []:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise PruneError(f"needed_volumes holds {name!r}: give names of entries of volume_root, not paths")
    for name in options.get("remove") or []:
        # Names are only compared with what the scan found; an image reference holds '/', a path never belongs.
        if not isinstance(name, str) or not name or name.startswith("/") or {".", ".."} & set(name.split("/")):
            raise PruneError(
                f"remove holds {name!r}: give names of items (a volume name, an image reference, a release tag), "
                "not paths"
            )
    if int(options.get("time_limit") or 0) < 1:
        raise PruneError(f"time_limit is {options.get('time_limit')!r}; give the seconds removal may take (1 or more)")
    if int(options.get("release_keep") or 0) < 1:
        raise PruneError(f"release_keep is {options.get('release_keep')!r}; set it to 1 or more")
    for key in options.get("needed_kernel_keys") or []:
        if not isinstance(key, dict) or not all(key.get(field) for field in KEY_FIELDS[:4]):
            raise PruneError(
                f"needed_kernel_keys holds {key!r}: give the kernel key records of model_cache_plan "
                f"({', '.join(KEY_FIELDS)})"
            )


def gate(found: JSON, kinds: Iterable[str]) -> None:
    """Turn ``remove`` into ``skip`` when the item's kind is not allowed (or nothing is: report only)."""
    allowed = list(kinds)
    if found["action"] != "remove" or found["kind"] in allowed:
        return
    found["action"] = "skip"
    found["note"] = REPORT_ONLY if not allowed else f"kind {found['kind']} is not in kinds"


# ---------------------------------------------------------------------------------------------
# Volumes


def alias_target(root: str, entry: Mapping[str, Any]) -> str | None:
    """The name in ``root`` that the alias ``entry`` points to (by its link text), None for a target elsewhere."""
    text = entry.get("target")
    if not entry.get("is_link") or not text:
        return None
    resolved = posixpath.normpath(posixpath.join(root, text))
    return posixpath.basename(resolved) if posixpath.dirname(resolved) == posixpath.normpath(root) else None


def _volume_verdict(entry: Mapping[str, Any], named: bool, root: str) -> tuple[str, str, str]:
    """``(action, reason, note)`` of a volume no one needs, before alias targets and kinds are weighed."""
    name = entry["name"]
    parsed = parse_volume_name(name)
    stamp = aside_stamp(name)
    if entry.get("is_link"):
        target = entry.get("target")
        return "remove", f"alias to {target}, not needed", ""
    if parsed["label"] and not named:
        return "keep", "", f"factory volume (-v{parsed['label']}, not a version); name it in remove to reclaim it"
    if stamp is not None:
        return "remove", f"moved aside by volume_alias on {stamp}", ""
    if parsed["version"]:
        return "remove", f"no kept release expects it (model {parsed['model_name']}, version {parsed['version']})", ""
    if named:
        return "remove", "named in remove", ""
    return "keep", "", f"{posixpath.join(root, name)} carries no version in its name; name it in remove to reclaim it"


def plan_volumes(
    root: str,
    entries: Iterable[Mapping[str, Any]],
    needed: Iterable[str],
    remove: Iterable[str],
    kinds: Iterable[str],
) -> list[JSON]:
    """Decide every ``volume_id_*`` entry of ``root``. An entry: ``name``, ``is_link``, ``target`` (link text),
    ``problem`` (why it cannot be touched, or None), ``in_use`` (what uses it: a container, a live peer, or None)."""
    entries = list(entries)
    by_name = {entry["name"]: entry for entry in entries}
    needed, named = set(needed), set(remove)
    targets = {entry["name"]: alias_target(root, entry) for entry in entries}

    def chain(start: str) -> list[str]:
        """The names an alias leads to inside the root, in order (a loop ends it)."""
        seen: list[str] = []
        current = targets.get(start)
        while current and current not in seen and current in by_name:
            seen.append(current)
            current = targets.get(current)
        return seen

    protected = {target: alias for alias in sorted(needed) for target in chain(alias)}
    items: list[JSON] = []
    for entry in entries:
        name = entry["name"]
        found = item("volumes", name, posixpath.join(root, name))
        if name in needed:
            found["note"] = "needed by a kept release"
        elif name in protected:
            found["note"] = f"the needed alias {protected[name]} points to it"
        elif entry.get("in_use"):
            found["note"] = f"in use: {entry['in_use']}" + (" (named in remove, still kept)" if name in named else "")
        else:
            found["action"], found["reason"], found["note"] = _volume_verdict(entry, name in named, root)
            if found["action"] == "remove" and entry.get("problem"):
                found["action"], found["note"] = "skip", entry["problem"]
        items.append(found)
    # Refusals of remove: what is needed stays needed.
    for found in items:
        if (
            found["name"] in named
            and found["action"] == "keep"
            and (found["name"] in needed or found["name"] in protected)
        ):
            found["note"] += " (named in remove, still kept)"
    # An alias that stays keeps what it points to (unless that is named in remove): repeat until nothing changes.
    decided = {found["name"]: found for found in items}
    changed = True
    while changed:
        changed = False
        for found in items:
            if found["action"] == "remove" or not by_name[found["name"]].get("is_link"):
                continue
            for target in chain(found["name"]):
                other = decided[target]
                if other["action"] == "remove" and target not in named:
                    other["action"], other["reason"] = "keep", ""
                    other["note"] = f"the alias {found['name']} points to it; name it in remove to reclaim it"
                    changed = True
    for found in items:
        gate(found, kinds)
    return items


def _decide(kind: str, entry: Mapping[str, Any], kinds: Iterable[str], kept: str, reason: str) -> JSON:
    """One scanned entry: kept with the note ``kept`` when that is set, else removable for ``reason`` unless what
    holds it (a live server: ``live``) or its ``problem`` leaves it skipped."""
    found = item(kind, entry["name"], entry["path"])
    if kept:
        found["note"] = kept
    else:
        found["action"], found["reason"] = "remove", reason
        held = entry.get("live") or entry.get("problem")
        if held:
            found["action"], found["note"] = "skip", held
    gate(found, kinds)
    return found


def plan_kernel_caches(entries: Iterable[Mapping[str, Any]], kinds: Iterable[str]) -> list[JSON]:
    """Tensor caches moved aside inside kept volumes. An entry: ``name`` (relative to the volume root), ``path``,
    ``problem``."""
    kinds = list(kinds)
    return [
        _decide(
            "kernel_caches",
            entry,
            kinds,
            "",
            f"kernel cache moved aside on {aside_stamp(posixpath.basename(entry['name'])) or 'an unknown date'}",
        )
        for entry in entries
    ]


def plan_staging(entries: Iterable[Mapping[str, Any]], needed: Iterable[str], kinds: Iterable[str]) -> list[JSON]:
    """Partial downloads in ``<volume_root>/.ttfleet-staging``: kept for a needed volume (resumable work)."""
    needed, kinds = set(needed), list(kinds)
    return [
        _decide(
            "staging",
            entry,
            kinds,
            "the resumable download of a needed volume" if entry["name"] in needed else "",
            f"stale partial download: no kept release expects {entry['name']}",
        )
        for entry in entries
    ]


def _key_id(key: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(key.get(field) or NO_VLLM) for field in KEY_FIELDS)


def plan_spool(
    entries: Iterable[Mapping[str, Any]], needed_keys: Iterable[Mapping[str, Any]], kinds: Iterable[str]
) -> list[JSON]:
    """Kernel archives in the spools. An entry: ``name`` (``<spool>:<model>/<mesh>/...``), ``path``, ``key``,
    ``live`` (a live peer server serves its spool: a message), ``problem``."""
    wanted = {_key_id(key) for key in needed_keys}
    kinds = list(kinds)
    return [
        _decide(
            "spool",
            entry,
            kinds,
            "a kept release needs these kernels" if _key_id(entry["key"]) in wanted else "",
            f"no kept release needs {key_text(entry['key'])}",
        )
        for entry in entries
    ]


def _link(tag: str) -> JSON:
    return {"stat": {"islnk": bool(tag), "lnk_target": f"releases/{tag}"}}


def plan_releases(
    release_root: str,
    found: Mapping[str, Any],
    keep: int,
    remove: Iterable[str],
    kinds: Iterable[str],
) -> list[JSON]:
    """Releases beyond current, previous and the newest ``keep``, through the role's own keep rule
    (``plan_links``). ``found``: ``markers`` (``[{path, mtime}]``), ``current``, ``previous`` (tags or ''),
    ``dirs`` (``{tag: [relative paths present: releases/<tag>, venvs/<tag>]}``), ``problems`` (``{path: text}``)."""
    current, previous = found.get("current") or "", found.get("previous") or ""
    named = set(remove)
    items: list[JSON] = []
    if not current:
        for _tag, paths in sorted(found.get("dirs", {}).items()):
            for rel in paths:
                items.append(item("releases", rel, posixpath.join(release_root, rel), note="no current link: kept"))
        return items
    plan = plan_links(found.get("markers"), current, keep, True, [_link(current), _link(previous)])
    kept = set(plan["kept"]) | {current, previous}
    for tag, paths in sorted(found.get("dirs", {}).items()):
        for rel in paths:
            path = posixpath.join(release_root, rel)
            found_item = item("releases", rel, path)
            if tag in (current, previous):
                found_item["note"] = f"the {'current' if tag == current else 'previous'} release"
                if tag in named:
                    found_item["note"] += " (named in remove, still kept)"
            elif tag not in plan["installed"]:
                found_item["note"] = "no release marker: not installed by the inference_server role"
            elif tag in kept and tag not in named:
                found_item["note"] = f"one of the newest {keep} releases"
            else:
                found_item["action"] = "remove"
                found_item["reason"] = (
                    "named in remove"
                    if tag in kept
                    else f"beyond current ({current}), previous ({previous or 'none'}) and the newest {keep}"
                )
                problem = (found.get("problems") or {}).get(path)
                if problem:
                    found_item["action"], found_item["note"] = "skip", problem
            gate(found_item, kinds)
            items.append(found_item)
    return items


# ---------------------------------------------------------------------------------------------
# Images


def _repository(ref: str) -> str | None:
    try:
        return parse_reference(ref).name
    except ImageError:
        return None


def _normal(ref: str) -> str | None:
    try:
        parsed = parse_reference(ref)
    except ImageError:
        return None
    return f"{parsed.name}:{parsed.tag or 'latest'}"


def plan_images(
    images: Iterable[Mapping[str, Any]],
    repositories: Iterable[str],
    needed: Iterable[str],
    remove: Iterable[str],
    kinds: Iterable[str],
) -> list[JSON]:
    """Tagged images of ``repositories``. An image: ``id``, ``tags``, ``size``, ``used_by`` (container names). The
    bytes of an image count only when every one of its tags goes (a tag removed from a kept image frees nothing)."""
    repos = {name for name in (_repository(repo) for repo in repositories) if name}
    wanted = {name for name in (_normal(ref) for ref in needed) if name}
    named = {name for name in (_normal(ref) for ref in remove) if name}
    items: list[JSON] = []
    for image in images:
        tags = [tag for tag in image.get("tags") or [] if _repository(tag) in repos]
        all_go = True
        group = []
        for tag in tags:
            found = item("images", tag, tag)
            found["ref"] = found.pop("path")
            if _normal(tag) in wanted:
                found["note"] = "a kept release uses it"
            elif image.get("used_by"):
                found["note"] = f"used by container {', '.join(image['used_by'])}"
                if _normal(tag) in named:
                    found["note"] += " (named in remove, still kept)"
            else:
                found["action"] = "remove"
                found["reason"] = "named in remove" if _normal(tag) in named else "no kept release uses it"
            gate(found, kinds)
            all_go = all_go and found["action"] != "keep"
            group.append(found)
        outside = [tag for tag in image.get("tags") or [] if tag not in tags]
        if group and all_go and not outside:
            group[0]["bytes"] = int(image.get("size") or 0)
        items.extend(group)
    return items


def summary(items: Iterable[Mapping[str, Any]], reclaimable: int, by_kind: Mapping[str, int]) -> str:
    items = list(items)
    count = sum(1 for found in items if found["action"] == "remove" or found["note"] == REPORT_ONLY)
    parts = ", ".join(f"{kind} {human_bytes(size)}" for kind, size in sorted(by_kind.items()) if size)
    return f"{count} items reclaimable, {human_bytes(reclaimable)}" + (f" ({parts})" if parts else "")


def listing(items: Iterable[Mapping[str, Any]]) -> str:
    """One line per item, for --diff."""
    lines = []
    for found in items:
        why = found["reason"] or found["note"]
        lines.append(f"{found['kind']}: {found['name']} [{found['action']}] {found['bytes']} B {why}".rstrip())
    return "\n".join(lines) + ("\n" if lines else "")
