#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: weights_server
short_description: Serve the weights of one model to fleet peers over HTTP, read-only and for a while
version_added: 0.1.0
description:
  - With O(state=started), serves the files of O(path) that its C(.ttfleet-manifest.json) lists (and the manifest)
    on O(bind):O(port) under a random path element, with C(Range) support, from a detached Python process of the
    standard library. Peers pull them with M(ttfleet.inference.model_weights)
    O(ttfleet.inference.model_weights#module:source=peer), checking each file against the manifest's sha256.
  - The server stops at O(state=stopped) or after O(ttl) seconds, whichever comes first; nothing is written to
    O(path).
  - With O(state=stopped), returns the bytes the server sent (RV(served_bytes)).
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether a server would be started or stopped; starts or stops nothing.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - A server recorded under O(name) and still running for the same O(path) and O(bind) is kept; O(state=stopped)
        without one is not a change.
options:
  state:
    description: Start or stop the server recorded under O(name).
    type: str
    choices: [started, stopped]
    default: started
  name:
    description: Name of the server's state file in O(run_dir), for example the model name.
    type: str
    required: true
  path:
    description:
      - The weights directory to serve; it must hold a C(.ttfleet-manifest.json) written by
        M(ttfleet.inference.model_weights). Required with O(state=started).
    type: path
  bind:
    description:
      - The address to listen on, normally the host's address on the fleet network.
      - When not set, the address of the interface of the default route (the address peers reach the host at in
        most fleets), else the address the host name resolves to.
    type: str
  port:
    description: TCP port; V(0) picks a free one.
    type: int
    default: 0
  ttl:
    description: Seconds after which the server stops on its own.
    type: int
    default: 3600
  run_dir:
    description: Directory (mode C(0700)) of the state files.
    type: path
    default: /run/ttfleet-weights
notes:
  - The path element in RV(url) is random, which keeps casual clients out; it is no access control. Serve only
    on a trusted fleet network.
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Serve the weights of Qwen3-32B to the other hosts of the site
  ttfleet.inference.weights_server:
    name: Qwen3-32B
    path: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    bind: "{{ ansible_default_ipv4.address }}"
  register: served

- name: Stop it
  ttfleet.inference.weights_server:
    name: Qwen3-32B
    state: stopped
"""

RETURN = r"""
url:
  description: Base URL of the served files (ends in C(/)), for O(ttfleet.inference.model_weights#module:peer_url).
  returned: state is started and not in check mode
  type: str
  sample: http://10.1.0.12:41823/4f1c.../
port:
  description: The port listened on.
  returned: state is started and not in check mode
  type: int
address:
  description: The address listened on (O(bind), or the one found when it was not set).
  returned: state is started and not in check mode
  type: str
pid:
  description: Process id of the server.
  returned: state is started and not in check mode
  type: int
served_bytes:
  description: Bytes of file content the server sent before it stopped.
  returned: state is stopped
  type: int
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._peer import (
    PeerError,
    alive,
    default_address,
    read_state,
    start_server,
    stop_server,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            name=dict(type="str", required=True),
            path=dict(type="path"),
            bind=dict(type="str"),
            port=dict(type="int", default=0),
            ttl=dict(type="int", default=3600),
            run_dir=dict(type="path", default="/run/ttfleet-weights"),
        ),
        required_if=[("state", "started", ["path"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        current = read_state(params["run_dir"], params["name"])
        running = alive(current)
        if params["state"] == "stopped":
            if module.check_mode:
                module.exit_json(changed=running, served_bytes=0)
            was_running, served = stop_server(params["run_dir"], params["name"])
            module.exit_json(changed=was_running, served_bytes=served)
        if not 0 <= params["port"] <= 65535 or params["ttl"] < 1:
            module.fail_json(msg=f"port must be 0-65535 and ttl at least 1 (got {params['port']}, {params['ttl']})")
        if not params["bind"]:
            params["bind"] = default_address()
        same = (
            running
            and current.get("path") == os.path.realpath(params["path"])
            and current.get("bind") == params["bind"]
        )
        if same:
            module.exit_json(
                changed=False, url=current["url"], port=current["port"], pid=current["pid"], address=params["bind"]
            )
        if module.check_mode:
            module.exit_json(changed=True)
        if running:
            stop_server(params["run_dir"], params["name"])
        state = start_server(
            params["path"], params["bind"], params["port"], params["ttl"], params["run_dir"], params["name"]
        )
    except PeerError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=True, url=state["url"], port=state["port"], pid=state["pid"], address=params["bind"])


if __name__ == "__main__":
    main()
