# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Harvest: pack the complete kernel cache of a warmed-up host into a store, with evidence of the warm-up."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.error
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.archive import find_zstd, pack
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import split_userinfo
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    KernelError,
    cache_path,
    check_key,
    key_mismatch,
    key_text,
    mismatch_text,
    refusing,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.local import (
    open_cache,
    open_parent,
    read_marker,
    write_marker,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import build_manifest, check_manifest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import (
    DEFAULT_TEMP_PATTERNS,
    completeness_problems,
    empty_scan,
    scan_cache,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import open_url
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import hide_userinfo, printable

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypeAlias

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.holders import HolderChain
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.s3_store import S3Store

    Store: TypeAlias = "PathStore | HttpStore | S3Store | HolderChain"


HEALTH_TOTAL = 60.0  # the overall limit of the warm-up health check of a harvest


def check_health(url: str, timeout: float = 10, total: float = HEALTH_TOTAL) -> str | None:
    """None when ``url`` answers HTTP 200, else the reason. The body is not read; the check stalls for at most
    ``timeout`` seconds and lasts at most ``total``; a broken answer (not HTTP, reset) is a reason, not a crash."""
    shown = printable(hide_userinfo(url), 300)
    target, credentials = split_userinfo(url)
    deadline = Deadline(total=total, stall=timeout, what="the health check")
    try:
        resp = open_url(target, deadline, credentials=credentials)
    except urllib.error.HTTPError as exc:
        exc.close()
        return f"{shown} answered HTTP {exc.code}"
    except NetError as exc:
        return f"{shown} is unreachable or broken ({exc})"
    with contextlib.closing(resp):
        status = resp.status
    return None if status == 200 else f"{shown} answered HTTP {status}"


@refusing
def harvest(options: Mapping[str, Any], store: Store, check_mode: bool = False, now: float | None = None) -> JSON:
    """Pack the complete cache of ``options['volume']`` into ``store`` unless the store already holds the key."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    volume = os.path.normpath(options["volume"])
    path = cache_path(volume, key)
    force = bool(options.get("force"))
    where = f"{host}:{path}"
    patterns = options.get("temp_patterns") or DEFAULT_TEMP_PATTERNS
    with contextlib.ExitStack() as fds:
        parent_fd = open_parent(volume, key)
        if parent_fd is not None:
            fds.callback(os.close, parent_fd)
        marker_file, marker = read_marker(parent_fd, volume, key)
        if marker is not None and key_mismatch(marker["key"], key):
            raise KernelError(
                f"{mismatch_text(f'the kernel cache {where} (recorded in {marker_file})', marker['key'], key)}. "
                "Fix: harvest with the key of the spec that built it, or warm this host up with the spec to harvest"
            )
        result: JSON = {
            "changed": False,
            "action": "none",
            "cache_path": path,
            "store": store.describe(key),
            "key": key,
        }
        existing = store.read_manifest(key)
        if existing is not None and not force:
            check_manifest(existing, key, f"the store entry {store.describe(key)}")
            result.update(
                reason=(
                    f"the store already holds {key_text(key)} (from {existing.get('host')}, "
                    f"{existing.get('created_at')})"
                ),
                manifest=existing,
            )
            return result

        cache_fd = open_cache(parent_fd, key["mesh"], path)
        if cache_fd is not None:
            fds.callback(os.close, cache_fd)
        scan = empty_scan() if cache_fd is None else scan_cache(cache_fd, patterns)
        problems = completeness_problems(scan, where, options.get("quiet_seconds") or 0, now)
        if marker is not None and not key_mismatch(marker["key"], key):
            evidence = f"marker {marker_file} ({marker.get('evidence') or marker.get('source')})"
        elif options.get("require_marker"):
            problems.append(
                f"{host} holds no record ({marker_file}) that its cache of this key is complete; harvest it there "
                "first (tasks_from: harvest, after a warm-up) or deploy it there from a store"
            )
            evidence = None
        elif options.get("warmed"):
            evidence = "operator flag warmed"
        elif options.get("health_url"):
            why = check_health(options["health_url"], options.get("timeout") or 10)
            if why:
                problems.append(f"no evidence of a successful warm-up: {why}")
            evidence = f"health {options['health_url']}"
        else:
            problems.append("no evidence of a successful warm-up: set health_url to the warmed server's /health URL")
            evidence = None
        if problems:
            raise KernelError(
                f"refusing to harvest the incomplete kernel cache of {key_text(key)}: " + "; ".join(problems) + ". "
                "Fix: harvest after a successful warm-up (health_url answering 200, or warmed: true once you have "
                "checked it), with no server writing to the cache"
            )
        result.update(
            changed=True,
            action="harvested",
            files=scan["files"],
            bytes=scan["bytes"],
            evidence=evidence,
            reason=f"packed {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}",
        )
        if check_mode:
            result["reason"] = f"would pack {scan['files']} files ({human_bytes(scan['bytes'])}) of {where}"
            return result
        zstd = find_zstd(host)
        writer = store.writer(key)
        out_fd = writer.prepare()
        try:
            space = writer.free_bytes()
            if space < scan["bytes"] // 2:
                raise KernelError(
                    f"{host}: the store {store.describe()} has {human_bytes(space)} free, too little for an archive "
                    f"of {human_bytes(scan['bytes'])} of cache; free space there"
                )
            progress = Progress(scan["bytes"], options.get("status_file"))
            # Not None here: a missing cache (or cache_<model_name>) fails completeness_problems, which raises above.
            sha, archive_bytes = pack(
                cast(int, cache_fd), scan, out_fd, zstd, options.get("level") or 3, progress, path
            )
            after = scan_cache(cast(int, cache_fd), patterns)
            if after["entries"] != scan["entries"]:
                raise KernelError(
                    f"the kernel cache {where} changed while it was packed; harvest again once it is idle"
                )
            manifest = build_manifest(key, sha, archive_bytes, scan, host, evidence, now)
            writer.commit(sha, manifest)
            progress.write(state="done")
        except BaseException:
            writer.abort()
            raise
        write_marker(
            cast(int, parent_fd),  # not None: see cache_fd above
            key,
            {
                "key": manifest["key"],
                "sha256": sha,
                "source": "harvest",
                "evidence": evidence,
                "at": manifest["created_at"],
            },
            (options.get("owner", 1000), options.get("group", 1000)),
        )
    result.update(manifest=manifest, sha256=sha, archive_bytes=archive_bytes, hashed=True)
    return result
