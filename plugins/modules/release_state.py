#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: release_state
short_description: Read the tt-inference-server release layout of a host in one call
version_added: 0.3.0
description:
  - Reads what the P(ttfleet.inference.inference_server#role) role decides on before it installs a release or moves
    its links, in one module call instead of one a question, namely the prerequisite packages (dpkg's status file), the
    version of the interpreter the venvs are made with, the release root, the release directory with its marker, the
    venv with the pinned PyYAML, the C(current) and C(previous) links and the markers of every installed release.
  - Links are read, never followed; the marker is opened without following a link and only as a regular file of at
    most 1 MiB. A marker that is not a JSON object is reported in RV(release.marker_error), never loaded.
  - Read-only; never changes anything.
extends_documentation_fragment:
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  root:
    description: The release root (C(tt_release_root)), holding C(releases/), C(venvs/), C(current) and C(previous).
    type: path
    required: true
  version:
    description: The release tag to look at, such as V(v0.20.0).
    type: str
    required: true
  marker:
    description: Name of the marker file an install writes last into the release directory.
    type: str
    default: .ttfleet-release.json
  pyyaml_version:
    description: The PyYAML version the venv must hold (its C(.dist-info) directory is looked for).
    type: str
  packages:
    description: Debian packages to report in RV(packages).
    type: list
    elements: str
    default: []
  python:
    description:
      - The interpreter the venvs are made with. When set it is run once to report RV(python_version), and the module
        fails when it cannot run or is older than O(python_min).
    type: path
  python_min:
    description: The oldest interpreter version O(python) may be.
    type: str
    default: "3.10"
seealso:
  - module: ttfleet.inference.fleet_status
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Read the release layout
  ttfleet.inference.release_state:
    root: /opt/tt-inference-server
    version: v0.20.0
    pyyaml_version: "6.0.3"
    packages: [git, python3-venv]
    python: /usr/bin/python3
  register: release
"""

RETURN = r"""
packages:
  description: Package name to installed version, V(null) when not installed.
  returned: always
  type: dict
  sample: {git: "1:2.39.5-0+deb12u2", python3-venv: null}
python_version:
  description: C(MAJOR.MINOR) of O(python), V(null) without it.
  returned: always
  type: str
  sample: "3.11"
root:
  description: The release root, not followed (C(exists), C(isdir), C(uid), C(gid), C(mode) as V(0755)).
  returned: always
  type: dict
release:
  description: The release directory as O(root)/C(releases)/O(version), not followed, with its marker.
  returned: always
  type: dict
  contains:
    exists:
      description: Whether the path exists (a link counts).
      type: bool
    isdir:
      description: Whether it is a real directory (not a link to one).
      type: bool
    marker:
      description: The marker's JSON object, V(null) when there is none.
      type: dict
    marker_error:
      description: Why a marker that is there could not be used, else V(null).
      type: str
venv:
  description: Whether C(venvs/<version>) has its C(python) and the pinned C(pyyaml).
  returned: always
  type: dict
  sample: {python: true, pyyaml: true}
links:
  description:
    - C(current) then C(previous), each as C(item) and a C(stat) with C(exists), C(islnk), C(isdir) and
      C(lnk_target) (the link's text, not followed), the shape the filter P(ttfleet.inference.release_links#filter)
      reads.
  returned: always
  type: list
  elements: dict
markers:
  description: The marker of each installed release (a real directory under C(releases/)), with C(path) and C(mtime).
  returned: always
  type: list
  elements: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._host.installed import dpkg_packages
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.release_state import read

_VERSION = re.compile(r"^(\d+)\.(\d+)$")


def _python_version(module: AnsibleModule, python: str, minimum: str) -> str:
    try:
        rc, out, err = module.run_command(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], handle_exceptions=False
        )
    except OSError as exc:
        rc, out, err = 127, "", exc.strerror or str(exc)
    version = out.strip()
    match = _VERSION.match(version)
    if rc != 0 or not match:
        module.fail_json(
            msg=f"inference_server_python_interpreter is {python}, which cannot run ({(err or out).strip()[-200:]}); "
            "install Python 3.10 or later on the host and point inference_server_python_interpreter at it."
        )
    wanted = _VERSION.match(minimum)
    if wanted is None:
        module.fail_json(msg=f"python_min must be MAJOR.MINOR, got {minimum!r}")
    if match is None or wanted is None:  # fail_json does not return; for the type checker
        raise AssertionError
    if tuple(map(int, match.groups())) < tuple(map(int, wanted.groups())):
        module.fail_json(
            msg=f"inference_server_python_interpreter is {python}, which is Python {version}; tt-inference-server's "
            f"run.py needs {minimum} or later. Install a newer Python on the host and point "
            "inference_server_python_interpreter at it."
        )
    return version


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            version=dict(type="str", required=True),
            marker=dict(type="str", default=".ttfleet-release.json"),
            pyyaml_version=dict(type="str"),
            packages=dict(type="list", elements="str", default=[]),
            python=dict(type="path"),
            python_min=dict(type="str", default="3.10"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not os.path.isabs(params["root"]):
        module.fail_json(msg=f"root must be an absolute path, got {params['root']!r}")
    for name in ("version", "marker"):
        value = params[name]
        if not value or "/" in value or value in (".", ".."):
            module.fail_json(msg=f"{name} must be a single path component, got {value!r}")
    result = read(params["root"], params["version"], params["marker"], params["pyyaml_version"])
    result["packages"] = dpkg_packages(params["packages"])
    result["python_version"] = (
        _python_version(module, params["python"], params["python_min"]) if params["python"] else None
    )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
