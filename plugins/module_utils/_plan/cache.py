# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The plan of the model_cache role: per served model, its spec, its volume, where its weights come from and why.

Private to the collection. ``plan_cache`` is the whole of ttfleet.inference.model_cache_plan: it resolves each model
once, finds its volume (``_plan.volume.plan_volume``), applies the role's source order (``choose_source``), plans its
weights with the check mode of model_weights (which lists the origin and compares it with the volume) and returns the
records the tasks act on; ``disk_shortfalls`` checks that each filesystem takes all of its models at once.
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.volume import other_releases, plan_volume
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve_entry
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import weights_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.select import validate_inputs
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import (
    default_checkout,
    load_params_catalog,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import VolumeError, check_path_text
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import expand_roots, scan_roots
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError, is_commit_sha, scrub
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.options import WEIGHTS_SOURCE_OPTIONS
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    JSON = dict[str, Any]

SOURCES = ("preseeded", "hf", "path", "s3")
# Sources whose bytes are listed at an origin and fetched.
FETCHING = ("hf", "path", "s3")
GIB = 1 << 30


class PlanError(FleetError):
    """A model the role cannot fill; the message names the host, the model and the fix."""


# ---------------------------------------------------------------------------
# Sources


def _recorded_revision(candidate: Mapping[str, Any]) -> str:
    manifest = candidate.get("manifest") or {}
    data = manifest.get("data") or {}
    return str(data.get("revision") or "")


def fresh_candidates(candidates: Iterable[Mapping[str, Any]], revision: str) -> list[JSON]:
    """The candidates that do not record another revision of the repository than ``revision``.

    Pinning a new revision must fetch it, not alias the old one. Factory volumes carry no manifest of ours and stay
    candidates.
    """
    kept = []
    for candidate in candidates:
        recorded = _recorded_revision(candidate)
        if revision and recorded and recorded != revision:
            continue
        kept.append(dict(candidate))
    return kept


def source_reasons(
    expected: Mapping[str, Any],
    candidates: Sequence[Mapping[str, Any]],
    revision: str,
    path: str,
    floating: bool,
    s3_bucket: str,
) -> dict[str, tuple[bool, str]]:
    """``{source: (applies, why)}`` for every source the role knows."""
    pinned = bool(revision) or floating
    rev_text = f"revision {revision}" if revision else "a floating revision (model_cache_allow_floating_revision)"
    weights = expected.get("weights") or {}
    manifest = expected.get("manifest") or {}
    if expected.get("type") == "absent" and candidates:
        preseeded = (True, f"{expected['path']} is absent and {candidates[0]['path']} holds complete weights")
    elif expected.get("exists") and weights.get("usable") and not manifest.get("present"):
        preseeded = (True, f"{expected['path']} holds complete weights that no fetch of ours recorded")
    elif expected.get("exists"):
        preseeded = (False, f"{expected['path']} exists and is not a volume of complete weights placed by hand")
    else:
        preseeded = (False, "no volume with complete weights of the model under the search roots")
    unpinned = (False, "the tt_models entry has no revision")
    if not s3_bucket:
        s3 = (False, "no model_cache_s3_bucket")
    else:
        s3 = (True, f"bucket {s3_bucket}, {rev_text}") if pinned else unpinned
    return {
        "preseeded": preseeded,
        "hf": (True, f"{rev_text} of the repository") if pinned else unpinned,
        "path": (True, f"the copy at {path}") if path else (False, "no path in the entry or model_cache_path"),
        "s3": s3,
    }


def choose_source(
    host: str,
    model: str,
    spec: Mapping[str, Any],
    expected: Mapping[str, Any],
    sources: Sequence[str],
    reasons: Mapping[str, tuple[bool, str]],
    search_roots: Sequence[str],
) -> tuple[str, str]:
    """``(source, reason)``: the first of ``sources`` that applies, and why it was chosen over the ones before it."""
    passed: list[str] = []
    for source in sources:
        applies, why = reasons[source]
        if applies:
            before = "; ".join(passed)
            return source, f"{source}: {why}" + (f" (before it, {before})" if before else "")
        passed.append(f"{source} did not apply: {why}")
    raise PlanError(
        f"{host}: no source in {json.dumps(list(sources))} can fill {expected['path']} for {model} "
        f"({spec.get('hf_weights_repo')}). preseeded: no volume with complete weights of {spec.get('model_name')} "
        f"under {json.dumps(list(search_roots))}; hf: the tt_models entry has no revision (set revision to a "
        f"commit SHA of {spec.get('hf_weights_repo')}, or model_cache_allow_floating_revision: true); path: no "
        "path (set path in the entry or model_cache_path); s3: no model_cache_s3_bucket or no revision. Fix: add a "
        "source that applies to the entry's sources or to model_cache_sources."
    )


def kernel_key(spec: Mapping[str, Any]) -> JSON:
    """What the kernel cache of the model is keyed by (ttfleet.inference.kernel_cache), and the volume it lives in."""
    paths = spec.get("paths") or {}
    return {
        "volume": paths.get("volume"),
        "volume_name": spec.get("volume_name"),
        "model_name": spec.get("model_name"),
        "mesh": spec.get("mesh"),
        "impl_id": spec.get("impl_id"),
        "tt_metal_commit": spec.get("tt_metal_commit") or "",
        "vllm_commit": spec.get("vllm_commit") or "",
    }


# ---------------------------------------------------------------------------
# Models


def plan_model(
    entry: Mapping[str, Any],
    spec: Mapping[str, Any],
    expected: Mapping[str, Any],
    candidates: Sequence[Mapping[str, Any]],
    options: Mapping[str, Any],
    plan_weights: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> JSON:
    """The record of one model: what the tasks do for it, and the work entry the fan-out spreads over the site."""
    host = options["host"]
    name = entry["name"]
    revision = str(entry.get("revision") or "")
    path = str(entry.get("path") if entry.get("path") is not None else options.get("path") or "")
    sources = list(entry.get("sources") or options["sources"])
    kept = fresh_candidates(candidates, revision)
    floating = bool(options.get("allow_floating_revision"))
    reasons = source_reasons(expected, kept, revision, path, floating, options.get("s3_bucket") or "")
    source, reason = choose_source(host, name, spec, expected, sources, reasons, options.get("search_roots") or [])
    fetching = source in FETCHING
    aliasing = source == "preseeded" and expected["type"] == "absent"
    candidate = kept[0] if aliasing else None
    weights: Mapping[str, Any] = {}
    if fetching:
        weights = plan_weights(
            {
                "dest": spec["paths"]["weights"],
                "source": source,
                "repo_id": spec.get("hf_weights_repo"),
                "revision": revision or None,
                "path": path if source == "path" else None,
            }
        )
    filesystem = weights.get("filesystem") or {}
    # alias: make the expected volume from the candidate; own: give weights already in place their layout;
    # fetch: model_weights from the source (bytes_to_fetch may be 0 on a converged host: it still compares).
    action = "alias" if aliasing else ("own" if source == "preseeded" else "fetch")
    # Only a pinned commit of a repository is the same bytes on every host.
    shareable = bool(fetching and options.get("peers") and source != "path" and is_commit_sha(revision))
    work = _work_entry(
        name,
        source,
        weights,
        expected,
        options,
        repo=spec.get("hf_weights_repo"),
        revision=revision,
        path=path,
        dest=spec["paths"]["weights"],
        shareable=shareable,
        candidate=candidate,
    )
    # What model_weights would change (its check mode, with the options the tasks pass): for a fetch, the work entry's
    # (the weights, their owners and modes, the manifest and the layout); for weights in place, their layout. An
    # alias is always work (the expected volume does not exist yet). The tasks skip a host with nothing pending.
    if action == "own":
        pending = bool(plan_weights({"dest": spec["paths"]["weights"], "source": "none"}).get("changed"))
    else:
        pending = aliasing or work["pending"]
    extras = [
        _extra_work(entry, spec, expected, item, sources, options, plan_weights)
        for item in entry.get("extra_repos") or []
    ]
    return {
        "name": name,
        "entry": dict(entry),
        "spec": dict(spec),
        "extras": extras,
        "volume": dict(expected),
        "candidate": candidate,
        "source": source,
        "reason": reason,
        "action": action,
        "pending": pending,
        "revision": work["revision"],
        "kernel": kernel_key(spec),
        "bytes_to_fetch": work["bytes"],
        "bytes_needed": work["bytes_needed"],
        # How the files in place were compared (model_weights' verified and hashed), for a fetch.
        "verified": weights.get("verified"),
        "hashed": list(weights.get("hashed") or []),
        "filesystem": dict(filesystem) if fetching else None,
        "work": work,
    }


def _work_entry(
    model: str,
    source: str,
    weights: Mapping[str, Any],
    expected: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    repo: str | None,
    revision: str,
    path: str,
    dest: str,
    shareable: bool,
    candidate: Mapping[str, Any] | None = None,
) -> JSON:
    """The work entry of one weights directory: what the fan-out spreads over the site and the fetch tasks run.

    ``weights`` is model_weights' check-mode result for a fetch, or empty when nothing is fetched (an alias or
    weights in place: nothing to move, nothing on a filesystem).
    """
    weights_plan = weights.get("plan") or {}
    filesystem = weights.get("filesystem") or {}
    return {
        "model": model,
        "origin": source,
        "repo_id": repo,
        "revision": weights.get("revision"),
        "revision_arg": revision,
        "path_arg": path,
        "site": options.get("site") or "default",
        "dest": dest,
        "volume": expected["path"],
        "complete": bool(weights_plan.get("complete", True)),
        "shareable": shareable,
        "bytes": int(weights_plan.get("bytes_to_fetch") or 0),
        # Whether the fetch would change anything here (model_weights' check mode); no fetch for weights in place.
        "pending": bool(weights.get("changed", True)) if weights else False,
        "bytes_needed": int(weights.get("bytes_needed") or 0),
        "fs_device": filesystem.get("device"),
        "fs_path": filesystem.get("path"),
        "fs_free": int(filesystem.get("free_bytes") or 0),
        "alias_from": candidate["path"] if candidate else None,
        # symlink: the alias shares the volume, kernel cache included; hardlink: weights shared, own kernel cache.
        "link": candidate["reuse"] if candidate else None,
        "link_reason": candidate["reuse_reason"] if candidate else None,
    }


def extra_dest(spec: Mapping[str, Any], repo: str) -> str:
    """The directory of an extra repository: ``<volume>/weights/<last component of the repository>``.

    Only the last component, because the package's own arguments name that path inside the container
    (``speculative_config.model: /home/container_app_user/cache_root/weights/<name>``) and volumes filled before keep
    it; ``check_directories`` refuses two repositories that would meet there.
    """
    return posixpath.join(spec["paths"]["volume"], weights_subdir(repo.rsplit("/", 1)[-1]))


def directory_claims(entry: Mapping[str, Any], spec: Mapping[str, Any]) -> list[JSON]:
    """The weights directories an entry fills: its model's weights and each extra repository's, with the repository
    and revision each is to hold and where the claim comes from (the entry, its instance and profile)."""
    labels = [f"{key} {entry[key]}" for key in ("instance", "profile") if entry.get(key)]
    who = ", ".join([f"tt_models entry {entry['name']}", *labels])
    claims = [
        {
            "dest": spec["paths"]["weights"],
            "repo": str(spec.get("hf_weights_repo") or entry["name"]),
            "revision": str(entry.get("revision") or ""),
            "extra": False,
            "what": f"the weights of {who}",
        }
    ]
    for index, item in enumerate(entry.get("extra_repos") or []):
        repo = str(item["repo"])
        claims.append(
            {
                "dest": extra_dest(spec, repo),
                "repo": repo,
                "revision": str(item.get("revision") or ""),
                "extra": True,
                "what": f"extra_repos[{index}] of {who}",
            }
        )
    return claims


def check_directories(host: str, claims: Iterable[Mapping[str, Any]]) -> None:
    """Refuse two different (repository, revision) pairs that would fill one weights directory.

    The plan keeps one work entry per directory, so the second pair would be silently served the first one's bytes:
    ``org-a/draft`` and ``org-b/draft`` beside one model, a draft named like its model's weights directory, or two
    entries of one model (which share its volume) pinning other revisions. Called before any origin is listed.
    """
    first: dict[str, Mapping[str, Any]] = {}
    for claim in claims:
        held = first.setdefault(claim["dest"], claim)
        if (held["repo"], held["revision"]) == (claim["repo"], claim["revision"]):
            continue
        if held["repo"] == claim["repo"]:
            fix = (
                f"pin one revision of {claim['repo']} in every entry that names it (the entries of one model share "
                "its volume)"
            )
        elif held["extra"] and claim["extra"]:
            fix = (
                "an extra repository lands in <volume>/weights/<last component of its name>, and the entries of one "
                "model share its volume: keep one of the two"
            )
        else:
            fix = "an extra repository cannot be named like the model's weights directory: drop it"
        raise PlanError(
            f"{host}: {_claim_text(held)} and {_claim_text(claim)} would share one directory, {claim['dest']}, so "
            f"one of them would be served the other's weights. Nothing was fetched. Fix: {fix}."
        )


def _claim_text(claim: Mapping[str, Any]) -> str:
    return f"{claim['repo']}@{claim['revision'] or '(no revision)'} ({claim['what']})"


def _extra_work(
    entry: Mapping[str, Any],
    spec: Mapping[str, Any],
    expected: Mapping[str, Any],
    item: Mapping[str, Any],
    sources: Sequence[str],
    options: Mapping[str, Any],
    plan_weights: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> JSON:
    """The work entry of an extra repository (a draft model): pinned, fetched like the main weights, shared.

    It lands in ``<volume>/weights/<repository name>``, beside the model's weights.
    """
    repo = str(item["repo"])
    revision = str(item["revision"])
    path = str(item.get("path") or "")
    wanted = list(item.get("sources") or [source for source in sources if source in FETCHING])
    source = "path" if path else next((source for source in wanted if source in ("hf", "s3")), None)
    if source is None:
        raise PlanError(
            f"{options['host']}: tt_models entry {entry['name']}: extra repository {repo} has no source to fetch it "
            f"from (sources {', '.join(sources)}); add hf or s3 to the entry's sources, or give the item a path."
        )
    name = repo.rsplit("/", 1)[-1]
    dest = extra_dest(spec, repo)
    request = {"dest": dest, "source": source, "repo_id": repo, "revision": revision, "path": path or None}
    weights = plan_weights(request)
    work = _work_entry(
        f"{entry['name']}--{name}",
        source,
        weights,
        expected,
        options,
        repo=repo,
        revision=revision,
        path=path,
        dest=dest,
        shareable=bool(options.get("peers") and source != "path"),
    )
    # A path source records no commit; the item pins one.
    work["revision"] = work["revision"] or revision
    work["extra_of"] = entry["name"]
    return work


def disk_shortfalls(work: Iterable[Mapping[str, Any]], margin_bytes: int) -> list[JSON]:
    """The filesystems that cannot take all of their models at once (margin included), in order of first use."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for entry in work:
        if entry.get("fs_device") is not None:
            groups.setdefault(entry["fs_device"], []).append(entry)
    short = []
    for entries in groups.values():
        need = sum(int(entry.get("bytes_needed") or 0) for entry in entries)
        free = int(entries[0].get("fs_free") or 0)
        if need > 0 and need + margin_bytes > free:
            short.append(
                {
                    "path": entries[0].get("fs_path"),
                    "models": [entry["model"] for entry in entries],
                    "needed": need + margin_bytes,
                    "free": free,
                }
            )
    return short


def shortfall_text(host: str, short: Sequence[Mapping[str, Any]], margin_gb: float) -> str:
    parts = [
        f"{host}: not enough free space in {fs['path']} for the weights of {', '.join(fs['models'])}: needed "
        f"{fs['needed']} bytes ({fs['needed'] / GIB:.1f} GiB, model_cache_disk_margin_gb {margin_gb:g} included), "
        f"free {fs['free']} bytes ({fs['free'] / GIB:.1f} GiB)."
        for fs in short
    ]
    return " ".join(parts) + (
        " Nothing was written. Free space there, serve fewer models on this host, or put tt_volume_root on a bigger "
        "filesystem."
    )


# ---------------------------------------------------------------------------
# The host (ttfleet.inference.model_cache_plan)

ENTRY_KEYS = ("name", "device", "impl", "engine", "image")
# What a plan fails with: the message names the host, the model or the input, and the fix.
PLAN_ERRORS = (PlanError, SpecError, VolumeError, WeightsError)


def check_entry(entry: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    """The tt_models entry at ``index``, refused when it has no name or a field that is not a string."""
    if not isinstance(entry.get("name"), str) or not entry["name"]:
        raise PlanError(f"models[{index}] has no name; give each tt_models entry the model's name, e.g. Qwen3-32B")
    for key in ENTRY_KEYS[1:]:
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise PlanError(f"tt_models entry {entry['name']}: {key} must be a string, got {entry[key]!r}")
    return entry


def weights_planner(params: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], JSON]:
    """``plan(request)``: the check-mode result of model_weights for one model, with the shared source options."""
    shared = {key: params[key] for key in WEIGHTS_SOURCE_OPTIONS}

    def plan(request: Mapping[str, Any]) -> JSON:
        options = {**shared, **{key: value for key, value in request.items() if value is not None}}
        return sync_weights(options, check_mode=True)

    return plan


def unique_work(records: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """The work entries of ``records`` (each model's, then the extra repositories'), one per weights directory.

    One model served by several instances (one per board, or per profile) shares its volume: one fetch per
    directory, and one slot in the fan-out."""
    records = list(records)
    work: list[JSON] = []
    planned = set()
    for item in [record["work"] for record in records if "work" in record] + [
        extra for record in records for extra in record.get("extras") or []
    ]:
        if item["dest"] not in planned:
            planned.add(item["dest"])
            work.append(item)
    return work


def plan_cache(params: Mapping[str, Any], warn: Callable[[str], object], credentials_error: str | None = None) -> JSON:
    """The result of ttfleet.inference.model_cache_plan for its ``params``: each model resolved once, its volume,
    source and weights planned, the work entries deduplicated and the disks checked. Changes nothing."""
    if credentials_error:
        raise WeightsError(credentials_error)
    if params["disk_margin_gb"] < 0:
        raise PlanError(f"disk_margin_gb must not be negative, got {params['disk_margin_gb']}")
    root = os.path.normpath(check_path_text(params["volume_root"], "volume_root"))
    checkout = default_checkout(params["tt_inference_server_dir"], params["spec_file"])
    catalog = load_params_catalog(params, checkout)
    for warning in catalog.get("warnings", []):
        warn(warning)
    host = params["host"] or os.uname().nodename
    options = {**params, "host": host}
    volumes: list[JSON] | None = None
    releases: list[str] = []
    roots: list[str] = []
    if params["weights"]:
        roots = expand_roots([root, *params["search_roots"]])
        volumes, warnings = scan_roots(roots)
        for warning in warnings:
            warn(warning)
        releases = other_releases(params["release_dirs"], checkout)
    planner = weights_planner(options)
    resolved = []
    for index, raw in enumerate(params["models"]):
        entry = check_entry(raw, index)
        device = entry.get("device") or params["device"]
        validate_inputs(
            model=entry["name"],
            device=device,
            impl=entry.get("impl"),
            engine=entry.get("engine"),
            volume_root=root,
            image=entry.get("image"),
        )
        resolved.append((entry, resolve_entry(catalog, entry, device, volume_root=root)))
    if volumes is not None:
        # Before any origin is listed: one repository and revision per weights directory.
        check_directories(host, [claim for entry, spec in resolved for claim in directory_claims(entry, spec)])
    records = []
    for entry, spec in resolved:
        if volumes is None:
            records.append({"name": entry["name"], "entry": dict(entry), "spec": spec, "kernel": kernel_key(spec)})
            continue
        expected, candidates, warnings = plan_volume(
            root, volumes, spec, releases, warn, isolate=params["kernel_isolation"]
        )
        for warning in warnings:
            warn(warning)
        records.append(plan_model(entry, spec, expected, candidates, options, planner))
    work = unique_work(records)
    short = disk_shortfalls(work, int(params["disk_margin_gb"] * (1 << 30)))
    if short:
        raise PlanError(shortfall_text(host, short, params["disk_margin_gb"]))
    return {
        "changed": False,
        "models": records,
        "work": work,
        "root_exists": root in roots,
        "spec_source": catalog["source"],
    }


def failure_text(exc: BaseException, params: Mapping[str, Any]) -> str:
    """The message of a failed plan (one of PLAN_ERRORS, or an OSError) without the secrets of ``params``."""
    secrets = (params["hf_token"], params["s3_secret_key"], params["s3_session_token"], params["s3_access_key"])
    if isinstance(exc, PLAN_ERRORS):
        return scrub(exc, *secrets)
    return scrub(f"cannot plan the model cache: {exc}", *secrets)
