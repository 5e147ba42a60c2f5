#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: volume_facts
short_description: Report tt-inference-server host volumes and what the expected volume can be aliased to
version_added: 0.1.0
description:
  - Lists every C(volume_id_*) entry directly under O(root) and the O(search_roots), real directories and symlinks
    alike, with the impl, model and version or build label parsed from the name, the owner, whether the weights are
    complete, which meshes have a tensor cache, whether the completion manifest exists and, with O(sizes=true), the
    disk usage.
  - Weights under C(weights/<model_name>/) count as complete by the rule of tt-inference-server's C(setup_host.py),
    that is C(model*.safetensors) + C(tokenizer.json) + C(config.json), or C(*.pth) + C(tokenizer.model) +
    C(params.json), or C(pytorch_model*.bin) + C(tokenizer_config.json) + C(config.json), or C(**/*.safetensors) +
    C(model_index.json) (diffusers, tokenizer optional). Shards named by a checkpoint index but missing on disk are
    reported as well.
  - Given O(model) and O(device), also reports the volume the model spec expects under O(root)
    and the volumes it could be aliased to with M(ttfleet.inference.volume_alias), best first.
  - Each candidate also says which C(tt_metal_commit) compiled its kernel cache, when something records it (a
    record of M(ttfleet.inference.volume_alias) with O(ttfleet.inference.volume_alias#module:link=hardlink), a marker
    of M(ttfleet.inference.kernel_cache), or the spec of the candidate's version in another installed release, see
    O(release_dirs)), and how the expected volume should reuse it, see RV(candidates).
  - Entries whose names hold control characters or bytes that are not UTF-8, and roots that cannot be listed, are
    skipped with a warning.
  - Read-only; never changes anything.
extends_documentation_fragment:
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
  - ttfleet.inference.spec_source
options:
  root:
    description:
      - The volume root given to C(run.py --host-volume). The expected volume is looked up here.
      - A missing root is not an error; it simply holds no volumes.
    type: path
    required: true
  search_roots:
    description:
      - More directories to scan for pre-seeded volumes, for example V(/home/*/data/tt-cache) on QuietBox 2 hosts.
      - Shell globs are expanded; missing directories are skipped; a directory reached twice is scanned once.
      - Candidates may come from any of them.
    type: list
    elements: path
    default: []
  sizes:
    description:
      - Also report the size of every volume (apparent bytes and disk usage, like C(du), hard links counted once,
        symlinks inside a volume not followed; an alias reports the size of its target).
      - Walks every file, which takes a while on large caches.
    type: bool
    default: false
  release_dirs:
    description:
      - Checkouts of other tt-inference-server releases whose model specs tell which C(tt_metal_commit) made a
        candidate of another model version (shell globs are expanded; the release being read is skipped).
      - When unset and the spec comes from the default C(/opt/tt-inference-server/current), the other releases that
        the P(ttfleet.inference.inference_server#role) role keeps beside it (C(/opt/tt-inference-server/releases/*)).
      - Read only when the expected volume is absent and a candidate records no commit itself.
    type: list
    elements: path
  kernel_isolation:
    description:
      - When V(true), a candidate whose kernel cache was compiled by another C(tt_metal_commit) than the spec's, or by
        an unknown one (a version pin with nothing recording it), gets RV(candidates[].reuse=hardlink), that is a new
        directory with the weights hardlinked and a kernel cache of its own, so that neither release runs the other's
        kernels.
      - When V(false), every candidate is reused as an alias (RV(candidates[].reuse=symlink)).
    type: bool
    default: true
  image:
    description:
      - Docker image the model runs with instead of its spec's (C(run.py --override-docker-image)); the version its tag
        starts with names the expected volume, as in O(ttfleet.inference.model_spec#module:image). Only used with
        O(model).
    type: str
notes:
  - The spec source options O(tt_inference_server_dir), O(spec_file) and O(python) are only used when O(model) is set;
    without the first two, the current release that the P(ttfleet.inference.inference_server#role) role installs is
    read.
seealso:
  - module: ttfleet.inference.volume_alias
  - module: ttfleet.inference.model_spec
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: List the volumes of a host
  ttfleet.inference.volume_facts:
    root: /opt/tt-cache
  register: __volumes

- name: Find what Qwen3-32B on a QuietBox 2 can reuse
  ttfleet.inference.volume_facts:
    root: /opt/tt-cache
    search_roots:
      - /home/*/data/tt-cache
    model: Qwen3-32B
    device: p300x2
    tt_inference_server_dir: /opt/tt-inference-server
  register: __volumes

- name: Show the best candidate
  ansible.builtin.debug:
    msg: >-
      {{ __volumes.expected.name }} can be aliased to {{ __volumes.candidates[0].path }}
  when:
    - not __volumes.expected.exists
    - __volumes.candidates | length > 0
"""

RETURN = r"""
roots:
  description: The directories that were scanned, O(root) first when it exists.
  returned: always
  type: list
  elements: str
  sample: [/opt/tt-cache, /home/tt/data/tt-cache]
volumes:
  description: Every C(volume_id_*) entry found, in root order, then by name.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Entry name.
      type: str
      sample: volume_id_tt_transformers-Qwen3-32B-vqb2_launch
    path:
      description: Full path of the entry.
      type: str
    root:
      description: The root it was found under.
      type: str
    type:
      description: What the entry is (not following a symlink).
      type: str
      choices: [directory, link, file, other]
    is_link:
      description: Whether the entry is a symlink.
      type: bool
    link_target:
      description: Link text of a symlink, else V(null).
      type: str
    realpath:
      description: The entry with every symlink resolved.
      type: str
    exists:
      description: Whether the entry is, or points at, a directory.
      type: bool
    impl_id:
      description: Implementation id parsed from the name (the part before the first hyphen), or V(null).
      type: str
      sample: tt_transformers
    model_name:
      description: Model name parsed from the name, or V(null).
      type: str
      sample: Qwen3-32B
    version:
      description: Version pin after the last C(-v) when it is C(X.Y.Z), else V(null).
      type: str
      sample: 0.17.0
    label:
      description: Build label after the last C(-v) when it is not a version, else V(null).
      type: str
      sample: qb2_launch
    parsed:
      description: Whether the name has the C(volume_id_<impl_id>-<model_name>[-v<version|label>]) structure.
      type: bool
    moved_aside_from:
      description:
        - For a directory that M(ttfleet.inference.volume_alias) renamed aside with
          O(ttfleet.inference.volume_alias#module:force=true), its original name (which the other name fields
          describe); else V(null).
        - Such directories are never candidates.
      type: str
    uid:
      description: Owner of the directory (of the link itself when it dangles).
      type: int
    gid:
      description: Group of the directory (of the link itself when it dangles).
      type: int
    mtime:
      description: Modification time of the directory, seconds since the epoch.
      type: float
    weights:
      description: State of C(weights/<model_name>/).
      type: dict
      contains:
        path:
          description: The weights directory.
          type: str
        complete:
          description: Whether tt-inference-server would consider the weights complete.
          type: bool
        format:
          description: The layout that matched.
          type: str
          choices: [meta, hf, hf_bin, diffusers]
        missing_shards:
          description:
            - Shards listed in C(model.safetensors.index.json) or C(pytorch_model.bin.index.json) that are absent.
          type: list
          elements: str
        usable:
          description: Complete with no missing shard.
          type: bool
    tensor_cache_meshes:
      description: Mesh directories under C(tt_metal_cache/cache_<model_name>/) that are not empty.
      type: list
      elements: str
      sample: [P300x2]
    manifest:
      description: >-
        The weights manifest C(weights/<model_name>/.ttfleet-manifest.json) that
        M(ttfleet.inference.model_weights) writes.
      type: dict
      contains:
        path:
          description: Where the manifest is looked for.
          type: str
        present:
          description: Whether it exists.
          type: bool
        data:
          description: Its parsed content, or V(null).
          type: raw
        error:
          description: Why it could not be read, or V(null).
          type: str
    problems:
      description:
        - What could not be inspected and why, for example a link or a special file (a FIFO) where the weights
          directory, a checkpoint index or the manifest belongs. Nothing below the volume is followed or opened
          unless it is a directory or a regular file.
        - Weights whose checkpoint index is a link or a special file are not usable.
      type: list
      elements: str
    size_bytes:
      description: Apparent size of the tree. Only with O(sizes=true).
      type: int
    disk_usage_bytes:
      description: Allocated size of the tree. Only with O(sizes=true).
      type: int
    size_complete:
      description: False when part of the tree could not be read. Only with O(sizes=true).
      type: bool
expected:
  description:
    - The volume the spec expects under O(root), with the keys of RV(volumes) when it exists, plus the ones below.
    - RV(expected.type) is V(absent) when nothing is there.
  returned: when O(model) is set
  type: dict
  contains:
    name:
      description: Expected volume name.
      type: str
      sample: volume_id_tt_transformers-Qwen3-32B-v0.17.0
    path:
      description: Expected volume path.
      type: str
    type:
      description: What the entry is (not following a symlink), V(absent) when there is none.
      type: str
      choices: [absent, directory, link, file, other]
    exists:
      description: Whether it is, or points at, a directory.
      type: bool
    is_alias:
      description: Whether it is a symlink.
      type: bool
    mesh:
      description: The mesh directory name the spec uses for its tensor cache.
      type: str
      sample: P300x2
    tensor_cache_for_mesh:
      description: Whether a tensor cache for that mesh is present.
      type: bool
candidates:
  description:
    - Volumes the expected name can be aliased to, best first. Empty unless O(model) is set.
    - A candidate has the expected impl_id and model name, another version or a build label (or the expected name
      under a search root), is a directory or a link to one, has complete weights with no missing shard, and is not
      what the expected path already resolves to. Entries that resolve to the same directory appear once, the real
      directory preferred.
    - Order is a tensor cache for the expected mesh first, then version pins before build labels and higher versions
      first, then the newest modification time.
    - Each has the keys of RV(volumes) plus RV(expected.tensor_cache_for_mesh) and the keys below.
  returned: always
  type: list
  elements: dict
  contains:
    tt_metal_commit:
      description: The C(tt_metal_commit) that made the candidate's kernel cache, V(null) when nothing records it.
      type: str
      sample: 8c48a10
    tt_metal_commit_from:
      description: Where RV(candidates[].tt_metal_commit) comes from (a record, a marker or a release's spec).
      type: str
    kernels:
      description: The candidate's commit against the spec's.
      type: str
      choices: [same, other, unknown]
    same_filesystem:
      description: Whether the candidate is on the filesystem of O(root) (hardlinks are possible).
      type: bool
    reuse:
      description:
        - V(symlink) to alias the candidate (its kernel cache included), V(hardlink) to make the expected volume a new
          directory with the candidate's weights hardlinked and an empty kernel cache.
        - A build label with an unknown commit (a factory C(-vqb2_launch) volume) is aliased; so is a candidate on
          another filesystem, with a warning.
      type: str
      choices: [symlink, hardlink]
    reuse_reason:
      description: Why RV(candidates[].reuse) was chosen.
      type: str
spec:
  description: What the model spec derives for O(model) and O(device), as returned by M(ttfleet.inference.model_spec).
  returned: when O(model) is set
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.volume import other_releases, plan_volume
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve_params
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import (
    SPEC_SOURCE_OPTIONS,
    default_checkout,
    load_params_catalog,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.checks import check_path_text
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.scan import expand_roots, scan_roots


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            search_roots=dict(type="list", elements="path", default=[]),
            sizes=dict(type="bool", default=False),
            release_dirs=dict(type="list", elements="path"),
            kernel_isolation=dict(type="bool", default=True),
            image=dict(type="str"),
            **SPEC_SOURCE_OPTIONS,
        ),
        required_together=[("model", "device")],
        mutually_exclusive=[("tt_inference_server_dir", "spec_file")],
        supports_check_mode=True,
    )
    params = module.params
    with fail_on(module, os_error="cannot inspect volumes"):
        root = os.path.normpath(check_path_text(params["root"], "root"))
        roots = expand_roots([root, *params["search_roots"]])
        derived = None
        checkout = None
        if params["model"]:
            checkout = default_checkout(params["tt_inference_server_dir"], params["spec_file"])
            catalog = load_params_catalog(params, checkout)
            for warning in catalog.get("warnings", []):
                module.warn(warning)
            derived = resolve_params(catalog, params, volume_root=root)
        volumes, warnings = scan_roots(roots, sizes=params["sizes"])
        result = {"changed": False, "roots": roots, "volumes": volumes, "candidates": []}
        if derived is not None:
            expected, candidates, found = plan_volume(
                root,
                volumes,
                derived,
                other_releases(params["release_dirs"], checkout),
                module.warn,
                isolate=params["kernel_isolation"],
                sizes=params["sizes"],
            )
            warnings.extend(found)
            result["expected"], result["candidates"] = expected, candidates
            result["spec"] = derived
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
