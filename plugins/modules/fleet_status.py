#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_status
short_description: Report what a Tenstorrent host serves right now, for the fleet status report
version_added: 0.1.0
description:
  - Reads the non-secret state file that the P(ttfleet.inference.serve#role) role keeps per served instance
    (C(<state_dir>/<instance>.json)), asks systemd about the instance's unit, probes its C(/health) endpoint and
    describes its expected volume - an alias (and of what) or a directory, whether the weights are complete, the
    revision and source recorded in the weights manifest and when it was last verified, and the meshes that hold a
    kernel cache.
  - Also reports the tt-inference-server releases that the C(current) and C(previous) links of the
    P(ttfleet.inference.inference_server#role) layout point at.
  - Never reads the instances' environment files, so no secret can appear in its result.
  - Read-only; never changes anything.
extends_documentation_fragment:
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  state_dir:
    description: Directory of the instance state files.
    type: path
    default: /var/lib/ttfleet/serve
  releases_root:
    description: Directory holding the C(current) and C(previous) release links.
    type: path
    default: /opt/tt-inference-server
  timeout:
    description:
      - Seconds each C(/health) probe may take in all, from the connection to the last byte of the answer. A port
        that stalls or drips its answer is cut off then and reported as unhealthy.
      - The answer may hold at most 64 KiB; no credential is sent and redirects are not followed.
    type: float
    default: 5.0
seealso:
  - module: ttfleet.inference.volume_facts
  - module: ttfleet.inference.tt_facts
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Read what the host serves
  ttfleet.inference.fleet_status:
  register: status

- name: Fail when an instance is unhealthy
  ansible.builtin.assert:
    that: status.unhealthy | length == 0
    fail_msg: "unhealthy instances: {{ status.unhealthy | join(', ') }}"
"""

RETURN = r"""
release:
  description: The tt-inference-server release the C(current) link points at, or null.
  returned: always
  type: str
  sample: v0.20.0
previous_release:
  description: The release the C(previous) link points at, or null.
  returned: always
  type: str
instance_count:
  description: Number of instance state files found.
  returned: always
  type: int
unhealthy:
  description: Instances whose state file is unreadable, whose unit is not active or whose C(/health) is not 200.
  returned: always
  type: list
  elements: str
instances:
  description: One entry per instance state file, sorted by instance name.
  returned: always
  type: list
  elements: dict
  contains:
    instance:
      description: Instance name (the part after C(tt-serve@) in the unit name).
      type: str
    model:
      description: The model's short name in the spec (C(model_name)).
      type: str
    hf_model_repo:
      description: The Hugging Face repository the container serves, the model id its API lists.
      type: str
    release:
      description: The tt-inference-server release whose spec the instance was configured from.
      type: str
    port:
      description: The published port.
      type: int
    unit:
      description: C(active_state), C(sub_state), C(enabled), C(restarts) and C(active_since) of the unit.
      type: dict
    health:
      description:
        - C(status) (healthy, unhealthy, unreachable or unknown), C(code), C(url), C(seconds), C(error).
        - C(unreachable) when the port takes no connection; C(unhealthy) for a status other than 200 and for an answer
          that breaks the protocol (a line that is not HTTP, a body that ends early or passes 64 KiB, no whole answer
          within O(timeout)), with the reason in C(error), control characters shown as escapes. Such a port makes only
          its own instance unhealthy; the rest of the host is reported as usual.
      type: dict
    volume:
      description: >-
        C(path), C(type) (link, directory, absent), C(is_alias), C(alias_of), C(weights_from) and C(tt_metal_commit)
        (a directory whose weights are hardlinks of another volume's), C(weights) (C(usable), C(revision),
        C(source), C(verified)), C(kernel_cache_meshes) and C(problems) (what could not be inspected, such as a link or
        a special file where the weights, an index or the manifest belongs) of the expected volume.
      type: dict
    healthy:
      description: The unit is active and C(/health) answered 200.
      type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.status import host_report
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import SERVE_STATE_DIR
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import DEFAULT_RELEASE_ROOT


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=SERVE_STATE_DIR),
            releases_root=dict(type="path", default=DEFAULT_RELEASE_ROOT),
            timeout=dict(type="float", default=5.0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be more than 0 seconds, not {params['timeout']}")
    where = f"cannot read the serving state under {params['state_dir']}"
    with fail_on(module, context=where, os_error=where):
        report = host_report(params["state_dir"], params["releases_root"], timeout=params["timeout"])
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
