#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: disk_prune
short_description: List and remove what the kept releases of a host no longer need (volumes, kernel caches, images)
version_added: 0.3.0
description:
  - Lists, with its size and the reason it is not needed, every C(volume_id_*) entry of O(volume_root), tensor caches
    moved aside inside the volumes that stay, stale partial downloads in C(<volume_root>/.ttfleet-staging), kernel
    archives in O(spool_dirs), releases under O(release_root) beyond C(current), C(previous) and the newest
    O(release_keep), and images of O(image_repositories); and removes those of the kinds in O(kinds).
  - Conservative by default. A volume needed by a kept release (O(needed_volumes)) and what a needed alias points to,
    a volume mounted by any container (running or not, by path and by the directory's inode) or served by a live
    peer server are never removed, even when named in O(remove). A factory volume (a label such as C(-vqb2_launch)
    after C(-v), not a version), a volume that an alias which stays points to, and a volume name without a version
    are kept unless named in O(remove).
  - Nothing outside O(volume_root), O(spool_dirs) and O(release_root) is removed. No link is followed and no tree is
    entered through a link; a link, FIFO, socket or device where a directory belongs, a top-level entry not owned by
    root, or a tree nested deeper than the safe-file layer allows is skipped with a message naming the path.
  - Removal is bounded and resumable. Each item is renamed into a root-only (0700) trash directory C(.ttfleet-prune) at
    the top of its root, then the trash is emptied until O(time_limit) passes. What is left is listed in RV(pending)
    and removed first by the next run (reported with the note C(resumed)).
  - Sizes are the blocks of each inode; a hardlinked file counts only when every one of its links is removed (the
    weights of a volume hardlinked into a newer one free nothing). An image counts its engine size when all its tags
    go; layers it shares with kept images are not subtracted.
  - A real run writes O(report_file) (also with O(kinds=[])), which the metrics read.
  - While the trash is emptied, the action plugin prints the bytes freed, rate and ETA every
    C(ttfleet_progress_interval) seconds, as for weights.
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
    details:
      - Nothing is written, not even O(report_file); RV(items) shows what a real run would remove.
  diff_mode:
    support: full
    details:
      - The diff lists every item (kind, name, action, bytes, reason) before, and what stays after.
  idempotent:
    support: full
    details:
      - A second run finds nothing more to remove, unless O(time_limit) left trash behind (it is removed then).
options:
  volume_root:
    description:
      - The directory holding the C(volume_id_*) volumes (C(tt_volume_root)).
    type: path
    required: true
  needed_volumes:
    description:
      - Names of the volumes (entries of O(volume_root)) that the kept releases expect. A needed alias keeps the
        volume it points to.
    type: list
    elements: str
    default: []
  remove:
    description:
      - Items to remove although the defaults keep them, such as a factory volume, a volume an alias points to, an
        image reference or a release tag. A name that is needed or in use is still kept, with a message in
        RV(left_alone).
    type: list
    elements: str
    default: []
  kinds:
    description:
      - The kinds that may be removed. V([]) removes nothing and only reports what a run with every kind would
        reclaim (RV(reclaimable_bytes)); its items carry the note C(report only).
    type: list
    elements: str
    choices: [volumes, kernel_caches, staging, spool, images, releases]
    default: [volumes, kernel_caches, staging, spool, images, releases]
  spool_dirs:
    description:
      - Kernel store spools (C(model_cache_kernel_peer_spool)) laid out as
        C(<model>/<mesh>/<impl_id>/<tt_metal_commit>/<vllm_commit>/). A spool that a live peer server serves is left
        alone, with a message.
    type: list
    elements: path
    default: []
  needed_kernel_keys:
    description:
      - The C(kernel) key records of M(ttfleet.inference.model_cache_plan) (C(model_name), C(mesh), C(impl_id),
        C(tt_metal_commit), C(vllm_commit)) of the kept releases; their spool archives are kept.
    type: list
    elements: dict
    default: []
  release_root:
    description:
      - Where the inference_server role installs C(releases/<tag>), C(venvs/<tag>) and the C(current) and
        C(previous) links.
    type: path
    default: /opt/tt-inference-server
  release_keep:
    description:
      - C(inference_server_keep_releases). The newest this many releases stay, besides C(current) and C(previous).
    type: int
    default: 2
  image_repositories:
    description:
      - Repositories (no tag) whose images are candidates, for example the tt-inference-server image repositories of
        the specs, mapped by C(tt_registry_mirrors).
    type: list
    elements: str
    default: []
  needed_images:
    description:
      - Image references the kept releases use; images used by any container are kept too.
    type: list
    elements: str
    default: []
  time_limit:
    description:
      - Seconds removal may take; it stops then and the next run resumes it (RV(pending)).
    type: int
    default: 900
  report_file:
    description:
      - Where a real run writes its summary (root, mode 0644, atomically) C({time, reclaimable_bytes, items_count,
        by_kind, volume_root}); after a removal it holds what is still reclaimable.
    type: path
    default: /var/lib/ttfleet/prune/report.json
  status_file:
    description: Where progress (bytes freed) is written as JSON while the trash is emptied (the action plugin sets
      it).
    type: path
  peer_run_dir:
    description:
      - The run directory of the peer servers (O(ttfleet.inference.weights_server#module:run_dir)). A spool or volume
        that a live one serves is left alone.
    type: path
    default: /run/ttfleet-weights
seealso:
  - module: ttfleet.inference.volume_alias
    description: Makes the aliases and hardlinked volumes that this module keeps or removes.
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Show what could be reclaimed, removing nothing
  ttfleet.inference.disk_prune:
    volume_root: /opt/tt-cache
    needed_volumes:
      - volume_id_tt_transformers-Qwen3-32B-v0.19.0
      - volume_id_tt_transformers-Qwen3-32B-v0.17.0
    kinds: []
  register: __prune_report

- name: Remove what the kept releases no longer need, for at most 10 minutes
  ttfleet.inference.disk_prune:
    volume_root: /opt/tt-cache
    needed_volumes: "{{ __needed_volumes }}"
    spool_dirs: [/var/cache/ttfleet/kernel-store]
    needed_kernel_keys: "{{ __needed_kernel_keys }}"
    image_repositories: [ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64]
    needed_images: "{{ __needed_images }}"
    release_keep: 2
    time_limit: 600

- name: Also remove the factory volume, which the defaults keep
  ttfleet.inference.disk_prune:
    volume_root: /opt/tt-cache
    needed_volumes: "{{ __needed_volumes }}"
    remove: [volume_id_tt_transformers-Qwen3-32B-vqb2_launch]
    kinds: [volumes]
"""

RETURN = r"""
items:
  description: Every item found, sorted by kind then name.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: The kind of the item.
      type: str
      choices: [volumes, kernel_caches, staging, spool, images, releases]
    name:
      description: Its name (a volume name, a path below the volume root, C(<spool>:<entry>), a tag, an image ref).
      type: str
    path:
      description: Its path (not for images).
      type: str
    ref:
      description: The image reference (images only).
      type: str
    bytes:
      description: What removing it alone frees; V(0) for what is kept or skipped.
      type: int
    reason:
      description: Why it is not needed (empty for what is needed).
      type: str
    action:
      description: V(remove), V(keep) or V(skip).
      type: str
    note:
      description: Why it is kept or skipped, naming the path.
      type: str
  sample:
    - kind: volumes
      name: volume_id_tt_transformers-Qwen3-32B-v0.14.0
      path: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.14.0
      bytes: 32212254720
      reason: no kept release expects it (model Qwen3-32B, version 0.14.0)
      action: remove
      note: ""
reclaimable_bytes:
  description: Bytes the allowed removals free (all kinds with O(kinds=[])), hardlinks counted once and only when
    every link goes.
  returned: always
  type: int
reclaimed_bytes:
  description: Bytes freed by this run (V(0) in check mode).
  returned: always
  type: int
pending:
  description: Trash entries left for the next run because O(time_limit) passed.
  returned: always
  type: list
  elements: str
left_alone:
  description:
    - Messages about what was left alone (links, special files, other owners, a live peer, no Docker, names in
      O(remove) that are kept or not found).
    - Not named C(skipped), which Ansible reads as the status of the task.
  returned: always
  type: list
  elements: str
msg:
  description: One line naming the items and bytes.
  returned: always
  type: str
  sample: 3 items reclaimable, 58.2 GiB (volumes 30.0 GiB, images 14.0 GiB)
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import RUN_DIR, live_states
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune import KINDS
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.prune_host import prune
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import PRUNE_REPORT


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            volume_root=dict(type="path", required=True),
            needed_volumes=dict(type="list", elements="str", default=[]),
            remove=dict(type="list", elements="str", default=[]),
            kinds=dict(type="list", elements="str", choices=list(KINDS), default=list(KINDS)),
            spool_dirs=dict(type="list", elements="path", default=[]),
            needed_kernel_keys=dict(type="list", elements="dict", default=[], no_log=False),
            release_root=dict(type="path", default="/opt/tt-inference-server"),
            release_keep=dict(type="int", default=2),
            image_repositories=dict(type="list", elements="str", default=[]),
            needed_images=dict(type="list", elements="str", default=[]),
            time_limit=dict(type="int", default=900),
            report_file=dict(type="path", default=PRUNE_REPORT),
            peer_run_dir=dict(type="path", default=RUN_DIR),
            status_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    with fail_on(module, os_error="disk_prune"):
        result = prune(module.params, module.check_mode, peers=live_states(module.params["peer_run_dir"]))
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
