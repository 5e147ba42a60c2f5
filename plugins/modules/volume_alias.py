#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: volume_alias
short_description: Point a tt-inference-server volume name at an existing volume directory
version_added: 0.1.0
description:
  - Makes O(path) a symbolic link to the directory O(src), so that C(run.py --host-volume) and the Docker bind mount
    of the expected volume name (C(volume_id_<impl_id>-<model_name>-v<version>)) find weights and tensor caches that
    already exist under another name, for example the C(-vqb2_launch) volume of a factory QuietBox 2 or the volume of
    the previous model version.
  - An existing symlink at O(path) is replaced atomically (a new link under a temporary name in the same directory,
    then a rename over the old one). The previous link text is returned as RV(previous_target) for rollbacks.
  - A real directory or file at O(path) is never replaced or deleted. Without O(force=true) that is an error; with it,
    the entry is renamed aside with a UTC timestamp suffix and returned as RV(moved_aside).
  - With O(link=hardlink), O(path) becomes a new directory instead, whose files are hardlinks of the files of O(src)
    (zero bytes copied), except the per-release state C(tt_metal_cache/), C(logs/) and C(model_file_symlinks_map/),
    and whose C(tt_metal_cache/) starts empty. It serves a model version whose C(tt_metal_commit) differs from the one
    that compiled O(src)'s kernel cache, so that both versions share their weights and keep their kernels apart. The
    directory is built under a temporary name and renamed into place; a record C(.ttfleet-volume.json) in it names
    O(src) and O(tt_metal_commit).
  - O(state=absent) removes O(path) only if it is a symlink.
  - Paths holding NUL or control characters are rejected before the filesystem is touched.
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The diff shows the link text before and after, V(absent) for a missing entry and V(<directory>) or V(<file>)
        for a real entry that would be moved aside.
  idempotent:
    support: full
options:
  path:
    description:
      - Absolute path of the alias, normally C(<volume root>/volume_id_<impl_id>-<model_name>-v<version>).
      - Its parent directory must exist.
    type: path
    required: true
  src:
    description:
      - Absolute path of the existing volume directory the alias points at.
      - Refused when it is missing, not a directory, resolves through O(path) or contains it (a loop), or resolves
        outside O(allowed_roots).
      - Required when O(state=present).
    type: path
  state:
    description:
      - V(present) makes O(path) a symlink to O(src).
      - V(absent) removes O(path) if it is a symlink; a real directory or file there is an error and stays untouched.
    type: str
    choices: [present, absent]
    default: present
  link:
    description:
      - V(symlink) makes O(path) a symlink to O(src); V(hardlink) makes it a new directory of hardlinks, see above.
      - V(hardlink) needs O(src) on the filesystem of O(path)'s parent. A directory at O(path) that this module made
        from O(src) counts as done.
    type: str
    choices: [symlink, hardlink]
    default: symlink
  tt_metal_commit:
    description:
      - With O(link=hardlink), the C(tt_metal_commit) of the spec the new volume is for, written to its record so
        that a later release knows which commit compiled its kernel cache.
    type: str
  force:
    description:
      - When O(path) is a real directory or file, rename it to C(<path>.ttfleet-aside-<YYYYmmddTHHMMSSZ>) and create
        the link. Nothing is ever deleted.
      - Has no effect when O(path) is absent or already a symlink.
    type: bool
    default: false
  relative:
    description:
      - Write a relative link (computed from the physical location of both paths), which keeps working when the
        volume root is bind-mounted elsewhere.
      - Set V(false) to write O(src) as an absolute link.
    type: bool
    default: true
  allowed_roots:
    description:
      - When set, O(src) must resolve (after following every symlink) to a path under one of these directories.
    type: list
    elements: path
seealso:
  - module: ttfleet.inference.volume_facts
    description: Finds the expected volume name and the candidates it can be aliased to.
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Find an existing volume for Qwen3-32B on a QuietBox 2
  ttfleet.inference.volume_facts:
    root: /opt/tt-cache
    search_roots:
      - /home/*/data/tt-cache
    model: Qwen3-32B
    device: p300x2
    spec_file: /opt/tt-inference-server/release_model_spec.json
  register: __volumes

- name: Alias the expected volume name to the best candidate
  ttfleet.inference.volume_alias:
    path: "{{ __volumes.expected.path }}"
    src: "{{ __volumes.candidates[0].path }}"
    allowed_roots:
      - /opt/tt-cache
      - /home
  when:
    - not __volumes.expected.exists
    - __volumes.candidates | length > 0
  register: __alias

- name: Restore the previous alias on rollback
  ttfleet.inference.volume_alias:
    path: "{{ __alias.path }}"
    src: "{{ (__alias.path | dirname, __alias.previous_target) | path_join }}"
  when: __alias.previous_target is not none

- name: Replace an empty directory that run.py created, keeping it aside
  ttfleet.inference.volume_alias:
    path: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
    src: /home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-vqb2_launch
    force: true

- name: Give the new model version its own kernel cache, sharing the weights of the old one
  ttfleet.inference.volume_alias:
    path: /opt/tt-cache/volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.19.0
    src: /opt/tt-cache/volume_id_tt_transformers-Llama-3.1-8B-Instruct-v0.17.0
    link: hardlink
    tt_metal_commit: b204341

- name: Remove an alias
  ttfleet.inference.volume_alias:
    path: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.14.0
    state: absent
"""

RETURN = r"""
path:
  description: The alias, normalized.
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
src:
  description: The source directory, normalized; V(null) when O(state=absent).
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-vqb2_launch
target:
  description:
    - The link text written (or that would be written in check mode); V(null) when O(state=absent) or
      O(link=hardlink).
  returned: always
  type: str
  sample: volume_id_tt_transformers-Qwen3-32B-vqb2_launch
action:
  description: What was done (or would be done in check mode).
  returned: always
  type: str
  choices: [none, create, replace, move_aside, remove]
  sample: create
files:
  description: With O(link=hardlink), the number of files hardlinked (or to hardlink), else V(0).
  returned: always
  type: int
  sample: 11
bytes:
  description: With O(link=hardlink), the bytes those files hold, shared with O(src) and not copied, else V(0).
  returned: always
  type: int
  sample: 16069719532
previous_state:
  description: What O(path) was before the call.
  returned: always
  type: str
  choices: [absent, link, directory, file, other]
  sample: absent
previous_target:
  description:
    - Link text of O(path) before the call when it was a symlink, else V(null).
    - Pass it back as O(src) (relative to the directory of O(path)) to roll back.
  returned: always
  type: str
  sample: volume_id_tt_transformers-Qwen3-32B-v0.14.0
moved_aside:
  description: Where a real directory or file at O(path) was renamed (or would be, in check mode), else V(null).
  returned: always
  type: str
  sample: /opt/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0.ttfleet-aside-20261130T041500Z
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import apply_hardlink, plan_hardlink
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.alias import (
    apply_plan,
    plan_absent,
    plan_alias,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            src=dict(type="path"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            link=dict(type="str", choices=["symlink", "hardlink"], default="symlink"),
            tt_metal_commit=dict(type="str"),
            force=dict(type="bool", default=False),
            relative=dict(type="bool", default=True),
            allowed_roots=dict(type="list", elements="path"),
        ),
        required_if=[("state", "present", ["src"])],
        supports_check_mode=True,
    )
    params = module.params
    with fail_on(module):
        if params["state"] == "absent":
            plan = plan_absent(params["path"])
        elif params["link"] == "hardlink":
            plan = plan_hardlink(
                params["path"],
                params["src"],
                params["tt_metal_commit"],
                force=params["force"],
                allowed_roots=params["allowed_roots"],
            )
        else:
            plan = plan_alias(
                params["path"],
                params["src"],
                force=params["force"],
                relative=params["relative"],
                allowed_roots=params["allowed_roots"],
            )
        if plan["changed"] and not module.check_mode:
            (apply_hardlink if "src_real" in plan else apply_plan)(plan)

    result = {
        key: plan[key]
        for key in ("path", "src", "target", "action", "previous_state", "previous_target", "moved_aside")
    }
    result["files"] = plan.get("files", 0)
    result["bytes"] = plan.get("bytes", 0)
    result["changed"] = plan["changed"]
    if module._diff:
        result["diff"] = plan["diff"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
