#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: container_image
short_description: Fetch the images of a host's instances, with a disk preflight, progress and digests
version_added: 0.2.0
description:
  - Makes sure the host's Docker engine holds every image in O(images), talking to the engine's API on its Unix socket
    (O(docker_socket)), never through a C(docker) command line, so registry credentials stay out of argv.
  - An image the engine already has is not fetched again and nothing is asked of any registry (a converged host costs
    one engine call per image).
  - A missing image comes from its O(images[].archive) (an air-gapped site - a C(docker save) tarball on the host, or
    the object O(images[].archive_s3_key) in S3), else from its registry. Before any byte moves, the registry is asked
    for the image's manifest (the credentials are checked there, and a refusal names the registry and the image) and
    the compressed sizes of its layers; all missing images must then fit in the free space of the engine's data
    directory (C(DockerRootDir)) times O(expansion).
  - The pull goes through the engine (its own retries and resumption apply) with the credentials root stored for that
    registry in O(docker_config) (ttfleet.inference.registry_auth), sent in the C(X-Registry-Auth) header.
  - Each image's digest is read back from the engine (C(RepoDigests)); RV(images[].pinned) is C(name:tag@digest) for
    the serve role to run exactly that content.
  - The action plugin prints bytes done and total, rate and ETA while images are fetched
    (C(ttfleet_progress_interval)), as for weights.
extends_documentation_fragment:
  - ttfleet.inference.proxy
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports which images would be fetched and their bytes (asking the registry for their manifests; when it cannot
        be reached the bytes are unknown and a warning says why). Fetches nothing.
  diff_mode:
    support: full
    details:
      - The diff lists each image, present or to be fetched with its source and bytes.
  idempotent:
    support: full
options:
  images:
    description: The images the host needs.
    type: list
    elements: dict
    required: true
    suboptions:
      image:
        description: The reference to fetch and run (after the site's registry mirrors).
        type: str
        required: true
      origin:
        description: The reference the release's spec names, for messages.
        type: str
      archive:
        description:
          - A C(docker save) tarball on the host to load when the engine lacks the image (a regular file, opened
            without following a link a non-root user could have planted).
          - Root loads it and the unit runs what it holds, so without O(images[].archive_sha256) it must be owned by
            root and lie where no other user can write at any level (every directory from C(/) down owned by root
            and not writable by its group or others); otherwise it is refused before any byte reaches the engine,
            naming the level and its owner.
        type: path
      archive_sha256:
        description:
          - Pins O(images[].archive) (or the S3 object) by sha256, recommended for every archive and required for
            one in a directory that a non-root user can write. Either the image ID (the sha256 of the image's config,
            the C(Id) of C(docker image inspect IMAGE) where it was saved) or the archive file's own sha256
            (C(sha256sum)); with or without the C(sha256:) prefix.
          - A local archive is checked before the load (its image ID is read from its C(manifest.json) and the config
            it names; otherwise the whole file is hashed); after the load the engine's image ID must be the expected
            one, or the image is removed again and the task fails, naming the archive.
        type: str
      archive_s3_key:
        description: The key of such a tarball in the S3 bucket O(s3_bucket), streamed into the engine.
        type: str
      size:
        description:
          - Bytes the image is known to have (its config and compressed layers), reported in check mode when the
            registry cannot tell yet (the serve role passes what a planned site copy will put there).
        type: int
  pull:
    description: Whether a missing image without an archive may be pulled from its registry.
    type: bool
    default: true
  docker_socket:
    description: The Docker engine's API socket.
    type: path
    default: /var/run/docker.sock
  docker_config:
    description: Docker's client config of root, where registry credentials are stored (mode 0600).
    type: path
    default: /root/.docker/config.json
  certs_dir:
    description: Docker's directory of registry CAs (C(<certs_dir>/<registry>/ca.crt)), also trusted for manifests.
    type: path
    default: /etc/docker/certs.d
  expansion:
    description: Bytes of disk needed per byte of compressed layers (the download plus the unpacked layers).
    type: float
    default: 2.5
  stall_timeout:
    description: Seconds the pull may go without a progress message from the engine before it is abandoned.
    type: int
    default: 300
  timeout:
    description: Seconds for a registry answer (a manifest, a token).
    type: int
    default: 60
  status_file:
    description: Where progress is written as JSON while images are fetched (the action plugin sets it).
    type: path
  s3_endpoint:
    description: S3 endpoint of O(images[].archive_s3_key).
    type: str
  s3_bucket:
    description: Bucket of O(images[].archive_s3_key).
    type: str
  s3_prefix:
    description: Prefix of the keys in the bucket.
    type: str
    default: ''
  s3_region:
    description: Region used to sign S3 requests.
    type: str
    default: us-east-1
  s3_access_key:
    description: S3 access key.
    type: str
  s3_secret_key:
    description: S3 secret key.
    type: str
  s3_session_token:
    description: S3 session token.
    type: str
  s3_ca_bundle:
    description: CA bundle for the S3 endpoint.
    type: path
  s3_verify:
    description: Whether the S3 endpoint's certificate is verified.
    type: bool
    default: true
notes:
  - A registry that stops mid-pull makes the engine retry; when it stays away the pull fails with the engine's error,
    layers already complete stay in the engine, and the next run fetches only the rest. Nothing running is touched.
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Fetch the images of the instances
  ttfleet.inference.container_image:
    images:
      - image: registry.site.example:5000/tenstorrent/tt-inference-server/tt-media-inference-server:0.20.0-b204341
        origin: ghcr.io/tenstorrent/tt-inference-server/tt-media-inference-server:0.20.0-b204341

- name: Load an image from a tarball at an air-gapped site
  ttfleet.inference.container_image:
    images:
      - image: ghcr.io/tenstorrent/tt-media-inference-server:0.20.0-b204341
        archive: /srv/images/tt-media-inference-server-0.20.0.tar
"""

RETURN = r"""
seconds:
  description: How long the module ran.
  returned: always
  type: float
images:
  description: Per image, what the host has now.
  returned: always
  type: list
  elements: dict
  contains:
    image:
      description: The reference.
      type: str
    origin:
      description: The reference the spec names.
      type: str
    source:
      description: V(present) (nothing fetched), V(registry), V(archive) or V(s3).
      type: str
    id:
      description: The engine's image id (V(null) in check mode for an image to fetch).
      type: str
    digest:
      description: The registry digest of the image's repository, or V(null) (an image loaded from an archive).
      type: str
    pinned:
      description: C(name:tag@digest) when the digest is known, else the reference.
      type: str
    bytes:
      description: Bytes fetched (or, in check mode, to fetch; V(null) when unknown).
      type: int
bytes:
  description: Bytes fetched, or in check mode to fetch, in all.
  returned: always
  type: int
"""

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes, human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images import (
    Engine,
    EngineAbsent,
    ImageError,
    Registry,
    archive_writers,
    check_archive_pin,
    check_pin,
    parse_reference,
    read_auth,
    repo_digest,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.options import S3_OPTIONS


def _plan(
    params: dict[str, Any], engine: Engine, check_mode: bool, warn: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Per image: the engine's record, and for a missing one its source and size."""
    plan = []
    registries = {}
    absent: list[bool] = []
    for item in params["images"]:
        ref = parse_reference(item["image"], "images[].image")
        entry = {"item": item, "ref": ref, "record": _inspect(engine, item["image"], check_mode, warn, absent)}
        entry.update(size=None, source="present")
        plan.append(entry)
        if entry["record"] is not None:
            continue
        pin = check_pin(item["archive_sha256"], f"{ref}: archive_sha256") if item.get("archive_sha256") else None
        entry["pin"] = pin
        if item.get("archive"):
            entry["source"] = "archive"
            entry["handle"], entry["size"], entry["expected_id"] = _open_archive(item["archive"], ref, pin)
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
    return plan


def _open_archive(path: str, ref: Any, pin: str | None) -> tuple[BinaryIO, int, str | None]:
    """(handle, size, image ID to expect or None) of a local archive that may be loaded: root's own, in a tree only
    root can write, or matching its pin. The handle is what gets loaded, so a later swap of the path changes nothing."""
    try:
        fd, st = open_path(path)
    except (OSError, SafeFileError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc.reason
        raise ImageError(
            f"{ref}: its archive {path} cannot be read ({reason}): copy the docker save tarball there or remove archive"
        ) from None
    handle = os.fdopen(fd, "rb")
    try:
        if pin is not None:
            return handle, st.st_size, check_archive_pin(handle, pin, ref, path, "archive_sha256")
        writers = archive_writers(fd)
        if writers:
            raise ImageError(
                f"{ref}: its archive {path} is refused: a non-root user can replace or rewrite it before root loads it "
                f"into the engine, through {'; '.join(writers)}. Move it into a directory only root can write "
                "(owned by root, chmod go-w on every level, the file root's too), or pin it with image_archive_sha256 "
                "(its image ID, the Id of docker image inspect IMAGE where it was saved, or its sha256sum)"
            )
        return handle, st.st_size, None
    except BaseException:
        handle.close()
        raise


def _check_loaded(engine: Engine, entry: dict[str, Any], record: dict[str, Any] | None, streamed: str | None) -> None:
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


def _inspect(
    engine: Engine, image: str, check_mode: bool, warn: Callable[[str], None], absent: list[bool]
) -> dict[str, Any] | None:
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


def _s3_client(params: dict[str, Any]) -> Any:  # an S3Client, imported here so that a run without S3 never loads it
    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

    return S3Client.from_options(params)


def _s3_key(params: dict[str, Any], item: dict[str, Any]) -> str:
    prefix = params["s3_prefix"].strip("/")
    return f"{prefix}/{item['archive_s3_key']}" if prefix else item["archive_s3_key"]


class _Hashing:
    """A reader that hashes what passes through it (an S3 archive is pinned by what was streamed)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.hash = hashlib.sha256()

    def read(self, amount: int) -> bytes:
        data = self.handle.read(amount)
        self.hash.update(data)
        return data

    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def _preflight(params: dict[str, Any], engine: Engine, plan: list[dict[str, Any]]) -> None:
    need = sum(e["size"] or 0 for e in plan if e["source"] != "present")
    if not need:
        return
    root = engine.info().get("DockerRootDir") or "/var/lib/docker"
    free = free_bytes(root)
    wanted = int(need * params["expansion"])
    if free < wanted:
        names = ", ".join(f"{e['ref']} ({human_bytes(e['size'] or 0)})" for e in plan if e["source"] != "present")
        raise ImageError(
            f"the images to fetch need about {human_bytes(wanted)} in {root} ({human_bytes(need)} of compressed layers "
            f"times {params['expansion']}) and it has {human_bytes(free)} free: {names}. Free space there (docker "
            "image prune removes images no container uses) or move the engine's data-root"
        )


def _fetch(params: dict[str, Any], engine: Engine, plan: list[dict[str, Any]], progress: Progress) -> None:
    base = 0
    for entry in plan:
        if entry["source"] == "present":
            continue
        item, ref = entry["item"], entry["ref"]

        def report(done: int, base: int = base, ref: Any = ref) -> None:
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
            hashing = _Hashing(handle) if entry["source"] == "s3" and entry.get("pin") else None
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


def _result(plan: list[dict[str, Any]], check_mode: bool) -> list[dict[str, Any]]:
    images = []
    for entry in plan:
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


def _diff(images: list[dict[str, Any]], check_mode: bool) -> dict[str, str]:
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


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **PROXY_OPTIONS,
            images=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    image=dict(type="str", required=True),
                    origin=dict(type="str"),
                    archive=dict(type="path"),
                    archive_sha256=dict(type="str"),
                    archive_s3_key=dict(type="str", no_log=False),
                    size=dict(type="int"),
                ),
            ),
            pull=dict(type="bool", default=True),
            docker_socket=dict(type="path", default="/var/run/docker.sock"),
            docker_config=dict(type="path", default="/root/.docker/config.json"),
            certs_dir=dict(type="path", default="/etc/docker/certs.d"),
            expansion=dict(type="float", default=2.5),
            stall_timeout=dict(type="int", default=300),
            timeout=dict(type="int", default=60),
            status_file=dict(type="path"),
            **S3_OPTIONS,
        ),
        supports_check_mode=True,
    )
    params = module.params
    apply_proxy_env(module)
    started = time.monotonic()
    engine = Engine(params["docker_socket"], stall=params["stall_timeout"])
    try:
        plan = _plan(params, engine, module.check_mode, module.warn)
        if not module.check_mode:
            _preflight(params, engine, plan)
            total = sum(e["size"] or 0 for e in plan if e["source"] != "present")
            progress = Progress(total, params["status_file"])
            _fetch(params, engine, plan, progress)
            if total:
                progress.write(state="done")
    except ImageError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # an S3 or file error: a failure naming it, never a traceback
        module.fail_json(msg=f"container_image: {type(exc).__name__}: {exc}")
    images = _result(plan, module.check_mode)
    changed = any(image["source"] != "present" for image in images)
    result = {
        "changed": changed,
        "images": images,
        "bytes": sum(image["bytes"] or 0 for image in images),
    }
    result["seconds"] = round(time.monotonic() - started, 2)
    if module._diff:
        result["diff"] = _diff(images, module.check_mode)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
