# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Model weights in ``weights/<model_name>/``: the whole step the model_weights module runs.

The layout written is a plain ``--local-dir`` snapshot, never the HF cache with its symlinks.

The work is split so that check mode and tests can stop at any stage: ``list_hf_source`` (hub) /
``list_path_source`` (sources) describe the source, ``plan_weights`` (plan) compares it with the destination
and its manifest (reading only), ``check_disk`` refuses before anything is written, ``fetch_hf`` /
``fetch_path`` (fetch) fill a staging directory beside the destination (same filesystem, resumable, root's
0700), ``place_files`` (place) + ``write_manifest`` (manifest) move complete files into place, and
``apply_layout`` gives the weights (and their volume) the ownership layout. ``sync_weights`` runs the stages
in order for the module.

The container user may own the volume, ``weights/`` and the staging directory (an older release, a factory
volume), so every file operation goes through ``_fs``: directory descriptors, no link followed, no
special file opened, random O_EXCL temporary names, owner and mode set on descriptors.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import (
    free_bytes,
    human_bytes,
    nearest_existing,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError, S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import show_origin
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.fetch import fetch_hf, fetch_path
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.hub import Hub, list_hf_source
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import (
    COMMIT_SOURCES,
    build_manifest,
    identity_of,
    manifest_body,
    manifest_digest,
    write_manifest,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    HEX64_RE,
    WeightsError,
    check_repo_id,
    check_revision,
    scrub,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.place import (
    apply_layout,
    clear_staging,
    place_files,
    plan_layout,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.plan import (
    check_disk,
    device_near,
    open_existing,
    plan_weights,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import (
    PeerFiles,
    S3Files,
    list_path_source,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeVar

    from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import ProgressCallback
    from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import JSON, Owner, Patterns

    _T = TypeVar("_T")


ROOT_OWNER = (0, 0)


def _listed(paths: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _summary(plan: JSON, label: str) -> list[str]:
    files_ok = plan["files_total"] - len(plan["to_fetch"])
    lines = [f"source: {label}"]
    lines.append(f"files: {files_ok} of {plan['files_total']} complete ({human_bytes(plan['bytes_total'])} in all)")
    for key in ("missing", "wrong_size", "corrupt", "not_regular"):
        if plan[key]:
            lines.append(f"{key.replace('_', ' ')}: {', '.join(plan[key])}")
    if plan["attrs"]:
        lines.append(f"owner or mode to fix: {_listed(plan['attrs'])}")
    return lines


def diff_of(
    plan: JSON, label: str, manifest_changed: bool, layout: Sequence[str] = (), owner: Owner | None = None
) -> dict[str, str]:
    before = _summary(plan, label)
    before.append(f"manifest: {'matches' if plan['manifest_matches'] else 'absent or for another source'}")
    after = [
        f"source: {label}",
        f"files: {plan['files_total']} of {plan['files_total']} complete ({human_bytes(plan['bytes_total'])} in all)",
    ]
    if plan["to_fetch"]:
        after.append(
            f"fetch: {len(plan['to_fetch'])} files, {human_bytes(plan['bytes_to_fetch'])} to move "
            f"({human_bytes(plan['bytes_staged'])} already staged)"
        )
    if plan["attrs"]:
        who = f"owner {owner[0]}:{owner[1]}, " if owner is not None else ""
        after.append(f"owner and modes: {who}directories 0755, files 0644 (0755 with an execute bit)")
    after.append(f"manifest: {'written' if manifest_changed else 'matches'}")
    if layout:
        before.extend(f"volume: {change}" for change in layout)
        after.append("volume: laid out (weights root's and read-only, the directories the server writes its own)")
    return {
        "before_header": plan["dest"],
        "after_header": plan["dest"],
        "before": "\n".join(before) + "\n",
        "after": "\n".join(after) + "\n",
    }


def _manifest_source(
    options: JSON, source: str, repo_id: str | None, allow: Patterns, ignore: Patterns
) -> tuple[PeerFiles | S3Files, str, list[JSON], str, str]:
    """``(files object, revision, file dicts, endpoint, label)`` of an s3 or peer source."""
    if not repo_id:
        raise WeightsError(f"source {source} needs repo_id, e.g. Qwen/Qwen3-32B")
    check_repo_id(repo_id)
    revision = options.get("revision")
    check_revision(repo_id, revision, options.get("allow_floating_revision"))
    if not revision:
        raise WeightsError(f"source {source} needs revision, the commit (or, floating, the name) the copy was made at")
    files_at: PeerFiles | S3Files
    if source == "peer":
        files_at = PeerFiles(options.get("peer_url"), options.get("timeout") or 60)
        label = f"{files_at.name} ({repo_id}@{revision})"
    else:
        missing = [
            name for name in ("s3_endpoint", "s3_bucket", "s3_access_key", "s3_secret_key") if not options.get(name)
        ]
        if missing:
            raise WeightsError(f"source s3 needs {', '.join(missing)}; set them (keep the keys in a vault)")
        try:
            client = S3Client.from_options(options)
        except S3Error as exc:
            raise WeightsError(str(exc)) from None
        files_at = S3Files(client, options["s3_bucket"], options.get("s3_prefix"), repo_id, revision)
        label = f"s3 {repo_id}@{revision} from s3://{options['s3_bucket']}/{files_at.base} at {client.endpoint}"
    files = files_at.list(repo_id, revision, allow, ignore)
    check_anchor(options.get("expected_manifest_sha256"), files, repo_id, revision, files_at.name)
    # A peer's URL holds its token: the manifest records the peer's origin only.
    endpoint = show_origin(files_at.base) if source == "peer" else files_at.endpoint
    return files_at, revision, files, endpoint, label


def check_anchor(expected: str | None, files: Sequence[JSON], repo_id: str, revision: str, holder: str) -> None:
    """Refuse the files a holder (a peer, a bucket) lists unless their manifest digest is ``expected``, the one the
    hosts that read the origin returned (``manifest_sha256``). The holder's own manifest is no anchor: whoever
    rewrites its files rewrites it too. Nothing to check when ``expected`` is empty."""
    if not expected:
        return
    if not HEX64_RE.match(expected):
        raise WeightsError(
            f"expected_manifest_sha256 {printable(expected, 80)!r} for {repo_id}@{revision} is not a lower-case "
            "sha256; pass the manifest_sha256 that model_weights returned on a host that read the origin"
        )
    got = manifest_digest(repo_id, revision, files)
    if got != expected:
        raise WeightsError(
            f"{holder} serves a manifest of {repo_id}@{revision} whose digest is {got}, not the {expected} of the "
            "origin's files (expected_manifest_sha256): its files are not the origin's, so nothing was taken from "
            "it. Find out what changed that holder's weights; the next holder is asked, or fetch from the origin"
        )


def _owner_of(options: JSON, key: str, group_key: str, default: _T) -> Owner | _T:
    uid = options.get(key)
    if uid is None:
        return default
    gid = options.get(group_key)
    return (uid, uid if gid is None else gid)


def sync_weights(
    options: JSON,
    check_mode: bool = False,
    callback: ProgressCallback | None = None,
    hub: Hub | S3Files | None = None,
) -> JSON:
    """The module's step. For a peer source with ``peer_fallback_urls``, the peers are asked in turn: when one
    fails (it stopped, died mid-file, sent a wrong byte), the next one is asked for what is still missing. The
    staging directory survives a failed attempt, so a cut file resumes with a Range request at the byte where
    the last peer stopped, and complete staged files are not fetched again. Returns the result of the peer that
    finished, with ``peer`` (its origin, never the token) and ``peer_failures`` (one line per failed peer).
    """
    fallbacks = [url for url in options.get("peer_fallback_urls") or [] if url]
    if (options.get("source") or "hf") == "peer" and not options.get("peer_url") and not fallbacks:
        raise WeightsError(
            f"no peer serves {options.get('repo_id')}@{options.get('revision')}: peer_url and peer_fallback_urls "
            "are empty (the holders failed before they could serve); fetch from the origin instead"
        )
    if (options.get("source") or "hf") != "peer" or not fallbacks or check_mode:
        result = _sync_one(options, check_mode, callback, hub)
        if (options.get("source") or "hf") == "peer":
            result.update(peer=_peer_origin(options.get("peer_url")), peer_failures=[])
        return result
    failures: list[str] = []
    urls = [url for url in [options.get("peer_url"), *fallbacks] if url]
    for url in urls:
        try:
            result = _sync_one({**options, "peer_url": url, "peer_fallback_urls": []}, check_mode, callback, None)
        except WeightsError as exc:
            failures.append(str(exc))
            continue
        result.update(peer=_peer_origin(url), peer_failures=failures)
        return result
    raise WeightsError(
        f"every peer failed for {options.get('repo_id')}@{options.get('revision')} ({len(urls)} asked; the files "
        f"they sent in full are kept in staging for the next run): " + " | ".join(failures)
    )


def _peer_origin(url: str | None) -> str:
    """scheme://host:port of a peer URL: its path holds the server's token."""
    try:
        return show_origin(url) if url else ""
    except (ValueError, NetError):
        return ""


def _sync_one(
    options: JSON,
    check_mode: bool = False,
    callback: ProgressCallback | None = None,
    hub: Hub | S3Files | None = None,
) -> JSON:
    """Plan, and unless ``check_mode`` fetch, place and record the weights, then give them (and, with
    ``container_owner``, their volume) the ownership layout. Returns the module's result.

    ``options`` holds the module's parameters (see plugins/modules/model_weights.py). ``callback`` gets
    ``(done_bytes, total_bytes, file)`` while bytes move.
    """
    dest = os.path.normpath(options["dest"])
    if not os.path.isabs(dest):
        raise WeightsError(f"dest {dest!r} must be an absolute path")
    source = options.get("source") or "hf"
    owner = _owner_of(options, "owner", "group", ROOT_OWNER)
    container = _owner_of(options, "container_owner", "container_group", None)
    if container is not None and os.path.basename(os.path.dirname(dest)) != "weights":
        raise WeightsError(
            f"dest {dest} is not <volume>/weights/<model>; container_owner lays out a tt-inference-server volume, "
            "so give the weights directory of one (or leave container_owner unset)"
        )
    workers = options.get("workers") or min(8, os.cpu_count() or 1)
    allow, ignore = options.get("allow_patterns"), options.get("ignore_patterns")
    host = options.get("host") or socket.gethostname()
    repo_id = options.get("repo_id")
    token = options.get("hf_token")
    secrets_seen = (
        token,
        options.get("s3_secret_key"),
        options.get("s3_session_token"),
        options.get("s3_access_key"),
    )
    plan = None
    try:
        if options.get("expected_manifest_sha256") and source not in ("s3", "peer"):
            raise WeightsError(
                f"expected_manifest_sha256 is for source peer or s3 (a holder's copy), not {source}; the {source} "
                "source is the origin the digest comes from, so leave it unset there"
            )
        if source in ("s3", "peer"):
            hub, sha, files, endpoint, label = _manifest_source(options, source, repo_id, allow, ignore)
            identity = identity_of(source, repo_id, sha)
        elif source == "hf":
            if not repo_id:
                raise WeightsError("source hf needs repo_id, e.g. Qwen/Qwen3-32B")
            # A hub passed in is a Hub (S3Files only comes from _manifest_source, for the other sources).
            hub = cast("Hub | None", hub) or Hub(options.get("hf_endpoint"), token, options.get("timeout") or 60)
            sha, files = list_hf_source(
                hub, repo_id, options.get("revision"), options.get("allow_floating_revision"), allow, ignore
            )
            identity = identity_of("hf", repo_id, sha)
            endpoint = hub.endpoint
            label = f"hf {repo_id}@{sha} from {scrub(endpoint)}"
        elif source == "none":
            # Weights already in place (a preseeded or aliased volume): nothing is listed, fetched or recorded.
            dest_fd = open_existing(dest)
            if dest_fd is None:
                raise WeightsError(
                    f"dest {dest} does not exist; source none only gives weights already in place their owner, "
                    "modes and volume layout"
                )
            os.close(dest_fd)
            sha, files, endpoint, identity, label = None, [], None, {"source": "none"}, "none (the files in place)"
        else:
            root = options.get("path")
            if not root or not os.path.isabs(root):
                raise WeightsError(f"source path needs path, an absolute directory (got {root!r})")
            root = os.path.normpath(root)
            if os.path.realpath(root) == os.path.realpath(dest):
                raise WeightsError(f"path {root} is dest itself; point path at another copy of the model")
            sha, files, endpoint = None, list_path_source(root, allow, ignore), None
            identity = identity_of("path", repo_id, path=root)
            label = f"path {root}"
        if not files and source != "none":
            raise WeightsError(
                f"{label} has no files left after allow_patterns {list(allow or [])} and ignore_patterns "
                f"{list(ignore or [])}; check repo_id, revision and the patterns"
            )
        plan = plan_weights(files, dest, identity, options.get("verify") or "auto", workers, owner, endpoint)
        if source == "none":
            plan["extra"] = []
        layout = plan_layout(dest, owner, container)
        margin = int(float(options.get("disk_margin_gb", 10)) * (1 << 30))
        check_disk(dest, plan["bytes_needed"], margin, host, f"the weights of {repo_id or label}")
        probe = nearest_existing(dest)
        filesystem = {"device": device_near(probe), "free_bytes": free_bytes(probe), "path": probe}

        stats = {"fetched_bytes": 0, "restarts": 0, "files": []}
        if plan["to_fetch"] and not check_mode:
            progress = Progress(plan["bytes_to_fetch"], options.get("status_file"), callback)
            parent_fd = make_path(os.path.dirname(dest), owner=owner)
            os.close(parent_fd)
            try:
                if source in COMMIT_SOURCES:
                    # A commit source (hf, s3, peer) has set hub, repo_id and sha above.
                    stats = fetch_hf(cast("Hub | S3Files", hub), cast(str, repo_id), cast(str, sha), plan, progress)
                else:
                    stats = fetch_path(plan, progress, workers, owner)
            finally:
                progress.write(state="stopped")
            place_files(plan, owner)
            progress.write(state="done")

        verified_at = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            if plan["hashed"] or plan["to_fetch"]
            else ((plan["manifest"] or {}).get("verified_at"))
        )
        manifest = build_manifest(identity, plan["files"], endpoint, verified_at, source)
        manifest_changed = source != "none" and (
            manifest_body(manifest) != manifest_body(plan["manifest"]) or not plan["manifest_matches"]
        )
        if not check_mode and manifest_changed:
            write_manifest(dest, manifest, owner)
        # The layout comes last, once the weights are complete and verified: a volume that an older release
        # (or the factory) gave to the container user is re-owned here, idempotently.
        skipped = [rel for rel in plan["skipped"] if not (manifest_changed and rel == MANIFEST_NAME)]
        if not check_mode and (plan["to_fetch"] or plan["attrs"] or layout or manifest_changed):
            skipped = apply_layout(dest, owner, container)
    except WeightsError as exc:
        raise WeightsError(scrub(exc, *secrets_seen)) from None
    except SafeFileError as exc:
        raise WeightsError(scrub(f"{host}: {exc}; move it away and run again", *secrets_seen)) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC and plan is not None and not check_mode:
            # The filesystem filled up after the preflight (another writer): keep no partial file in the volume.
            clear_staging(plan["staging"])
            where = nearest_existing(dest)
            raise WeightsError(
                scrub(
                    f"{host}: the filesystem of {where} filled up while writing the weights of {repo_id or dest} "
                    f"into {dest}: they need {human_bytes(plan['bytes_needed'])} ({plan['bytes_needed']} bytes) and "
                    f"{human_bytes(free_bytes(where))} ({free_bytes(where)} bytes) are free with the partial files "
                    "removed. Free space there (something else is filling it) or move the volume, then run again",
                    *secrets_seen,
                )
            ) from None
        raise WeightsError(
            scrub(f"{host}: writing the weights of {repo_id or dest} failed: {exc}", *secrets_seen)
        ) from None

    changed = bool(plan["to_fetch"] or plan["attrs"] or manifest_changed or layout)
    anchor = manifest_digest(repo_id, sha, plan["files"]) if source in COMMIT_SOURCES else None
    return {
        "changed": changed,
        "dest": dest,
        "plan": {
            "source": label,
            "revision": sha,
            "files_total": plan["files_total"],
            "bytes_total": plan["bytes_total"],
            "to_fetch": plan["to_fetch"],
            "bytes_to_fetch": plan["bytes_to_fetch"],
            "bytes_staged": plan["bytes_staged"],
            "missing": plan["missing"],
            "wrong_size": plan["wrong_size"],
            "corrupt": plan["corrupt"],
            "extra": plan["extra"],
            "complete": plan["complete"],
            "attrs": plan["attrs"],
            "layout": layout,
        },
        "revision": sha,
        "filesystem": filesystem,
        "bytes_needed": plan["bytes_needed"],
        "fetched_bytes": stats["fetched_bytes"],
        "restarts": stats["restarts"],
        "hashed": plan["hashed"],
        "verified": plan["verified"],
        "manifest": os.path.join(dest, MANIFEST_NAME),
        "manifest_sha256": anchor,
        "skipped": skipped,
        "diff": diff_of(plan, label, manifest_changed, layout, owner),
    }
