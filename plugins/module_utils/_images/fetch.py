# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What ``container_image`` does: the images a host's engine lacks, where each comes from (its archive, S3 or its
registry) and its size, a disk preflight, the fetch with progress, and the result and diff.

An image the engine already has costs one engine call and nothing is asked of a registry. Before any byte moves, the
registry is asked for the manifest (its credentials are checked there) and the sizes of its layers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes, human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._images.archive import HashingReader, open_archive
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import read_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    ImageError,
    check_pin,
    parse_reference,
    repo_digest,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._images.registry import Registry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

    JSON = dict[str, Any]
    Warn = Callable[[str], object]


class Meter(Protocol):
    """What the fetch reports progress to (``_host.progress.Progress``: the module makes one with its status file)."""

    done: int

    def advance(self, count: int, file: str) -> None:
        ...

    def write(self, now: float | None = None, state: str = "running") -> None:
        ...


def plan(params: Mapping[str, Any], engine: Engine, check_mode: bool, warn: Warn) -> list[JSON]:
    """Per image: the engine's record, and for a missing one its source and size."""
    entries = []
    registries: dict[str, Registry] = {}
    absent: list[bool] = []
    for item in params["images"]:
        ref = parse_reference(item["image"], "images[].image")
        entry: JSON = {"item": item, "ref": ref, "record": _inspect(engine, item["image"], check_mode, warn, absent)}
        entry.update(size=None, source="present")
        entries.append(entry)
        if entry["record"] is not None:
            continue
        pin = check_pin(item["archive_sha256"], f"{ref}: archive_sha256") if item.get("archive_sha256") else None
        entry["pin"] = pin
        if item.get("archive"):
            entry["source"] = "archive"
            entry["handle"], entry["size"], entry["expected_id"] = open_archive(item["archive"], ref, pin)
            continue
        if item.get("archive_s3_key"):
            entry["source"] = "s3"
            entry["size"] = _s3_client(params).head_object(params["s3_bucket"], _s3_key(params, item))
            if entry["size"] is None:
                raise ImageError(f"{ref}: s3://{params['s3_bucket']}/{_s3_key(params, item)} does not exist")
            entry["size"] = entry["size"]["size"]
            continue
        if not params["pull"]:
            raise ImageError(
                f"image {ref} is not on the host and pulls are off: give it an archive or allow pulls "
                "(serve_image_pull)"
            )
        entry["source"] = "registry"
        if ref.registry not in registries:
            registries[ref.registry] = Registry(
                ref.registry,
                read_auth(params["docker_config"], ref.registry),
                certs_dir=params["certs_dir"],
                timeout=params["timeout"],
                stall=min(params["timeout"], 60),
            )
        try:
            resolved = registries[ref.registry].resolve(ref.path, ref.reference)
        except ImageError as exc:
            if not check_mode:
                raise
            entry["size"] = item.get("size")
            if entry["size"] is None:
                warn(f"{ref}: {exc}; its size is unknown")
            continue
        entry["size"] = resolved["bytes"]
        entry["auth"] = registries[ref.registry].auth
    return entries


def _check_loaded(engine: Engine, entry: JSON, record: JSON | None, streamed: str | None) -> None:
    """After a load: the engine's image must be the pinned one, else the reference is removed and the task fails."""
    ref, item = entry["ref"], entry["item"]
    expected, pin = entry.get("expected_id"), entry.get("pin")
    image_id = (record or {}).get("Id")
    if pin is None or image_id == (expected or pin) or (expected is None and streamed == pin):
        return
    engine.remove(item["image"])
    raise ImageError(
        f"the archive of {ref} ({item.get('archive') or item.get('archive_s3_key')}) loaded image ID {image_id}, not "
        f"the pinned {expected or pin} (archive_sha256): the archive changed while it was loaded; the image was "
        "removed again. Put the right archive back"
    )


def _inspect(engine: Engine, image: str, check_mode: bool, warn: Warn, absent: list[bool]) -> JSON | None:
    """The engine's record of image; in check mode a host whose engine is not there yet (tt_host installs it in the same
    run) has none of its images."""
    try:
        return engine.inspect(image)
    except EngineAbsent as exc:
        if not check_mode:
            raise
        if not absent:
            warn(f"{exc}; check mode counts every image as to fetch")
            absent.append(True)
        return None


def _s3_client(params: Mapping[str, Any]) -> S3Client:  # imported here so that a run without S3 never loads it
    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

    return S3Client.from_options(params)


def _s3_key(params: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    prefix = str(params["s3_prefix"]).strip("/")
    key = str(item["archive_s3_key"])
    return f"{prefix}/{key}" if prefix else key


def preflight(params: Mapping[str, Any], engine: Engine, entries: list[JSON]) -> None:
    """Refuses a fetch whose images (times ``expansion``) do not fit in the engine's data directory."""
    need = sum(e["size"] or 0 for e in entries if e["source"] != "present")
    if not need:
        return
    root = engine.info().get("DockerRootDir") or "/var/lib/docker"
    free = free_bytes(root)
    wanted = int(need * params["expansion"])
    if free < wanted:
        names = ", ".join(f"{e['ref']} ({human_bytes(e['size'] or 0)})" for e in entries if e["source"] != "present")
        raise ImageError(
            f"the images to fetch need about {human_bytes(wanted)} in {root} ({human_bytes(need)} of compressed layers "
            f"times {params['expansion']}) and it has {human_bytes(free)} free: {names}. Free space there (docker "
            "image prune removes images no container uses) or move the engine's data-root"
        )


def fetch(params: Mapping[str, Any], engine: Engine, entries: list[JSON], progress: Meter) -> None:
    """Pulls or loads every image the plan found missing, then reads its record back from the engine."""
    base = 0
    for entry in entries:
        if entry["source"] == "present":
            continue
        item, ref = entry["item"], entry["ref"]

        def report(done: int, base: int = base, ref: object = ref) -> None:
            progress.advance(base + done - progress.done, str(ref))

        if entry["source"] == "registry":
            entry["fetched"] = engine.pull(ref, entry.get("auth"), entry["size"] or 0, report=report)
        else:
            if entry["source"] == "archive":
                handle, size = entry.pop("handle"), entry["size"]
            else:
                resp, _start = _s3_client(params).open_object(
                    params["s3_bucket"], _s3_key(params, item), 0, entry["size"]
                )
                handle, size = resp, entry["size"]
            # Only a pinned S3 archive is judged by what streamed: a local one was checked before the load.
            hashing = HashingReader(handle) if entry["source"] == "s3" and entry.get("pin") else None
            with handle:
                loaded = engine.load(hashing or handle, size, report=report)
            entry["fetched"] = size
            record = engine.inspect(item["image"])
            if record is None:
                raise ImageError(
                    f"the archive of {ref} ({item.get('archive') or item.get('archive_s3_key')}) does not hold it; it "
                    f"loaded {', '.join(loaded) or 'nothing'}: save it with docker save {item.get('origin') or ref}"
                )
            _check_loaded(engine, entry, record, hashing.digest() if hashing else None)
        entry["record"] = engine.inspect(item["image"])
        if entry["record"] is None:
            raise ImageError(f"the engine does not list {ref} after its {entry['source']} fetch")
        base += entry["size"] or entry["fetched"]


def result_images(entries: list[JSON], check_mode: bool) -> list[JSON]:
    """The module's ``images``: per image its source, id, digest, pinned reference and bytes."""
    images = []
    for entry in entries:
        record, ref = entry["record"], entry["ref"]
        digest = repo_digest(record, ref) or (ref.digest if record is not None else None)
        images.append(
            {
                "image": str(entry["item"]["image"]),
                "origin": entry["item"].get("origin") or entry["item"]["image"],
                "source": entry["source"],
                "id": record.get("Id") if record else None,
                "digest": digest,
                "pinned": ref.pinned(digest) if digest and not ref.digest else entry["item"]["image"],
                "bytes": (entry["size"] if check_mode else entry.get("fetched", entry["size"]))
                if entry["source"] != "present"
                else 0,
            }
        )
    return images


def diff(images: list[JSON], check_mode: bool) -> dict[str, str]:
    before, after = [], []
    for image in images:
        if image["source"] == "present":
            line = f"{image['image']}: present"
            before.append(line)
            after.append(line)
            continue
        size = "unknown size" if image["bytes"] is None else human_bytes(image["bytes"])
        before.append(f"{image['image']}: absent")
        after.append(f"{image['image']}: {'to fetch' if check_mode else 'fetched'} from {image['source']} ({size})")
    return {"before": "\n".join(before) + "\n", "after": "\n".join(after) + "\n"}


def fetch_images(
    params: Mapping[str, Any], check_mode: bool, with_diff: bool, warn: Warn, meter: Callable[[int], Meter]
) -> JSON:
    """The whole of ``container_image``: its result (``changed``, ``images``, ``bytes``, ``seconds``, ``diff``).

    ``meter(total)`` makes the progress of a fetch of ``total`` bytes (not called in check mode)."""
    started = time.monotonic()
    engine = Engine(params["docker_socket"], stall=params["stall_timeout"])
    entries = plan(params, engine, check_mode, warn)
    if not check_mode:
        preflight(params, engine, entries)
        total = sum(e["size"] or 0 for e in entries if e["source"] != "present")
        progress = meter(total)
        fetch(params, engine, entries, progress)
        if total:
            progress.write(state="done")
    images = result_images(entries, check_mode)
    result: JSON = {
        "changed": any(image["source"] != "present" for image in images),
        "images": images,
        "bytes": sum(image["bytes"] or 0 for image in images),
    }
    result["seconds"] = round(time.monotonic() - started, 2)
    if with_diff:
        result["diff"] = diff(images, check_mode)
    return result
