#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: registry_auth
short_description: Store a registry's credentials and CA for root's Docker engine
version_added: 0.2.0
description:
  - Writes the username and password of O(registry) into root's Docker client config (O(docker_config),
    C(auths.<registry>.auth), mode 0600, its directory 0700 and root's; an existing directory with another mode or
    owner is corrected), where C(docker pull), C(docker run) and
    ttfleet.inference.container_image find them. Other entries of the file (other registries, C(credsStore)) are
    kept.
  - Writes O(ca_cert) to C(<certs_dir>/<registry>/ca.crt), which Docker trusts for that registry only (no engine
    restart, no C(insecure-registries)).
  - The password never reaches argv, logs, facts or diffs; the diff shows the registry and the username only.
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The registry, the username, whether the password changes (never the password) and the CA's fingerprint.
  idempotent:
    support: full
options:
  registry:
    description: The registry, C(host[:port]) as image references name it (V(registry.site.example:5000), V(ghcr.io)).
    type: str
    required: true
  username:
    description: Username at the registry (required with O(state=present)).
    type: str
  password:
    description: Password or token (vault it).
    type: str
  ca_cert:
    description: PEM of the CA that signed the registry's certificate, when it is not a public one.
    type: str
  state:
    description: V(absent) removes the credentials (and the CA file this module wrote).
    type: str
    choices: [present, absent]
    default: present
  docker_config:
    description: Root's Docker client config.
    type: path
    default: /root/.docker/config.json
  certs_dir:
    description: Docker's registry CA directory.
    type: path
    default: /etc/docker/certs.d
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Store the site registry's credentials
  ttfleet.inference.registry_auth:
    registry: registry.site.example:5000
    username: fleet
    password: "{{ vault_site_registry_password }}"
    ca_cert: "{{ lookup('ansible.builtin.file', 'site-ca.crt') }}"
  no_log: true
"""

RETURN = r"""
registry:
  description: The registry.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._images.login import store_login


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            registry=dict(type="str", required=True),
            username=dict(type="str"),
            password=dict(type="str", no_log=True),
            ca_cert=dict(type="str"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            docker_config=dict(type="path", default="/root/.docker/config.json"),
            certs_dir=dict(type="path", default="/etc/docker/certs.d"),
        ),
        required_if=[("state", "present", ["username", "password"])],
        supports_check_mode=True,
    )
    where = f"registry_auth of {module.params['registry']}"
    with fail_on(module, context=where, os_error=where):
        result = store_login(module.params, module.check_mode, module._diff)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
