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
    - Each has the keys of RV(volumes) plus RV(expected.tensor_cache_for_mesh).
  returned: always
  type: list
  elements: dict
spec:
  description: What the model spec derives for O(model) and O(device), as returned by M(ttfleet.inference.model_spec).
  returned: when O(model) is set
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._spec import (
    SPEC_SOURCE_OPTIONS,
    SpecError,
    default_checkout,
    load_catalog,
    resolve,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes import (
    VolumeError,
    check_path_text,
    expand_roots,
    expected_volume,
    scan_roots,
    select_candidates,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            search_roots=dict(type="list", elements="path", default=[]),
            sizes=dict(type="bool", default=False),
            **SPEC_SOURCE_OPTIONS,
        ),
        required_together=[("model", "device")],
        mutually_exclusive=[("tt_inference_server_dir", "spec_file")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        root = os.path.normpath(check_path_text(params["root"], "root"))
        roots = expand_roots([root, *params["search_roots"]])
        derived = None
        if params["model"]:
            catalog = load_catalog(
                tt_inference_server_dir=default_checkout(params["tt_inference_server_dir"], params["spec_file"]),
                spec_file=params["spec_file"],
                python=params["python"],
            )
            for warning in catalog.get("warnings", []):
                module.warn(warning)
            derived = resolve(
                catalog,
                params["model"],
                params["device"],
                impl=params["impl"],
                engine=params["engine"],
                volume_root=root,
            )
        volumes, warnings = scan_roots(roots, sizes=params["sizes"])
        result = {"changed": False, "roots": roots, "volumes": volumes, "candidates": []}
        if derived is not None:
            expected = expected_volume(root, derived, volumes, sizes=params["sizes"])
            result["expected"] = expected
            result["candidates"] = select_candidates(volumes, derived, expected)
            result["spec"] = derived
    except (SpecError, VolumeError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot inspect volumes: {exc}")
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
