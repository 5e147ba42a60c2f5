# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment:
    # Where the tt-inference-server model specs come from and which spec to select.
    DOCUMENTATION = r"""
options:
  model:
    description:
      - Model to select, as tt-inference-server's C(run.py --model) takes it (the short name, for example V(Qwen3-32B)),
        or as its Hugging Face repository id (for example V(Qwen/Qwen3-32B)).
    type: str
  device:
    description:
      - tt-inference-server device name, as C(run.py --tt-device) takes it, for example V(n150), V(t3k), V(galaxy),
        V(p150x4) or V(p300x2) (QuietBox 2). Upper case is accepted too.
    type: str
  impl:
    description:
      - Implementation to select, by C(impl_name) (V(tt-transformers), as C(run.py --impl) takes it) or by C(impl_id)
        (V(tt_transformers), as it appears in volume names).
      - Only needed when the model has several implementations on O(device) and none is marked as default.
    type: str
  engine:
    description:
      - Inference engine to select, as C(run.py --engine) takes it.
      - Only needed when the model has several implementations on O(device) and none is marked as default.
    type: str
    choices: [vllm, media, forge]
  tt_inference_server_dir:
    description:
      - Root of a tt-inference-server checkout (a clone of a release tag) on the target host.
      - The checkout's own C(workflows/model_spec.py) is imported with O(python). When that fails (no PyYAML,
        Python older than 3.10, import error), its C(release_model_spec.json) and then the flat
        C(model_specs_output.json) of releases before v0.11 are read instead, with a warning.
      - Mutually exclusive with O(spec_file). When neither is set, V(/opt/tt-inference-server/current) is read, the
        current release that the P(ttfleet.inference.inference_server#role) role installs.
    type: path
  spec_file:
    description:
      - A spec export on the target host, either C(release_model_spec.json) (v0.11 and later) or the flat
        C(model_specs_output.json) of older releases. Gzip-compressed files are read too.
      - Mutually exclusive with O(tt_inference_server_dir).
    type: path
  python:
    description:
      - Python interpreter used to import the checkout's code when a checkout is read. It needs
        Python 3.10 or later and PyYAML.
      - Defaults to the release's own venv when the checkout is one that the P(ttfleet.inference.inference_server#role)
        role installed (its real path is C(<root>/releases/<tag>) and C(<root>/venvs/<tag>/bin/python) exists), else to
        the interpreter that runs the module.
    type: path
"""
