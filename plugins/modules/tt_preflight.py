#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: tt_preflight
short_description: Check a Tenstorrent host against the models it should serve before anything is installed or started
version_added: 0.1.0
description:
  - Compares the facts of M(ttfleet.inference.tt_facts) with the declared device and with the model specs of the
    models in O(models), and fails with one message per problem that names the host, the model, the requirement, the
    measured value and the fix.
  - "Checks, each of which O(checks) can set to V(fail), V(warn) or V(skip):"
  - C(device_type) - boards were found and make the declared O(device) (by tt-inference-server's rule, see
    M(ttfleet.inference.tt_facts)). Without a declared device, the boards must make some known device.
  - C(hugepages) - a hugetlbfs with 1 GiB pages is mounted at C(/dev/hugepages-1G) (the containers bind it).
  - C(hugepages_pages) - at least 4 x 1 GiB pages per PCIe device are reserved, as tenstorrent-tools sets up. The
    reserved count (not the free count) is compared, so that hosts that already serve models pass. Warns by default.
  - C(docker) - the Docker engine answers on its socket.
  - C(disk) - the free space of the volume root holds the C(min_disk_gb) of every model whose weights are not complete
    yet, plus O(disk_margin_gb). A model counts as 0 when its expected volume under O(volume_root) holds complete
    weights, or when a volume under O(volume_root) or O(preseeded_roots) can be aliased to it (see
    M(ttfleet.inference.volume_facts)).
  - C(ram) - the memory of the host holds the sum of C(min_ram_gb) of the models whose weights are not on the host yet.
  - C(firmware) - the firmware bundle of every board satisfies each model's C(system_requirements.firmware) specifier,
    and all boards run the same bundle (tt-inference-server refuses mixed bundles).
  - C(kmd) - the kernel driver version satisfies each model's C(system_requirements.kmd) specifier.
  - Requirements a spec marks as C(SUGGESTED) (not C(STRICT)) only warn, as in tt-inference-server.
  - Version specifiers are evaluated by PEP 440 rules (C(>=), C(<=), C(==), C(!=), C(>), C(<), C(~=), C(==X.*),
    comma means and) without the C(packaging) library, which target hosts may lack.
  - Read-only; never changes anything.
extends_documentation_fragment:
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  facts:
    description:
      - The facts of M(ttfleet.inference.tt_facts) for this host, its RV(ttfleet.inference.tt_facts#module:tt) dict
        (C(ansible_facts.tt)) or its whole registered result. Required unless O(gather) is given.
    type: dict
  gather:
    version_added: 0.3.0
    description:
      - Gather the facts in this call, with the options of M(ttfleet.inference.tt_facts) (for example C(volume_root),
        C(tt_smi), C(declared_device), C(packages), C(release_dir)), instead of taking O(facts); they are returned as
        RV(tt) and set as C(ansible_facts.tt), as tt_facts does (one module call instead of two, issue 34).
    type: dict
  models_need_release:
    version_added: 0.3.0
    description:
      - Check the O(models) only when O(tt_inference_server_dir) exists; without it they are not checked and
        RV(release_missing) is true (a host on which no release is installed yet).
    type: bool
    default: false
  device:
    description:
      - The tt-inference-server device this host is declared to be, for example V(n150), V(t3k) or V(p300x2).
      - Defaults to the C(declared_device) of O(facts); without one, the device the boards make is used to select the
        model specs and C(device_type) only checks that the boards make a known device.
    type: str
  models:
    description:
      - Models the host should serve. Each entry is a dict with C(name) (the model, as
        O(ttfleet.inference.model_spec#module:model) takes it) and optionally C(impl), C(engine), C(image) (as
        O(ttfleet.inference.model_spec#module:image)) and C(state). Other keys are ignored, so a role's whole model
        list can be passed.
      - Only entries whose C(state) is V(present) (the default) are checked.
    type: list
    elements: dict
    default: []
  tt_inference_server_dir:
    description:
      - Root of a tt-inference-server checkout on the target host, whose model specs give each model's requirements.
        See O(ttfleet.inference.model_spec#module:tt_inference_server_dir).
      - One of this and O(spec_file) is required when O(models) has a model that is present.
    type: path
  spec_file:
    description:
      - A spec export on the target host (C(release_model_spec.json), gzip-compressed files too). See
        O(ttfleet.inference.model_spec#module:spec_file).
      - Mutually exclusive with O(tt_inference_server_dir).
    type: path
  python:
    description:
      - Python interpreter (3.10 or later, with PyYAML) used to import the checkout's code when
        O(tt_inference_server_dir) is set. Defaults to the interpreter that runs the module.
    type: path
  model_specs_env:
    description:
      - Catalog of the checkout to check the models against, V(prod) or upstream's dev catalog V(dev) (what
        C(run.py --dev-mode) selects). See O(ttfleet.inference.model_spec#module:model_specs_env).
    type: str
    choices: [prod, dev]
    default: prod
  volume_root:
    description:
      - Directory that holds the tt-inference-server volumes (C(run.py --host-volume)). Expected volumes are looked up
        here.
      - The free space compared is the one O(facts) measured, for the C(volume_root) given to
        M(ttfleet.inference.tt_facts); give both modules the same directory.
    type: path
    default: /var/lib/tt-cache
  preseeded_roots:
    description:
      - More directories (shell globs allowed) that may hold pre-seeded volumes, for example
        V(/home/*/data/tt-cache) on QuietBox 2 hosts. A model whose weights are complete in one of them needs no disk.
    type: list
    elements: path
    default: []
  checks:
    description:
      - Level of each check by name (V(device_type), V(hugepages), V(hugepages_pages), V(docker), V(disk), V(ram),
        V(firmware), V(kmd)), one of V(fail), V(warn) or V(skip).
      - Checks not named keep their default, V(fail) for all but V(hugepages_pages), which is V(warn).
    type: dict
    default: {}
  disk_margin_gb:
    description:
      - GiB that must stay free on top of the weights to download (logs, tensor caches, other data).
    type: float
    default: 10
  host:
    description:
      - Name of the host in messages. Defaults to the C(hostname) of O(facts).
    type: str
notes:
  - Sizes are GiB (1024^3 bytes), as tt-inference-server counts C(min_disk_gb) and C(min_ram_gb).
  - Like tt-inference-server's C(run.py), the RAM check skips models whose weights are complete on the host (the
    floor covers fetching and converting weights); it sums C(min_ram_gb) over the others, which may be fetched
    in the same run.
seealso:
  - module: ttfleet.inference.tt_facts
  - module: ttfleet.inference.model_spec
  - module: ttfleet.inference.volume_facts
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
---
- name: Gather Tenstorrent facts
  ttfleet.inference.tt_facts:
    declared_device: p300x2
    volume_root: /opt/tt-cache

- name: Check the host before serving Qwen3-32B
  ttfleet.inference.tt_preflight:
    facts: "{{ ansible_facts.tt }}"
    device: p300x2
    models:
      - name: Qwen3-32B
    tt_inference_server_dir: /opt/tt-inference-server
    volume_root: /opt/tt-cache
    preseeded_roots:
      - /home/*/data/tt-cache
    checks:
      hugepages_pages: skip
      kmd: warn

# Fails with, for example:
# lab-p300x2-1: Qwen3-32B needs 94 GB free on /opt/tt-cache (min_disk_gb 84 + margin 10), 12.3 GB free.
# Fix: free space, point the volume root at a bigger filesystem, or pre-seed the weights
"""

RETURN = r"""
tt:
  description: The facts O(gather) gathered, as M(ttfleet.inference.tt_facts) returns them; also set as
    C(ansible_facts.tt).
  returned: with O(gather)
  type: dict
release_missing:
  description: O(models_need_release) is set and O(tt_inference_server_dir) does not exist, so no model was checked.
  returned: always
  type: bool
failures:
  description: Problems of checks at level V(fail). The module fails when there is any.
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: Name of the check.
      type: str
      sample: disk
    model:
      description: The model the problem is about, V(null) for host-wide problems.
      type: str
      sample: Qwen3-32B
    requirement:
      description: What was required.
      type: str
      sample: 94 GB free on /opt/tt-cache
    measured:
      description: What was found.
      type: str
      sample: 12.3 GB free
    fix:
      description: How to fix it.
      type: str
    msg:
      description: One sentence with host, model, requirement, measured value and fix.
      type: str
warning_details:
  description: Problems of checks at level V(warn) and unmet C(SUGGESTED) requirements, with the keys of
    RV(failures). The C(msg) of each is also emitted as an Ansible warning.
  returned: always
  type: list
  elements: dict
passed:
  description: Checks that ran and found nothing.
  returned: always
  type: list
  elements: str
  sample: [device_type, hugepages, docker, firmware]
skipped_checks:
  description:
    - Checks set to V(skip).
    - Not named C(skipped), which Ansible reads as the status of the task.
  returned: always
  type: list
  elements: str
device:
  description: The device the model specs were selected for.
  returned: always
  type: str
  sample: p300x2
models:
  description: The present models with what their specs require.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The model as given.
      type: str
    model_name:
      description: The spec's model name.
      type: str
    device:
      description: The device of the spec.
      type: str
    impl_id:
      description: The implementation of the spec.
      type: str
    volume_name:
      description: The volume the spec expects.
      type: str
      sample: volume_id_tt_transformers-Qwen3-32B-v0.17.0
    volume_path:
      description: Where the spec expects it under O(volume_root).
      type: str
    min_disk_gb:
      description: C(min_disk_gb) of the spec.
      type: float
      sample: 84
    weights_present:
      description: Whether complete weights are already on the host (expected volume or a volume it can be aliased to).
      type: bool
    weights_path:
      description: The volume holding those weights, else V(null).
      type: str
    counted_disk_gb:
      description: What the C(disk) check counts for this model, 0 when the weights are present.
      type: float
    min_ram_gb:
      description: C(min_ram_gb) of the spec.
      type: float
      sample: 80.0
    system_requirements:
      description: C(firmware) and C(kmd) requirements of the spec (C(specifier) and C(mode)), V(null) when none.
      type: dict
      sample: {firmware: {specifier: ">=19.2.0", mode: STRICT}, kmd: {specifier: ">=2.5.0", mode: STRICT}}
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._host.collect import OPTIONS, CollectError, collect
from ansible_collections.ttfleet.inference.plugins.module_utils._host.preflight import (
    PreflightError,
    check_levels,
    evaluate,
    present_models,
    unwrap_facts,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.preflight import model_summaries
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import (
    SPEC_SOURCE_OPTIONS,
    load_params_catalog,
)

_SOURCE_KEYS = ("tt_inference_server_dir", "spec_file", "python", "model_specs_env")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            facts=dict(type="dict"),
            gather=dict(type="dict"),
            models_need_release=dict(type="bool", default=False),
            device=dict(type="str"),
            models=dict(type="list", elements="dict", default=[]),
            volume_root=dict(type="path", default="/var/lib/tt-cache"),
            preseeded_roots=dict(type="list", elements="path", default=[]),
            checks=dict(type="dict", default={}),
            disk_margin_gb=dict(type="float", default=10),
            host=dict(type="str"),
            **{key: SPEC_SOURCE_OPTIONS[key] for key in _SOURCE_KEYS},
        ),
        mutually_exclusive=[("tt_inference_server_dir", "spec_file"), ("facts", "gather")],
        required_one_of=[("facts", "gather")],
        supports_check_mode=True,
    )
    params = module.params
    gathered = None
    if params["gather"] is not None:
        unknown = sorted(set(params["gather"]) - set(OPTIONS))
        if unknown:
            module.fail_json(msg=f"gather: unknown options {', '.join(unknown)}; it takes those of tt_facts.")
        try:
            gathered = collect({**{name: spec.get("default") for name, spec in OPTIONS.items()}, **params["gather"]})
        except CollectError as exc:
            module.fail_json(msg=f"gather: {exc}")
    release_missing = bool(
        params["models_need_release"]
        and params["tt_inference_server_dir"]
        and not os.path.isdir(params["tt_inference_server_dir"])
    )
    if release_missing:
        params["models"] = []
    with fail_on(module):
        facts = gathered if gathered is not None else unwrap_facts(params["facts"])
        levels = check_levels(params["checks"])
        models = present_models(params["models"])
        if params["disk_margin_gb"] < 0:
            raise PreflightError(f"disk_margin_gb must not be negative, got {params['disk_margin_gb']}.")
        declared = params["device"] or facts.get("declared_device")
        device = declared or facts.get("implied_device")
        summaries: list[dict[str, Any]] = []
        if models:
            if not (params["tt_inference_server_dir"] or params["spec_file"]):
                raise PreflightError(
                    "models are given, so their specs are needed: set tt_inference_server_dir (a tt-inference-server "
                    "checkout) or spec_file (a release_model_spec.json)."
                )
            if not device:
                raise PreflightError(
                    "no device to select the model specs for: set device (the declared tt-inference-server device) "
                    f"or fix the board detection ({facts.get('implied_device_reason') or 'no boards'})."
                )
            catalog = load_params_catalog(params, params["tt_inference_server_dir"])
            for warning in catalog.get("warnings", []):
                module.warn(warning)
            summaries, scan_warnings = model_summaries(
                catalog, models, device, params["volume_root"], params["preseeded_roots"]
            )
            for warning in scan_warnings:
                module.warn(warning)
        result = evaluate(
            facts,
            summaries,
            levels,
            host=params["host"],
            declared_device=declared,
            disk_margin_gb=params["disk_margin_gb"],
        )
    # "warnings" is Ansible's own key (the text of module.warn), so the dicts go under another name.
    result["warning_details"] = result.pop("warnings")
    # So is "skipped": a true value shows the task as skipped (a passing preflight with a check set to skip did).
    result["skipped_checks"] = result.pop("skipped")
    result.update(changed=False, device=device, models=summaries, release_missing=release_missing)
    if gathered is not None:
        result.update(tt=gathered, ansible_facts={"tt": gathered})
    for warning in result["warning_details"]:
        module.warn(warning["msg"])
    if result["failures"]:
        count = len(result["failures"])
        module.fail_json(
            msg=f"{count} preflight problem{'s' if count > 1 else ''}: "
            + " ".join(failure["msg"] for failure in result["failures"]),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
