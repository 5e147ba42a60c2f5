#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: model_spec
short_description: Resolve a tt-inference-server model spec and the names and paths derived from it
version_added: 0.1.0
description:
  - Reads the model specs of a tt-inference-server (TTIS) release, from a checkout (by default the current release that
    the P(ttfleet.inference.inference_server#role) role installs) or from a spec export, and selects
    one spec for O(model) and O(device) exactly as C(run.py --model --tt-device [--impl] [--engine]) does. The
    implementation marked as default wins; without one, O(impl) or O(engine) is required.
  - Returns what TTIS derives from that spec, without running C(run.py) (which writes secrets to C(.env), changes
    permissions and may start downloads), including the host volume name C(volume_id_<impl_id>-<model_name>-v<version>),
    the Docker named volume, the weights and tensor cache directories, the container paths, the Docker image and the
    system requirements.
  - With O(list=true), returns every spec servable on O(device) (or on every device) instead.
  - With O(model_specs_env=dev), selects from upstream's dev catalog, as C(run.py --dev-mode) does; with O(image), the
    spec is the one C(run.py --override-docker-image) runs.
  - Invalid names (more than one C(/), C(..), control characters) are rejected before any file is read. Unknown models
    are answered with the closest names on that device, models not built for the device with the devices they
    support, and ambiguous selections with the implementation and engine choices.
  - Runs on the target host, where the checkout or spec file lives. Needs Python 3.10 or later.
extends_documentation_fragment:
  - ttfleet.inference.spec_source
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  volume_root:
    description:
      - Absolute host directory that holds the volumes (C(run.py --host-volume)). When set, RV(paths) are absolute
        paths under it; otherwise they are relative to the volume.
    type: path
  image:
    description:
      - Docker image to run instead of the spec's, as C(run.py --override-docker-image) takes it. As there, the
        version its tag starts with replaces the spec's version, which names the host volume (a tag such as
        C(:dev) keeps the spec's), and the commits a CI tag names replace the spec's.
      - Needed to resolve the dev specs of v0.17.0 and later (O(model_specs_env=dev)), which pin no image or version.
    type: str
  list:
    description:
      - Return RV(models), every spec servable on O(device), instead of selecting one. O(device) and O(model) then
        only filter the list and are optional.
      - When V(false), O(model) and O(device) are required.
    type: bool
    default: false
notes:
  - C(run.py) of TTIS v0.20.0 refuses vLLM images older than v0.11.0 (for example C(Llama-3.1-8B-Instruct) on
    V(n150)). Such specs are still returned, with RV(legacy_interface=true), because their images need the older
    container interface.
seealso:
  - name: tt-inference-server
    description: The upstream project whose model specs this module reads.
    link: https://github.com/tenstorrent/tt-inference-server
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
---
- name: Resolve Qwen3-32B on a QuietBox 2 (p300x2) from the current release (/opt/tt-inference-server/current)
  ttfleet.inference.model_spec:
    model: Qwen3-32B
    device: p300x2
    volume_root: /home/tt/data/tt-cache
  register: __qb2_spec
  # With TTIS v0.20.0: volume_name is volume_id_tt_transformers-Qwen3-32B-v0.17.0 and
  # paths.tt_metal_cache ends in tt_metal_cache/cache_Qwen3-32B/P300x2

- name: Show where the QuietBox 2 expects its weights and kernels
  ansible.builtin.debug:
    msg:
      - "Volume: {{ __qb2_spec.paths.volume }}"
      - "Weights: {{ __qb2_spec.paths.weights }}"
      - "Image: {{ __qb2_spec.docker_image }}"

- name: Resolve from a release_model_spec.json export copied to the host
  ttfleet.inference.model_spec:
    model: Qwen/Qwen3-32B
    device: galaxy
    spec_file: /opt/specs/release_model_spec-v0.20.0.json
  register: __galaxy_spec

- name: Import the code of a checkout made by hand with a Python that has PyYAML
  ttfleet.inference.model_spec:
    model: Llama-3.1-8B-Instruct
    device: n150
    tt_inference_server_dir: /home/tt/tt-inference-server
    python: /home/tt/tt-inference-server/.venv/bin/python
  register: __n150_spec

- name: Resolve a model from upstream's dev catalog, as run.py --dev-mode --override-docker-image does
  ttfleet.inference.model_spec:
    model: Qwen3-32B
    device: p300x2
    model_specs_env: dev
    image: ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.20.0-de59f8a-03fa3af
    volume_root: /home/tt/data/tt-cache
  register: __qb2_dev_spec
  # volume_name is volume_id_tt_transformers-Qwen3-32B-v0.20.0: the version of the image's tag

- name: Pick an implementation explicitly when the model has no default on the device
  ttfleet.inference.model_spec:
    model: Llama-3.2-3B
    device: n150
    impl: forge-vllm-plugin

- name: List every model servable on a QuietBox 2
  ttfleet.inference.model_spec:
    device: p300x2
    list: true
  register: __qb2_models
"""

RETURN = r"""
spec_source:
  description:
    - Which source the specs came from.
    - V(checkout_code) when the checkout's C(workflows/model_spec.py) was imported, V(release_model_spec.json) or
      V(model_specs_output.json) when the checkout's export was read instead, V(spec_file) for O(spec_file).
  returned: always
  type: str
  sample: checkout_code
model_specs_env:
  description:
    - Catalog the specs come from, V(prod) or V(dev) (see O(model_specs_env)); V(null) for a O(spec_file).
  returned: always
  type: str
  sample: prod
spec_path:
  description: File the specs were read from (C(workflows/model_spec.py) for the code path).
  returned: always
  type: str
  sample: /opt/tt-inference-server/current/workflows/model_spec.py
release_version:
  description: TTIS release of the specs, V(null) when a spec file does not say.
  returned: always
  type: str
  sample: 0.20.0
models:
  description: Every spec servable on O(device), sorted by model name, device, default first.
  returned: when O(list=true)
  type: list
  elements: dict
  sample:
    - model_name: Qwen3-32B
      hf_model_repo: Qwen/Qwen3-32B
      device: p300x2
      impl_id: tt_transformers
      impl_name: tt-transformers
      inference_engine: vLLM
      default_impl: true
      version: 0.17.0
      status: FUNCTIONAL
      model_type: LLM
      legacy_interface: false
      volume_name: volume_id_tt_transformers-Qwen3-32B-v0.17.0
model_name:
  description: Short model name (basename of the HF repository).
  returned: when O(list=false)
  type: str
  sample: Qwen3-32B
hf_model_repo:
  description: Hugging Face repository id of the model.
  returned: when O(list=false)
  type: str
  sample: Qwen/Qwen3-32B
hf_weights_repo:
  description: Hugging Face repository the weights are downloaded from.
  returned: when O(list=false)
  type: str
  sample: Qwen/Qwen3-32B
model_id:
  description: TTIS model id of the spec.
  returned: when O(list=false)
  type: str
  sample: id_tt-transformers_Qwen3-32B_p300x2
impl_id:
  description: Implementation id (underscore form, used in volume names).
  returned: when O(list=false)
  type: str
  sample: tt_transformers
impl_name:
  description: Implementation name (hyphen form, what C(run.py --impl) takes).
  returned: when O(list=false)
  type: str
  sample: tt-transformers
inference_engine:
  description: Inference engine of the spec.
  returned: when O(list=false)
  type: str
  sample: vLLM
device:
  description: TTIS device name in lower case.
  returned: when O(list=false)
  type: str
  sample: p300x2
device_type:
  description: TTIS device type in upper case, as in the spec.
  returned: when O(list=false)
  type: str
  sample: P300X2
subdevice_type:
  description: Device of one data-parallel replica, V(null) without data parallelism.
  returned: when O(list=false)
  type: str
  sample: T3K
default_impl:
  description: Whether the selected spec is the default implementation on the device.
  returned: when O(list=false)
  type: bool
  sample: true
version:
  description: Per-model release pin of the spec (not the TTIS release); part of the volume name.
  returned: when O(list=false)
  type: str
  sample: 0.17.0
docker_image:
  description: Docker image of the spec.
  returned: when O(list=false)
  type: str
  sample: ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.17.0-8c48a10-f52987a
image_version:
  description: Version prefix of the image tag, V(null) when the tag has none.
  returned: when O(list=false)
  type: str
  sample: 0.17.0
tt_metal_commit:
  description: tt-metal commit of the image.
  returned: when O(list=false)
  type: str
  sample: 8c48a10
vllm_commit:
  description: vLLM commit of the image, V(null) for media and forge images.
  returned: when O(list=false)
  type: str
  sample: f52987a
mesh:
  description:
    - Leaf directory of the tensor cache. The mesh of the data-parallel subdevice when there is one
      (V(galaxy) with 4 replicas gives V(T3K)), else the device's (V(galaxy) gives V(TG)).
  returned: when O(list=false)
  type: str
  sample: P300x2
volume_name:
  description: Host volume directory name, C(volume_id_<impl_id>-<model_name>-v<version>).
  returned: when O(list=false)
  type: str
  sample: volume_id_tt_transformers-Qwen3-32B-v0.17.0
named_volume:
  description: Docker named volume used without a host volume, C(volume_id_<impl_id>-<model_name>).
  returned: when O(list=false)
  type: str
  sample: volume_id_tt_transformers-Qwen3-32B
weights_subdir:
  description: Weights directory relative to the volume.
  returned: when O(list=false)
  type: str
  sample: weights/Qwen3-32B
tt_metal_cache_subdir:
  description: Tensor cache directory relative to the volume.
  returned: when O(list=false)
  type: str
  sample: tt_metal_cache/cache_Qwen3-32B/P300x2
paths:
  description: Host paths, absolute under O(volume_root) when it is set, else relative to the volume.
  returned: when O(list=false)
  type: dict
  contains:
    volume:
      description: The volume directory (its name alone without O(volume_root)).
      type: str
      sample: /home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0
    weights:
      description: The weights directory.
      type: str
      sample: /home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/weights/Qwen3-32B
    tt_metal_cache:
      description: The tensor cache directory.
      type: str
      sample: /home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0/tt_metal_cache/cache_Qwen3-32B/P300x2
    container:
      description: Paths inside the container, the same as RV(container).
      type: dict
      sample:
        cache_root: /home/container_app_user/cache_root
        tt_cache_path: /home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/P300x2
        weights: /home/container_app_user/cache_root/weights/Qwen3-32B
container:
  description: Paths inside the container (also under RV(paths.container)).
  returned: when O(list=false)
  type: dict
  contains:
    cache_root:
      description: Mount point of the volume.
      type: str
      sample: /home/container_app_user/cache_root
    tt_cache_path:
      description: Value of E(TT_CACHE_PATH).
      type: str
      sample: /home/container_app_user/cache_root/tt_metal_cache/cache_Qwen3-32B/P300x2
    weights:
      description: Weights directory as the container sees it.
      type: str
      sample: /home/container_app_user/cache_root/weights/Qwen3-32B
legacy_interface:
  description:
    - Whether the spec is a vLLM spec whose version is older than v0.11.0, so its image uses the older container
      interface that C(run.py) v0.16 and later refuse to start.
  returned: when O(list=false)
  type: bool
  sample: false
legacy_layout:
  description:
    - Whether the specs come from a TTIS release before v0.11, whose C(run.py) read weights from the HF cache instead
      of C(weights/<model_name>) in the volume.
  returned: when O(list=false)
  type: bool
  sample: false
min_disk_gb:
  description: Minimum free disk space TTIS asks for before downloading weights.
  returned: when O(list=false)
  type: int
  sample: 84
min_ram_gb:
  description: Minimum RAM TTIS asks for before downloading weights.
  returned: when O(list=false)
  type: float
  sample: 80.0
param_count:
  description: Parameter count in billions, as TTIS infers it.
  returned: when O(list=false)
  type: int
  sample: 32
system_requirements:
  description: Firmware and KMD version specifiers, V(null) when the spec has none.
  returned: when O(list=false)
  type: dict
  sample:
    firmware:
      specifier: ">=19.2.0"
      mode: STRICT
    kmd:
      specifier: ">=2.5.0"
      mode: STRICT
env_vars:
  description: Container environment of the spec (spec and device values merged as TTIS does), values as strings.
  returned: when O(list=false)
  type: dict
  sample:
    MESH_DEVICE: P300x2
    ARCH_NAME: blackhole
vllm_args:
  description: vLLM arguments of the spec.
  returned: when O(list=false)
  type: dict
  sample:
    model: Qwen/Qwen3-32B
    max_model_len: "131072"
max_concurrency:
  description: Maximum concurrent users of the spec.
  returned: when O(list=false)
  type: int
  sample: 32
max_context:
  description: Maximum context length of the spec.
  returned: when O(list=false)
  type: int
  sample: 131072
tensor_cache_timeout:
  description: Seconds TTIS allows for the first start with an empty tensor cache.
  returned: when O(list=false)
  type: float
  sample: 3600.0
status:
  description: Maturity of the spec (V(EXPERIMENTAL), V(FUNCTIONAL), V(COMPLETE), V(TOP_PERF)).
  returned: when O(list=false)
  type: str
  sample: FUNCTIONAL
model_type:
  description: Model type of the spec, for example V(LLM), V(AUDIO) or V(IMAGE).
  returned: when O(list=false)
  type: str
  sample: LLM
supported_modalities:
  description: Input modalities of the model.
  returned: when O(list=false)
  type: list
  elements: str
  sample: [text]
uses_tensor_model_cache:
  description: Whether the model uses the tensor cache.
  returned: when O(list=false)
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.derive import resolve_params
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.select import list_models, validate_inputs
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import (
    SPEC_SOURCE_OPTIONS,
    default_checkout,
    load_params_catalog,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **SPEC_SOURCE_OPTIONS,
            "volume_root": {"type": "path"},
            "image": {"type": "str"},
            "list": {"type": "bool", "default": False},
        },
        mutually_exclusive=[("tt_inference_server_dir", "spec_file")],
        required_if=[("list", False, ("model", "device"))],
        supports_check_mode=True,
    )
    params = module.params
    with fail_on(module):
        validate_inputs(
            model=params["model"],
            device=params["device"],
            impl=params["impl"],
            engine=params["engine"],
            volume_root=params["volume_root"],
            image=params["image"],
        )
        catalog = load_params_catalog(params, default_checkout(params["tt_inference_server_dir"], params["spec_file"]))
        source = {
            "spec_source": catalog["source"],
            "spec_path": catalog["path"],
            "release_version": catalog.get("release_version"),
            "model_specs_env": catalog.get("model_specs_env"),
        }
        if params["list"]:
            result = {"models": list_models(catalog, device=params["device"], model=params["model"])}
        else:
            result = resolve_params(catalog, params, volume_root=params["volume_root"])
    for warning in catalog.get("warnings", []):
        module.warn(warning)
    module.exit_json(changed=False, **{**result, **source})


if __name__ == "__main__":
    main()
