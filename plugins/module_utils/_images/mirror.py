# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What ``image_mirror`` does: copy images from their origin (after the ``upstream`` mapping) into the site registry,
each blob the target lacks read once and verified while it streams, then the manifest byte for byte.

Each request carries the credentials of the registry it actually goes to, and no other's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import Login, check_logins
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    ImageError,
    map_image,
    parse_reference,
    registry_host,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._images.registry import Registry, VerifyingReader

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._images.fetch import Meter

    JSON = dict[str, Any]


def _client(
    cache: dict[str, Registry],
    registry: str,
    logins: Mapping[str, Login],
    params: Mapping[str, Any],
    targets: set[str],
) -> Registry:
    """The client of ``registry``, with the credentials (and CA) set for that registry and no other's."""
    if registry not in cache:
        login = logins.get(registry)
        ca_data = params["target_ca_cert"] if registry in targets else None
        cache[registry] = Registry(
            registry,
            login.auth if login else None,
            plain_http=registry in params["plain_http"],
            certs_dir=params["certs_dir"],
            timeout=params["timeout"],
            stall=min(params["timeout"], 60),
            ca_data=ca_data or (login.ca_cert if login else None),
        )
    return cache[registry]


def logins_of(params: Mapping[str, Any], targets: set[str]) -> dict[str, Login]:
    """``{registry: Login}``: registry_credentials, plus the deprecated per-side options bound to their registry (the
    source's to source_registry, the target's to the one registry of the targets)."""
    logins = check_logins(params["registry_credentials"], "registry_credentials")
    legacy = []
    if params["source_username"] or params["source_password"] is not None:
        if not params["source_username"] or params["source_password"] is None or not params["source_registry"]:
            raise ImageError(
                "source_username and source_password belong to one registry and are never sent to every origin: give "
                "both with source_registry (the host[:port] read from, after upstream), or use registry_credentials"
            )
        legacy.append(("source", registry_host(params["source_registry"], "source_registry")))
    if params["target_username"] or params["target_password"] is not None:
        if len(targets) != 1 or not params["target_username"] or params["target_password"] is None:
            raise ImageError(
                f"target_username and target_password are for one site registry, and the targets name "
                f"{', '.join(sorted(targets))}: give both, or use registry_credentials with an entry per registry"
            )
        legacy.append(("target", next(iter(targets))))
    for side, registry in legacy:
        if registry in logins:
            raise ImageError(
                f"{side}_username and registry_credentials both set credentials for {registry}: keep one of them"
            )
        logins[registry] = Login(params[f"{side}_username"], params[f"{side}_password"])
    return logins


def plan(params: Mapping[str, Any]) -> list[JSON]:
    """Per pair: both registries' clients, the source's manifest, and the blobs the target lacks (none when the target
    tag already holds the source's digest)."""
    clients: dict[str, Registry] = {}
    work = []
    pairs = []
    for pair in params["images"]:
        read_from, _prefix = map_image(pair["source"], params["upstream"], "images[].source")
        source = parse_reference(read_from, "images[].source")
        target = parse_reference(pair["target"], "images[].target")
        if target.digest or not target.tag:
            raise ImageError(f"images[].target {pair['target']!r}: give the site registry's reference with a tag")
        pairs.append((pair, source, target))
    targets = {target.registry for _pair, _source, target in pairs}
    logins = logins_of(params, targets)
    for pair, source, target in pairs:
        # Looked up by the registry each request goes to: an upstream proxy is not the origin.
        src = _client(clients, source.registry, logins, params, targets)
        dst = _client(clients, target.registry, logins, params, targets)
        resolved = src.resolve(source.path, source.reference)
        digest = resolved.get("platform_digest") or resolved["digest"]
        _body, _media, have = dst.manifest(target.path, str(target.tag), method="HEAD", missing_ok=True)
        entry: JSON = {
            "pair": pair,
            "source": source,
            "target": target,
            "src": src,
            "dst": dst,
            "resolved": resolved,
            "digest": digest,
            "present": have == digest,
            "missing": [],
        }
        if not entry["present"]:
            entry["missing"] = [b for b in resolved["blobs"] if not dst.has_blob(target.path, b["digest"])]
        work.append(entry)
    return work


def copy(work: list[JSON], progress: Meter) -> None:
    """Streams each missing blob from the origin to the site registry, then puts the manifest."""
    for entry in work:
        if entry["present"]:
            continue
        source, target, src, dst = entry["source"], entry["target"], entry["src"], entry["dst"]

        def report(count: int, ref: object = target) -> None:
            progress.advance(count, str(ref))

        for blob in entry["missing"]:
            resp = src.open_blob(source.path, blob["digest"], blob["size"])
            with resp:
                reader = VerifyingReader(resp, blob["digest"], blob["size"], report=report)
                dst.upload_blob(target.path, blob["digest"], blob["size"], reader)
                reader.finish()
        resolved = entry["resolved"]
        body = resolved.get("platform_manifest") or resolved["manifest"]
        media = resolved.get("platform_media_type") or resolved["media_type"]
        pushed = dst.put_manifest(target.path, target.tag, body, media)
        if pushed and pushed != entry["digest"]:
            raise ImageError(f"{target}: the site registry stored digest {pushed}, not the origin's {entry['digest']}")


def mirror_images(params: Mapping[str, Any], check_mode: bool, with_diff: bool, meter: Callable[[int], Meter]) -> JSON:
    """The whole of ``image_mirror``: its result (``changed``, ``images``, ``origin_bytes``, ``seconds``, ``diff``).

    ``meter(total)`` makes the progress of a copy of ``total`` bytes (not called in check mode)."""
    started = time.monotonic()
    work = plan(params)
    total = sum(b["size"] for entry in work for b in entry["missing"])
    if not check_mode:
        progress = meter(total)
        copy(work, progress)
        if total:
            progress.write(state="done")
    images = [
        {
            "source": entry["pair"]["source"],
            "target": entry["pair"]["target"],
            "digest": entry["digest"],
            "copied_bytes": sum(b["size"] for b in entry["missing"]),
            "image_bytes": entry["resolved"]["bytes"],
            "blobs_copied": len(entry["missing"]),
        }
        for entry in work
    ]
    result: JSON = {
        "changed": any(not entry["present"] for entry in work),
        "images": images,
        "origin_bytes": sum(image["copied_bytes"] for image in images),
    }
    result["seconds"] = round(time.monotonic() - started, 2)
    if with_diff:
        result["diff"] = {
            "before": "".join(f"{e['pair']['target']}: {'present' if e['present'] else 'absent'}\n" for e in work),
            "after": "".join(
                f"{e['pair']['target']}: {e['digest']}"
                + ("" if e["present"] else f" (copy {human_bytes(sum(b['size'] for b in e['missing']))})")
                + "\n"
                for e in work
            ),
        }
    return result
