#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: root_files
short_description: Keep root's directories and small files at a given content and mode, many in one call
version_added: 0.3.0
description:
  - Creates each directory of O(directories) (with its missing parents) or fixes its mode and owner, then brings each
    file of O(files) to its content and mode, owned by root, or removes it when its content is V(null). Only what
    differs is written; a converged host answers in one module call for all of them, where ansible.builtin.file,
    copy and template take one or two a path.
  - Directories are opened component by component without following a link that a non-root user could have planted.
    A file is read without following a link and replaced atomically through a new file with a random name, its mode
    and owner set on the descriptor before the rename. An existing link, directory or special file where a file
    belongs, or a directory that a user other than root can write, is an error naming the path, and nothing there is
    changed.
  - Supports check mode and diff mode (the text of files up to 64 KiB).
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  directories:
    description: Directories to keep, in order, before the files.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      mode:
        description: Octal mode.
        type: str
        default: "0755"
      list:
        description:
          - A shell pattern such as V(*.json). The directory's entries whose names match it (names starting with a dot
            left out) are returned in RV(directories), each with its C(path) and C(isreg), after the directory is
            kept. Nothing is followed.
        type: str
  files:
    description: Files to keep, in order. Their directories must exist or be in O(directories).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The whole content, as text (UTF-8). V(null) removes the file.
        type: str
      mode:
        description: Octal mode.
        type: str
        default: "0644"
notes:
  - The files are meant for a role's own small files (units, a wrapper, configuration), at most 4 MiB each; secrets
    belong in M(ttfleet.inference.serve_env), whose diff never shows values.
seealso:
  - module: ttfleet.inference.serve_env
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Install a unit and its configuration
  ttfleet.inference.root_files:
    directories:
      - path: /etc/example
    files:
      - path: /etc/systemd/system/example.service
        content: "{{ lookup('ansible.builtin.template', 'example.service.j2') }}"
      - path: /etc/example/example.conf
        content: "{{ settings | to_nice_json }}\n"
      - path: /etc/example/old.conf
        content: null
  register: installed
"""

RETURN = r"""
directories:
  description: Per directory path, whether it C(changed), and its C(entries) when O(directories[].list) is set.
  returned: always
  type: dict
  sample: {/var/lib/example: {changed: false, entries: [{path: /var/lib/example/a.json, isreg: true}]}}
files:
  description: Per file path, whether it C(changed) and its C(state) (V(present) or V(absent)).
  returned: always
  type: dict
  sample: {/etc/example/example.conf: {changed: true, state: present}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.root_files import RootFilesError, keep


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    path=dict(type="path", required=True), mode=dict(type="str", default="0755"), list=dict(type="str")
                ),
            ),
            files=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    path=dict(type="path", required=True),
                    content=dict(type="str"),
                    mode=dict(type="str", default="0644"),
                ),
            ),
        ),
        supports_check_mode=True,
    )
    try:
        result = keep(module.params["directories"], module.params["files"], module.check_mode)
    except RootFilesError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot keep {exc.filename or 'a path'}: {exc.strerror or exc}")
    diff = result.pop("diff")
    if module._diff and diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
