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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images.fetch import fetch_images
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.options import S3_OPTIONS


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
    apply_proxy_env(module)
    # An S3 or file error is a failure naming it, never a traceback.
    with fail_on(module, any_error="container_image"):
        result = fetch_images(
            module.params,
            module.check_mode,
            module._diff,
            module.warn,
            lambda total: Progress(total, module.params["status_file"]),
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
