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
      - The checkout's own C(workflows/model_spec.py) is imported with O(python). A release unpacked from an archive
        (no C(.git)) is imported too. tt-inference-server looks for its repository root by walking up to a C(.git),
        and while the catalog is imported that walk stops at the checkout, as in a clone; nothing is written to it.
      - When the import fails, its C(release_model_spec.json) and then the flat C(model_specs_output.json) of
        releases before v0.11 are read instead, with a warning that names the cause (no PyYAML, Python older than
        3.10, an error in the code). Those exports disagree with the code in some releases (v0.10.1, v0.11.1 to
        v0.15.0).
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
  model_specs_env:
    description:
      - Catalog of the checkout to read, as tt-inference-server's C(MODEL_SPECS_ENV) names it.
      - V(prod) is the release catalog that C(run.py) uses by default.
      - V(dev) is upstream's dev catalog (C(workflows/model_specs/dev/)), the one C(run.py --dev-mode) selects by
        setting C(MODEL_SPECS_ENV=dev). Only releases v0.16.0 and later have it; older ones are refused. It is read
        from the checkout's code only, with no fallback to the exports (they hold the prod catalog), and a
        O(spec_file) is refused.
      - Dev specs of v0.17.0 and later pin neither an image nor a version, so a spec that names a volume or a container
        also needs the image to run (C(run.py --override-docker-image)), whose tag's version names the volume.
    type: str
    choices: [prod, dev]
    default: prod
"""
