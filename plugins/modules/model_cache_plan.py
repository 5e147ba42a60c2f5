#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: model_cache_plan
short_description: Plan the volumes, weights and kernel caches of the models a host serves
version_added: 0.2.0
description:
  - The planning step of the P(ttfleet.inference.model_cache#role) role, for every model of O(models) at once. The
    catalog is read and each model resolved once (as M(ttfleet.inference.model_spec) does), the volume roots are
    scanned once (as M(ttfleet.inference.volume_facts) does), and for each model the module reports its spec, the
    volume the spec expects, the source its weights come from and why, the volume it would be aliased to, the key of
    its kernel cache and the bytes still to fetch.
  - "The source is the first of the model's C(sources) (else O(sources)) that applies: V(preseeded) when the expected
    volume is absent and a volume of the same impl and model holds complete weights (a candidate recording another
    revision than the model's is none), or when the expected volume holds complete weights that no fetch of ours
    recorded; V(hf) when the model has a revision or O(allow_floating_revision) is on; V(path) when it has a path
    (else O(path)); V(s3) when O(s3_bucket) is set and the revision too. No source that applies fails, naming the
    model and the fix."
  - For V(hf), V(path) and V(s3), the weights are planned as the check mode of M(ttfleet.inference.model_weights)
    plans them (the source is listed and compared with the volume; nothing is written), which gives the bytes to
    fetch and the filesystem they land on. Then every filesystem must take all of its models at once, plus
    O(disk_margin_gb), or the module fails before any byte moves.
  - With O(weights=false) only the specs and kernel keys are reported (the harvest of kernel caches needs no more).
  - Read-only; never changes anything.
author:
  - ttfleet.inference maintainers (@ttfleet)
seealso:
  - module: ttfleet.inference.model_weights
  - module: ttfleet.inference.volume_facts
  - module: ttfleet.inference.model_spec
extends_documentation_fragment:
  - ttfleet.inference.proxy
  - ttfleet.inference.attributes
  - ttfleet.inference.weights_source
attributes:
  idempotent:
    support: full
  diff_mode:
    support: none
  check_mode:
    support: full
    details:
      - Runs the same in check mode; it writes nothing in either.
options:
  models:
    description:
      - The served models, entries of C(tt_models) (see the P(ttfleet.inference.model_cache#role) role). Each has a
        C(name) and may have C(device), C(impl), C(engine), C(image), C(revision), C(path) and C(sources); other keys
        are kept in RV(models[].entry).
    type: list
    elements: dict
    required: true
  device:
    description: The device of the entries that name none (the host's C(tt_device)).
    type: str
    required: true
  volume_root:
    description: The directory the volumes live in (C(tt_volume_root)).
    type: path
    required: true
  search_roots:
    description: More directories, or globs, to look for preseeded volumes in (C(tt_preseeded_roots)).
    type: list
    elements: path
    default: []
  release_dirs:
    description:
      - Other release checkouts (globs) whose specs date a candidate volume's kernel cache when the volume records
        nothing. Defaults to the siblings of the checkout under C(releases/).
    type: list
    elements: path
  kernel_isolation:
    description:
      - Give a volume aliased from one made for another C(tt_metal_commit) its own kernel cache (weights hardlinked);
        see M(ttfleet.inference.volume_alias).
    type: bool
    default: true
  tt_inference_server_dir:
    description:
      - Root of the tt-inference-server checkout whose catalog is read (see M(ttfleet.inference.model_spec)).
        Mutually exclusive with O(spec_file).
    type: path
  spec_file:
    description: A spec export on the host instead of a checkout (see M(ttfleet.inference.model_spec)).
    type: path
  python:
    description: Python interpreter that imports the checkout's code (see M(ttfleet.inference.model_spec)).
    type: path
  model_specs_env:
    description: Catalog of the checkout, V(prod) or upstream's V(dev) (see M(ttfleet.inference.model_spec)).
    type: str
    choices: [prod, dev]
    default: prod
  sources:
    description: The sources, in order, of the entries that list none (C(model_cache_sources)).
    type: list
    elements: str
    choices: [preseeded, hf, path, s3]
    default: [preseeded, hf]
  path:
    description: The directory of the V(path) source of the entries that give none (C(model_cache_path)).
    type: str
    default: ""
  peers:
    description: Whether pinned weights may be shared between the hosts of a site (C(shareable) in RV(work)).
    type: bool
    default: true
  site:
    description: The site of the host, which the fan-out of the weights groups hosts by.
    type: str
    default: default
  weights:
    description: Plan the volumes and the weights. V(false) reports only the specs and kernel keys.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Plan the models of this host
  ttfleet.inference.model_cache_plan:
    models: "{{ tt_models }}"
    device: "{{ tt_device }}"
    volume_root: /var/lib/tt-cache
    tt_inference_server_dir: /opt/tt-inference-server/current
  register: plan

- name: Show where each model's weights come from
  ansible.builtin.debug:
    msg: "{{ plan.models | map(attribute='reason') | list }}"
"""

RETURN = r"""
models:
  description: One record per entry of O(models), in their order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The entry's name.
      type: str
    entry:
      description: The entry as given.
      type: dict
    spec:
      description: The resolved spec, as M(ttfleet.inference.model_spec) returns it.
      type: dict
    volume:
      description:
        - The volume the spec expects, as RV(ttfleet.inference.volume_facts#module:expected) reports it. Not with
          O(weights=false).
      type: dict
    candidate:
      description:
        - The volume the expected one is made from, as one of RV(ttfleet.inference.volume_facts#module:candidates)
          (with C(reuse) and C(reuse_reason)), when RV(models[].action) is V(alias); else null.
      type: dict
    source:
      description: V(preseeded), V(hf), V(path) or V(s3). Not with O(weights=false).
      type: str
    reason:
      description: Why this source, and why each source before it in the order did not apply.
      type: str
    action:
      description:
        - V(alias) (make the expected volume from RV(models[].candidate)), V(own) (weights in place get their
          owners and modes) or V(fetch) (fetch from RV(models[].source), comparing what is in place).
      type: str
    pending:
      description:
        - Whether the role has work for the model here, from model_weights' own check mode with the options the
          role passes - for V(fetch), bytes, owners, modes, the manifest or the volume layout to change; for
          V(own), the layout. Always true for V(alias). The role skips the module where it is false.
      type: bool
      version_added: 0.3.0
    revision:
      description: The commit the source resolved, for a fetch from V(hf) or V(s3).
      type: str
    kernel:
      description: The key of the model's kernel cache (see M(ttfleet.inference.kernel_cache)) and its volume.
      type: dict
      contains:
        volume: {description: The volume path the spec names., type: str}
        volume_name: {description: The volume's name., type: str}
        model_name: {description: The spec's model name., type: str}
        mesh: {description: The mesh of the device., type: str}
        impl_id: {description: The implementation id., type: str}
        tt_metal_commit: {description: The spec's tt-metal commit., type: str}
        vllm_commit: {description: "The spec's vLLM commit, or empty.", type: str}
    bytes_to_fetch:
      description: Bytes the fetch moves (0 for a converged volume and for V(preseeded)).
      type: int
    bytes_needed:
      description: Bytes of free space the fetch needs (staging included).
      type: int
    verified:
      description:
        - How the files in place were compared with the origin's listing (M(ttfleet.inference.model_weights)'s
          RV(ttfleet.inference.model_weights#module:verified)), for a fetch; V(null) otherwise.
      type: str
      version_added: 0.3.0
    hashed:
      description: The files the comparison hashed, for a fetch (empty when sizes and the manifest sufficed).
      type: list
      elements: str
      version_added: 0.3.0
    filesystem:
      description: The filesystem the weights land on (C(device), C(path), C(free_bytes)), for a fetch.
      type: dict
    work:
      description: The model's entry of RV(work).
      type: dict
    extras:
      description: The work entries of the entry's extra repositories (C(extra_repos), such as a draft model), fetched
        into C(<volume>/weights/<repository name>); also in RV(work).
      type: list
      elements: dict
work:
  description:
    - The work entry of each weights directory, the input of the P(ttfleet.inference.weights_fanout#filter) filter
      (C(model), C(origin), C(repo_id), C(revision), C(site), C(dest), C(volume), C(complete), C(shareable), C(bytes),
      C(pending) - whether the fetch would change anything here - and the rest). Empty with O(weights=false).
    - A model that several entries serve (one per board or per profile) shares one volume and has one entry; each
      extra repository (RV(models[].extras)) has its own, with C(extra_of) naming its model.
    - One directory holds one repository at one revision. Two different pairs that would share one (two extra
      repositories with the same last name component, one named like the model's weights directory, or entries of
      one model pinning other revisions) fail the module before any origin is listed, naming both.
  returned: always
  type: list
  elements: dict
root_exists:
  description: Whether O(volume_root) exists (check mode cannot plan an alias in a volume root still to make).
  returned: always
  type: bool
spec_source:
  description: Where the catalog was read from (V(code), V(release_model_spec.json) or V(model_specs_output.json)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import PROXY_OPTIONS, apply_proxy_env
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_url_credentials
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.cache import (
    PLAN_ERRORS,
    SOURCES,
    failure_text,
    plan_cache,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.checkout import (
    DEFAULT_MODEL_SPECS_ENV,
    MODEL_SPECS_ENVS,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.options import WEIGHTS_SOURCE_OPTIONS

ARGUMENT_SPEC = dict(
    **PROXY_OPTIONS,
    models=dict(type="list", elements="dict", required=True),
    device=dict(type="str", required=True),
    volume_root=dict(type="path", required=True),
    search_roots=dict(type="list", elements="path", default=[]),
    release_dirs=dict(type="list", elements="path"),
    kernel_isolation=dict(type="bool", default=True),
    tt_inference_server_dir=dict(type="path"),
    spec_file=dict(type="path"),
    python=dict(type="path"),
    model_specs_env=dict(type="str", choices=list(MODEL_SPECS_ENVS), default=DEFAULT_MODEL_SPECS_ENV),
    sources=dict(type="list", elements="str", choices=list(SOURCES), default=["preseeded", "hf"]),
    path=dict(type="str", default=""),
    peers=dict(type="bool", default=True),
    site=dict(type="str", default="default"),
    weights=dict(type="bool", default=True),
    **WEIGHTS_SOURCE_OPTIONS,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("tt_inference_server_dir", "spec_file")],
        supports_check_mode=True,
    )
    apply_proxy_env(module)
    credentials_error = mask_url_credentials(module, ("hf_endpoint", "s3_endpoint"))
    try:
        result = plan_cache(module.params, module.warn, credentials_error)
    except (*PLAN_ERRORS, OSError) as exc:
        module.fail_json(msg=failure_text(exc, module.params))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
