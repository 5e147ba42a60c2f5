#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: weights_server
short_description: Serve the weights of a model or a kernel store spool to fleet peers, read-only and for a while
version_added: 0.1.0
description:
  - The one peer server of the collection, one code path for weights and kernel caches. With O(state=started),
    serves a fixed set of files of O(path) on O(bind):O(port) under a random path element, with C(Range) support,
    from a detached Python process of the standard library.
  - With O(kind=weights), the files that the C(.ttfleet-manifest.json) of O(path) lists, and the manifest. Peers
    pull them with M(ttfleet.inference.model_weights) O(ttfleet.inference.model_weights#module:source=peer),
    checking each file against the manifest's sha256.
  - With O(kind=kernels), O(path) is a kernel store spool (the layout of the V(path) store of
    M(ttfleet.inference.kernel_cache)) and the files are the C(manifest.json), C(kernels.tar.zst) and
    C(kernels.tar.zst.sha256) of every complete entry
    C(<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm_commit>/). Peers deploy from RV(url) with
    M(ttfleet.inference.kernel_cache) O(ttfleet.inference.kernel_cache#module:store=http), which checks the
    archive against the manifest's sha256.
  - The files are found when the server starts, by a walk that never follows a link, and pinned by device, inode
    and size. Each request opens its file again, component by component relative to a descriptor of O(path) kept
    open since the start, without following a link. A name outside the set is answered 404; a link, a special file,
    a replaced or resized file is refused with 403, so a file swapped for a link to an outside file is never served.
    A file with several hard links is served only if every local user can read it.
  - The server stops at O(state=stopped) or after O(ttl) seconds, whichever comes first; nothing is written to
    O(path).
  - Connections are bounded, so a flood of connections that send nothing or drip their request does not lock
    peers out. A connection that sends no byte for 10 seconds, or not its whole request head (at most 16 KiB)
    within 20 seconds, is closed; a client that takes no byte of a file for 60 seconds is dropped; every answer
    closes its connection. At most 512 connections are open at once, fewer when the open-file limit of the server
    holds fewer (two descriptors a connection); at that cap the oldest connection still sending its request is
    closed for a new one, and while every connection is being answered new ones wait in the listen backlog. When
    accepting fails for want of descriptors or memory, the server pauses accepting (up to a second) instead of
    retrying at once.
  - With O(state=stopped), returns the bytes the server sent (RV(served_bytes)).
  - "The fleet rule (role C(ttfleet.inference.model_cache)): every transfer between peers goes through this server.
    The weights of a model go in doubling rounds within a C(model_cache_site): the hosts that hold a verified copy
    serve it (one server per holder and model, bound to C(model_cache_peer_address)) from the round they hold it to
    the last round, for the pulls that name them as their holder or as one of up to three alternates; each host that
    finished a round serves from the next round on, its server started by the same module run as its pull
    (M(ttfleet.inference.model_weights) O(ttfleet.inference.model_weights#module:serve)), so N hosts are served
    in about log2(N) rounds while the origin is read once. Kernel-cache archives go in the same rounds among the
    hosts of one C(model_cache_site) that name the same C(model_cache_kernel_peer): the peer serves its spool
    (bound to C(model_cache_kernel_peer_address)) from the first round, and each host that deployed a cache keeps
    the verified archive in its own spool and serves it from the next round (one server per holder, kind
    V(kernels), bound to C(model_cache_peer_address)). Every server lives until the last round, at most
    C(model_cache_peer_ttl) seconds."
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads O(path) and reports whether a server would be started or stopped; starts or stops nothing.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - A server recorded under O(name) and still running for the same O(path), O(kind), O(bind) and the same files
        (paths, inodes and sizes), with at least half of O(ttl) left, is kept; O(state=stopped) without one is not a
        change.
options:
  state:
    description: Start or stop the server recorded under O(name).
    type: str
    choices: [started, stopped]
    default: started
  name:
    description:
      - Name of the server's state file in O(run_dir), for example the model name. Letters, digits, C(.), C(_) and
        C(-).
    type: str
    required: true
  kind:
    description:
      - V(weights) serves a weights directory written by M(ttfleet.inference.model_weights); V(kernels) serves the
        complete entries of a kernel store spool.
    type: str
    choices: [weights, kernels]
    default: weights
  path:
    description:
      - The weights directory to serve (it must hold a C(.ttfleet-manifest.json) written by
        M(ttfleet.inference.model_weights)), or with O(kind=kernels) the kernel store spool (it must hold at least
        one complete entry). Required with O(state=started).
      - Opened component by component; a symbolic link on the way is followed only where only root can change it.
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
    description:
      - Directory of the state files, created with mode C(0700); it must belong to the user the module runs as and
        be closed to others. The state files (the URL with its path element, the bytes served) are mode C(0600).
    type: path
    default: /run/ttfleet-weights
notes:
  - The path element in RV(url) is random (128 bits), which keeps other clients on the network out; it travels over
    plain HTTP, so serve only on a trusted fleet network. RV(url) is a secret while the server runs; register it
    and hand it to the pulling task without printing it.
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

- name: Serve the kernel caches packed into the spool to one pulling host
  ttfleet.inference.weights_server:
    name: kernels-host-b
    kind: kernels
    path: /var/cache/ttfleet/kernel-store
  register: kernels

- name: Deploy a kernel cache from it on host-b
  ttfleet.inference.kernel_cache:
    volume: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
    model_name: Qwen3-32B
    mesh: P300x2
    impl_id: tt_transformers
    tt_metal_commit: 8c48a10
    vllm_commit: f52987a
    store: http
    store_url: "{{ kernels.url }}"
  delegate_to: host-b
"""

RETURN = r"""
url:
  description:
    - Base URL of the served files (ends in C(/)), for O(ttfleet.inference.model_weights#module:peer_url) or
      O(ttfleet.inference.kernel_cache#module:store_url).
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
files:
  description: Number of files served.
  returned: state is started and not in check mode
  type: int
pid:
  description: Process id of the server.
  returned: state is started and not in check mode
  type: int
served_bytes:
  description: Bytes of file content the server sent before it stopped.
  returned: state is stopped
  type: int
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.catalog import KINDS
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.daemon import (
    ensure_server,
    server_facts,
    stop_server,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import alive, read_state


def _exit_running(module: AnsibleModule, state: dict[str, Any], changed: bool) -> None:
    module.exit_json(changed=changed, **server_facts(state))


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            name=dict(type="str", required=True),
            kind=dict(type="str", choices=list(KINDS), default="weights"),
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
    with fail_on(module):
        current = read_state(params["run_dir"], params["name"])
        running = alive(current)
        if params["state"] == "stopped":
            if module.check_mode:
                module.exit_json(changed=running, served_bytes=0)
            was_running, served = stop_server(params["run_dir"], params["name"])
            module.exit_json(changed=was_running, served_bytes=served)
        changed, state = ensure_server(
            params["path"],
            params["name"],
            bind=params["bind"],
            port=params["port"],
            ttl=params["ttl"],
            run_dir=params["run_dir"],
            kind=params["kind"],
            check_mode=module.check_mode,
        )
        if state is None:
            module.exit_json(changed=True)
        else:
            _exit_running(module, state, changed=changed)


if __name__ == "__main__":
    main()
