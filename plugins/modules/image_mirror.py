#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: image_mirror
short_description: Copy images from their origin into the site registry, each blob read once
version_added: 0.2.0
description:
  - For each pair in O(images), makes the site registry hold O(images[].target) with the content of
    O(images[].source), speaking the registry HTTP API v2 to both (no Docker engine needed on the cache host).
  - A target tag that already holds the source's digest costs one manifest request to each registry and copies
    nothing. Otherwise each blob the target lacks is streamed from the origin to the target once (its sha256 is checked
    while it streams, and the target checks it again), then the manifest is put, byte for byte, so the digest stays
    the origin's. For a multi-platform index only the host platform's image (linux/amd64 on x86_64) is copied and
    tagged.
  - This is the push mirror of the site. Fleet hosts map the origin to it (C(tt_registry_mirrors)) and the origin is
    read once per site, however many hosts pull.
  - The action plugin prints bytes done and total, rate and ETA while blobs are copied.
extends_documentation_fragment:
  - ttfleet.inference.proxy
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Asks both registries and reports the images and bytes that would be copied.
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  images:
    description: Pairs of references.
    type: list
    elements: dict
    required: true
    suboptions:
      source:
        description: The image at its origin (the reference the release's spec names).
        type: str
        required: true
      target:
        description: The image in the site registry.
        type: str
        required: true
  registry_credentials:
    description:
      - Credentials per registry. Each request uses the entry of the registry it actually goes to, C(host[:port])
        after the O(upstream) mapping (a proxy of the origin gets the proxy's entry, never the origin's), and a
        registry without an entry is read anonymously. The username and password go to that registry, and to its
        token service only when that has the registry's own origin (scheme, host and port); a token service
        elsewhere, or a redirect to another origin, gets nothing.
      - The shape of C(tt_registry_credentials); the serve role passes that list.
    type: list
    elements: dict
    default: []
    suboptions:
      registry:
        description: The registry, C(host[:port]) as image references name it (V(ghcr.io), V(registry.example:5000)).
        type: str
        required: true
      username:
        description: Username at that registry.
        type: str
        required: true
      password:
        description: Password or token at that registry.
        type: str
        required: true
      ca_cert:
        description: PEM of the CA of that registry's certificate, trusted for it beside the system CAs.
        type: str
  source_registry:
    description:
      - The one registry (C(host[:port]), after O(upstream)) that O(source_username) and O(source_password) belong to.
        Required with them; they are never sent to another registry.
    type: str
  source_username:
    description:
      - Deprecated, use O(registry_credentials). Username at O(source_registry) only.
    type: str
  source_password:
    description:
      - Deprecated, use O(registry_credentials). Password or token at O(source_registry) only.
    type: str
  target_username:
    description:
      - Deprecated, use O(registry_credentials). Username with push rights at the site registry, the registry of
        every O(images[].target), which must then be one registry.
    type: str
  target_password:
    description: Deprecated, use O(registry_credentials). Its password.
    type: str
  target_ca_cert:
    description: PEM of the CA of the site registry's certificate (the registry of the targets), trusted for it beside
      the system CAs.
    type: str
  upstream:
    description:
      - Where the origins are read from, as registry prefixes mapped to another place, for example the key
        C(ghcr.io) with the value C(proxy.site.example:5000) (a regional mirror or proxy of the origin). Same rules as
        C(tt_registry_mirrors).
    type: dict
    default: {}
  plain_http:
    description:
      - Registries spoken to over plain HTTP. Only for a lab or a registry on a trusted loopback; every other registry
        is HTTPS, its certificate checked against the system CAs and C(<certs_dir>/<registry>/ca.crt).
    type: list
    elements: str
    default: []
  certs_dir:
    description: Docker's registry CA directory.
    type: path
    default: /etc/docker/certs.d
  timeout:
    description: Seconds for a registry answer; a blob gets 300 s plus a second per MiB.
    type: int
    default: 60
  status_file:
    description: Where progress is written as JSON (the action plugin sets it).
    type: path
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Copy the fleet's images into the site registry
  ttfleet.inference.image_mirror:
    images:
      - source: ghcr.io/tenstorrent/tt-inference-server/tt-media-inference-server:0.20.0-b204341
        target: registry.site.example:5000/tenstorrent/tt-inference-server/tt-media-inference-server:0.20.0-b204341
    registry_credentials:
      - registry: registry.site.example:5000
        username: mirror
        password: "{{ vault_site_registry_push_password }}"
      - registry: ghcr.io
        username: fleet-reader
        password: "{{ vault_ghcr_token }}"
  no_log: true
"""

RETURN = r"""
seconds:
  description: How long the module ran.
  returned: always
  type: float
images:
  description: Per pair, the digest and what was copied.
  returned: always
  type: list
  elements: dict
  contains:
    source:
      description: The origin reference.
      type: str
    target:
      description: The site reference.
      type: str
    digest:
      description: The digest of the manifest in the site registry.
      type: str
    copied_bytes:
      description: Bytes read from the origin (in check mode, to read).
      type: int
    image_bytes:
      description: Bytes of the image (its config and compressed layers).
      type: int
    blobs_copied:
      description: Blobs copied.
      type: int
origin_bytes:
  description: Bytes read from the origins in all.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images.mirror import mirror_images
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **PROXY_OPTIONS,
            images=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(source=dict(type="str", required=True), target=dict(type="str", required=True)),
            ),
            registry_credentials=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    registry=dict(type="str", required=True),
                    username=dict(type="str", required=True),
                    password=dict(type="str", required=True, no_log=True),
                    ca_cert=dict(type="str"),
                ),
            ),
            source_registry=dict(type="str"),
            source_username=dict(type="str"),
            source_password=dict(type="str", no_log=True),
            target_username=dict(type="str"),
            target_password=dict(type="str", no_log=True),
            target_ca_cert=dict(type="str"),
            upstream=dict(type="dict", default={}),
            plain_http=dict(type="list", elements="str", default=[]),
            certs_dir=dict(type="path", default="/etc/docker/certs.d"),
            timeout=dict(type="int", default=60),
            status_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    apply_proxy_env(module)
    with fail_on(module):
        result = mirror_images(
            module.params, module.check_mode, module._diff, lambda total: Progress(total, module.params["status_file"])
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
