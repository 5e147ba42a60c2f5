#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: container_command
short_description: Compute the docker run command that serves a tt-inference-server model
version_added: 0.1.0
description:
  - Selects the spec of O(model) on O(device) like M(ttfleet.inference.model_spec) and returns the C(docker run)
    command that tt-inference-server (TTIS) C(run.py --docker-server --print-docker-cmd) prints for it, as an argument
    list, without running C(run.py) (which writes secrets to C(<checkout>/.env), changes permissions and may start
    downloads, then starts the container as an orphan with a random name).
  - The argument list has the same options and values as C(run.py --docker-server [--host-volume O(volume_root)]
    [--host-weights-dir O(host_weights_dir)] [--service-port O(port)] [--bind-host O(bind_host)]
    [--device-id O(device_ids)] [--no-auth] [--image-user O(image_user)] [--override-docker-image O(image)]
    --print-docker-cmd) for the release the specs come from, except for four deliberate differences. The
    container name is stable (O(name)) instead of C(tt-inference-server-<random>); the env file is O(env_file)
    instead of C(<checkout>/.env); C(API_KEY) and C(OPENAI_API_KEY) for media images are left to that env file
    instead of being copied onto the command line; and C(--security-opt no-new-privileges) is added, so no process
    in the container gains privileges from a setuid file (every release image runs with it).
  - Media and forge images get the spec's environment, C(MODEL), C(DEVICE), C(CACHE_ROOT) and C(HF_HOME) (or, for the
    SDXL models run by the C++ media server, that server's settings), and E(NO_AUTH=1) with O(no_auth=true). vLLM
    images get C(--model <hf repo> --tt-device <device>), C(--no-auth) and C(--service-port) as container arguments.
  - The collection's own environment always wins. The names it sets itself (authentication such as E(NO_AUTH) and
    E(API_KEY), E(TT_CACHE_PATH), E(MODEL_WEIGHTS_DIR), E(HF_HOME), the spec path, ...) are left out of the spec's
    environment on the command line and of RV(runtime_model_spec), whose C(env_vars) the vLLM entrypoint sets over
    the container's; a runtime spec (O(spec)) that sets one, or a name that looks like a secret, is refused, naming
    the key (C(docs/model-packages.md), "The env gate").
  - vLLM specs whose version is older than v0.11.0 (RV(legacy_interface=true)) are refused, as C(run.py) does since
    v0.14.0. Their images use the older container interface (a gosu entrypoint that reads a runtime model spec JSON
    written by that release's C(run.py) through E(TT_MODEL_SPEC_JSON_PATH), and E(MODEL_WEIGHTS_PATH)); this module
    does not reproduce that JSON. The error names the model, the pinned image version and the way out. With O(image)
    set, the current interface is used with that image and, as C(run.py) does, the version is taken from the image
    tag, so a tag of v0.11.0 or newer is accepted (and names the host volume), while C(:latest) keeps the spec's.
  - With O(model_specs_env=dev) the spec comes from upstream's dev catalog and the command is the one of
    C(run.py --dev-mode --docker-server --override-docker-image O(image)) (v0.16.0 and later). Dev specs of v0.17.0 and
    later pin no image, so O(image) is required, as C(run.py) requires C(--override-docker-image). As C(run.py) does,
    the resolved spec goes into the container as a read-only JSON file, O(runtime_spec_file) on the host, named by
    E(RUNTIME_MODEL_SPEC_JSON_PATH) (the vLLM entrypoint reads it instead of the image's own prod catalog), and the
    checkout's sources are bind-mounted over the image's (C(reference_config), C(utils), C(tests), and
    C(vllm-tt-metal/src) or C(tt-media-server); C(benchmarking) and C(evals) instead of C(reference_config) before
    v0.19.0). The caller writes RV(runtime_model_spec) to O(runtime_spec_file).
  - Pure computation; it reads the specs and nothing else (with the dev catalog and the C++ media server, the entries
    of the checkout's C(tt-media-server) directory, which C(run.py) mounts one by one).
extends_documentation_fragment:
  - ttfleet.inference.spec_source
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  volume_root:
    description:
      - Absolute host directory that holds the volumes (C(run.py --host-volume)). The versioned volume
        C(<volume_root>/volume_id_<impl_id>-<model_name>-v<version>) is bind-mounted at the container's C(cache_root)
        and E(TT_CACHE_PATH) is set.
      - Without it, the Docker named volume C(volume_id_<impl_id>-<model_name>) is used and E(TT_CACHE_PATH) is not
        set, like C(run.py) without C(--host-volume).
    type: path
  port:
    description:
      - Host port to publish (C(run.py --service-port)). vLLM listens on it inside the container too and gets
        C(--service-port) when it is not V(8000); media and forge servers always listen on 8000 inside.
    type: int
    default: 8000
  bind_host:
    description: Host address the port is published on (C(run.py --bind-host)).
    type: str
    default: 0.0.0.0
  device_ids:
    description:
      - Indices of the Tenstorrent devices to pass, each as C(/dev/tenstorrent/<id>) (C(run.py --device-id)).
      - Empty passes all of C(/dev/tenstorrent).
    type: list
    elements: int
    default: []
  no_auth:
    description:
      - Disable API authorisation (C(run.py --no-auth)). vLLM gets C(--no-auth), media and forge get E(NO_AUTH=1).
    type: bool
    default: false
  image:
    description:
      - Docker image to run instead of the spec's (C(run.py --override-docker-image)). Its tag's version replaces the
        spec's version, for the legacy interface check and the host volume name.
    type: str
  image_user:
    description:
      - UID the image was built with (C(run.py --image-user)); any value other than V(1000) adds C(--user).
    type: str
    default: '1000'
  registry_mirrors:
    version_added: 0.2.0
    description:
      - Registry prefixes mapped to the site's mirror, for example the key C(ghcr.io/tenstorrent) with the value
        C(registry.site.example:5000/tenstorrent) (the serve role passes C(tt_registry_mirrors)). A prefix matches
        whole components of the image's name and the longest one wins; the command then runs the mapped reference,
        the rest of the reference (path below the prefix, tag) kept as written. It applies to whatever image the
        spec or O(image) names, so it survives upgrades. The argv is otherwise C(run.py)'s.
      - A prefix with a scheme (C(https://)) or without a registry host is refused.
    type: dict
  env_file:
    description:
      - Env file passed with C(--env-file), holding the secrets (E(HF_TOKEN), E(JWT_SECRET) or E(VLLM_API_KEY),
        E(API_KEY)). Only its path is used; it is not read.
      - Defaults to C(/etc/ttfleet/serve/<container name>.env).
    type: path
  name:
    description:
      - Container name. Characters Docker does not accept become C(-) (with a warning when that changes it).
      - Defaults to C(tt-<model_name>-<device>), with C(-<port>) appended when O(port) is not V(8000), in lower case.
    type: str
  host_weights_dir:
    description:
      - Host directory with pre-downloaded weights (C(run.py --host-weights-dir)), bind-mounted read-only at
        C(/home/container_app_user/readonly_weights_mount/<its basename>) and passed as E(MODEL_WEIGHTS_DIR).
    type: path
  runtime_spec_file:
    description:
      - Host path of the runtime spec JSON of a dev catalog spec (see O(model_specs_env)), bind-mounted read-only at
        C(/home/container_app_user/model_specs/<its basename>) and named by E(RUNTIME_MODEL_SPEC_JSON_PATH). The caller
        writes RV(runtime_model_spec) there. Only its path is used.
      - Required with O(model_specs_env=dev), and for a vLLM image when O(spec) is given or the tuning needs it (see
        O(vllm_override_args)); ignored otherwise.
    type: path
  vllm_override_args:
    version_added: 0.2.0
    description:
      - vLLM arguments to merge into the spec (C(run.py --vllm-override-args)), a mapping or its JSON text. As in
        C(ModelSpec.apply_overrides), a V(null) removes a key; V(max_num_seqs) and V(max_model_len) are mirrored into
        E(MAX_NUM_SEQS) and E(MAX_MODEL_LENGTH), which media and forge images read.
      - As from run.py v0.17.0, a vLLM container gets each key as an argument (C(--max-num-seqs 8); V(true) a bare
        flag, V(false) and V(null) none, a list or mapping its JSON). A removal or a V(false) cannot be said that way,
        so then the container also gets the resolved spec (O(runtime_spec_file)). So does an image of 0.11.x, whose
        entrypoint appends the spec's own arguments after the container's, where they would win.
      - A media or forge image reads only V(max_num_seqs) and V(max_model_len); any other key is refused, naming the
        model, the image version and the key.
      - Keys that the container wrapper takes itself (C(model), C(tt-device), C(device), C(engine), C(impl),
        C(no-auth), C(disable-trace-capture), C(service-port), C(port), C(host), in either C(_) or C(-) form) are
        refused, as are values that are not JSON; run.py only warns and drops them.
    type: raw
  override_tt_config:
    version_added: 0.2.0
    description:
      - TT configuration to merge into the spec's C(override_tt_config) (C(run.py --override-tt-config)), a mapping or
        its JSON text; a V(null) removes a key.
      - run.py v0.20.0 merges it only in its own process, so it never reaches a docker-server container. Here a vLLM
        container gets the resolved spec (O(runtime_spec_file)), which its entrypoint reads instead of the image's
        catalog, so the setting takes effect. The spec says it the way the image's release reads it, as
        C(vllm_args.override_tt_config) for images up to 0.14.x, C(plugin_config) with the key C(tt) for 0.15.x, and
        C(additional_config) with the key C(tt) from 0.16.0 (docs/model-packages.md, "What reaches vLLM").
      - Media and forge images read no TT config; it is refused for them.
    type: raw
  env:
    version_added: 0.2.0
    description:
      - Environment variables to add to the spec's C(env_vars), for settings such as C(TT_PD_CONNS). Not a run.py
        option. A vLLM container reads them from the resolved spec (O(runtime_spec_file)); media and forge containers
        get them with C(-e), as run.py passes the spec's environment to those.
    type: dict
  spec:
    version_added: 0.2.0
    description:
      - A spec from outside the catalog in run.py's runtime model spec format (C(run.py --runtime-model-spec-json),
        read by C(ModelSpec.from_json)), as a mapping or its JSON text. It holds the fields of tt-inference-server's
        C(ModelSpec); run.py's combined file (the keys C(runtime_model_spec) and C(runtime_config)) is taken too.
      - It is taken as is, with the defaults C(ModelSpec) fills in. O(model) must name its model and O(device) its
        device; a device tt-inference-server does not know (for example V(p150x2)) needs
        C(device_model_spec.env_vars.MESH_DEVICE).
      - A vLLM container gets it through O(runtime_spec_file), because run.py would start the container with
        C(--model), which the image's own catalog does not know.
    type: raw
  profile:
    version_added: 0.2.0
    description: Name of the serve profile the tuning comes from; recorded, and with O(kernel_cache=own) it names
      the kernel cache directory (C(<mesh>-<profile>)).
    type: str
  kernel_cache:
    version_added: 0.2.0
    description: With a O(profile), V(own) keeps its kernel cache apart from the spec's, V(shared) uses the spec's.
    type: str
    choices: [own, shared]
    default: own
notes:
  - O(model) and O(device) are required.
  - Multi-host devices (V(dual_galaxy), V(quad_galaxy)) are refused; C(run.py) starts several containers for them.
  - Specs of TTIS releases before v0.11 are refused, their C(run.py) used the older interface for every image.
  - Spec values that reach the command are checked first, and a spec that would change its meaning is refused with an
    error naming the spec file, the model, the device, the field and the value. A C(model_name), C(impl_id) or
    C(version) with C(,), C(=), C(:) or C(") (they would add C(--mount) or C(--volume) options), any value with a
    newline or another control character, an image or Hugging Face repository with whitespace or a leading C(-), and
    C(env_vars) that are not a mapping of variable names to single-line values are refused; so are O(volume_root) and
    O(host_weights_dir) with C(,), C(=) or C(").
seealso:
  - module: ttfleet.inference.model_spec
  - name: tt-inference-server
    description: The upstream project whose docker command this module reproduces.
    link: https://github.com/tenstorrent/tt-inference-server
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
---
- name: Compute the command that serves Qwen3-32B on a QuietBox 2 from the current release
  ttfleet.inference.container_command:
    model: Qwen3-32B
    device: p300x2
    volume_root: /home/tt/data/tt-cache
  register: __qb2_command
  # argv: docker run --rm --name tt-qwen3-32b-p300x2 --env-file /etc/ttfleet/serve/tt-qwen3-32b-p300x2.env
  #   --ipc host --security-opt no-new-privileges --device /dev/tenstorrent:/dev/tenstorrent ...
  #   --publish 0.0.0.0:8000:8000
  #   --mount type=bind,src=/home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-v0.17.0,dst=...
  #   -e TT_CACHE_PATH=... <image> --model Qwen/Qwen3-32B --tt-device p300x2

- name: Serve Whisper on the first board only, on port 7001 of the loopback interface
  ttfleet.inference.container_command:
    model: whisper-large-v3
    device: n300
    device_ids: [0]
    port: 7001
    bind_host: 127.0.0.1
    volume_root: /srv/tt
    spec_file: /opt/specs/release_model_spec-v0.20.0.json

- name: Run a spec that pins a pre-v0.11 vLLM image with a newer image of the same commits
  ttfleet.inference.container_command:
    model: Llama-3.1-8B-Instruct
    device: n150
    image: ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.19.0-b204341-9bd099c
    volume_root: /srv/tt
"""

RETURN = r"""
argv:
  description: The command, starting with V(docker) and V(run), to run as it is (no shell).
  returned: success
  type: list
  elements: str
  sample:
    - docker
    - run
    - --rm
    - --name
    - tt-llama-3.2-1b-instruct-n150
    - --env-file
    - /etc/ttfleet/serve/tt-llama-3.2-1b-instruct-n150.env
    - --ipc
    - host
    - --security-opt
    - no-new-privileges
    - --device
    - /dev/tenstorrent:/dev/tenstorrent
    - --mount
    - type=bind,src=/dev/hugepages-1G,dst=/dev/hugepages-1G
    - --publish
    - 0.0.0.0:8000:8000
    - --mount
    - >-
      type=bind,src=/srv/tt/volume_id_tt_transformers-Llama-3.2-1B-Instruct-v0.11.1,dst=/home/container_app_user/cache_root
    - -e
    - TT_CACHE_PATH=/home/container_app_user/cache_root/tt_metal_cache/cache_Llama-3.2-1B-Instruct/N150
    - ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.11.1-84b4c53-222ee06
    - --model
    - meta-llama/Llama-3.2-1B-Instruct
    - --tt-device
    - n150
image:
  description: Docker image the command runs (O(image) or the spec's), mapped by O(registry_mirrors).
  returned: success
  type: str
  sample: ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.11.1-84b4c53-222ee06
image_origin:
  description: The image O(image) or the spec names, before O(registry_mirrors).
  returned: success
  type: str
  sample: ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.11.1-84b4c53-222ee06
image_mirror:
  description: The O(registry_mirrors) prefix that mapped the image, or V(null).
  returned: success
  type: str
  sample: ghcr.io/tenstorrent
container_name:
  description: Name given with C(--name).
  returned: success
  type: str
  sample: tt-llama-3.2-1b-instruct-n150
env_file:
  description: Path given with C(--env-file).
  returned: success
  type: str
  sample: /etc/ttfleet/serve/tt-llama-3.2-1b-instruct-n150.env
version:
  description: Version of the spec, or of the O(image) tag when it has one; it names the host volume.
  returned: success
  type: str
  sample: 0.11.1
volume:
  description:
    - Host directory mounted at the container's C(cache_root), or the Docker named volume without O(volume_root).
  returned: success
  type: str
  sample: /srv/tt/volume_id_tt_transformers-Llama-3.2-1B-Instruct-v0.11.1
volume_exists:
  description:
    - Whether RV(volume) exists on the host (a link counts, even a dangling one, since an alias made by
      M(ttfleet.inference.volume_alias) is checked by its owner). V(null) for a Docker named volume (no O(volume_root)).
      ttfleet.inference.serve requires the volume before it starts the instance.
  returned: success
  type: bool
legacy_interface:
  description:
    - Whether the spec itself pins a vLLM image older than v0.11.0. Such specs only succeed with O(image), and the
      command then uses the current interface with that image.
  returned: success
  type: bool
  sample: false
inference_engine:
  description: Inference engine of the spec (V(vLLM), V(media) or V(forge)).
  returned: success
  type: str
  sample: vLLM
model_name:
  description: Short model name of the spec.
  returned: success
  type: str
  sample: Llama-3.2-1B-Instruct
hf_model_repo:
  description: Hugging Face repository id of the model, which the server lists in C(/v1/models).
  returned: success
  type: str
  sample: meta-llama/Llama-3.2-1B-Instruct
impl_id:
  description: Implementation id (underscore form, used in volume names).
  returned: success
  type: str
  sample: tt_transformers
impl_name:
  description: Implementation name (hyphen form, what C(run.py --impl) takes).
  returned: success
  type: str
  sample: tt-transformers
device:
  description: TTIS device name in lower case.
  returned: success
  type: str
  sample: n150
tensor_cache_timeout:
  description: Seconds TTIS allows for the first start with an empty tensor cache (the spec's C(tensor_cache_timeout)).
  returned: success
  type: float
  sample: 3600.0
tt_metal_cache_subdir:
  description: The kernel cache directory relative to the volume (C(tt_metal_cache/cache_<model_name>/<mesh>), with
    C(-<profile>) for a profile with its own kernel cache).
  returned: success
  type: str
  sample: tt_metal_cache/cache_Qwen3-32B/P300x2
profile:
  description: O(profile), or V(null).
  returned: success
  type: str
port:
  description: Published host port.
  returned: success
  type: int
  sample: 8000
release_version:
  description: TTIS release of the specs, V(null) when a spec file does not say.
  returned: success
  type: str
  sample: 0.20.0
runtime_model_spec_text:
  description:
    - RV(runtime_model_spec) as the text of the file, JSON with sorted keys and an indent of 4 and a final newline
      (what C(to_nice_json) makes of it, so a file written before is byte for byte the same). V(null) with it.
  returned: success
  type: str
  version_added: 0.3.0
runtime_model_spec:
  description:
    - With O(model_specs_env=dev), the document to write to O(runtime_spec_file) as JSON, with the key
      C(runtime_model_spec) holding the spec as C(run.py --dev-mode) writes it for the container. The spec has the
      O(image), its version and commits, and C(device_model_spec.vllm_args.port). V(null) with the prod catalog.
  returned: success
  type: dict
  sample:
    runtime_model_spec:
      model_id: id_tt-transformers_Qwen3-32B_p300x2
      model_name: Qwen3-32B
      version: 0.20.0
      device_type: P300X2
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import map_image
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.container import (
    DEFAULT_BIND_HOST,
    DEFAULT_IMAGE_USER,
    container_command,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import DEFAULT_PORT, sanitise_name
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.select import (
    entry_tuning,
    select_entry,
    validate_inputs,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.source import (
    SPEC_SOURCE_OPTIONS,
    default_checkout,
    load_params_catalog,
)

# The options that make a tt_models entry's spec (_ttis.select.select_entry).
ENTRY_KEYS = ("impl", "engine", "vllm_override_args", "override_tt_config", "env", "spec", "profile", "kernel_cache")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **SPEC_SOURCE_OPTIONS,
            "volume_root": {"type": "path"},
            "port": {"type": "int", "default": DEFAULT_PORT},
            "bind_host": {"type": "str", "default": DEFAULT_BIND_HOST},
            "device_ids": {"type": "list", "elements": "int", "default": []},
            "no_auth": {"type": "bool", "default": False},
            "image": {"type": "str"},
            "image_user": {"type": "str", "default": DEFAULT_IMAGE_USER},
            "registry_mirrors": {"type": "dict"},
            "env_file": {"type": "path"},
            "name": {"type": "str"},
            "host_weights_dir": {"type": "path"},
            "runtime_spec_file": {"type": "path"},
            "vllm_override_args": {"type": "raw"},
            "override_tt_config": {"type": "raw"},
            "env": {"type": "dict"},
            "spec": {"type": "raw"},
            "profile": {"type": "str"},
            "kernel_cache": {"type": "str", "choices": ["own", "shared"], "default": "own"},
        },
        mutually_exclusive=[("tt_inference_server_dir", "spec_file")],
        supports_check_mode=True,
    )
    params = module.params
    missing = [option for option in ("model", "device") if not params[option]]
    if missing:
        module.fail_json(msg=f"missing required arguments: {', '.join(missing)}")
    catalog = {}
    with fail_on(module):
        validate_inputs(model=params["model"], device=params["device"], impl=params["impl"], engine=params["engine"])
        if params["name"] and sanitise_name(params["name"]) != params["name"]:
            module.warn(
                f"name {params['name']!r} is not a valid container name; using {sanitise_name(params['name'])!r}."
            )
        catalog = load_params_catalog(params, default_checkout(params["tt_inference_server_dir"], params["spec_file"]))
        entry = {key: params[key] for key in ENTRY_KEYS}
        entry["name"] = params["model"]
        spec, spec_catalog = select_entry(catalog, entry, params["device"], image=False)
        result = container_command(
            spec,
            spec_catalog,
            volume_root=params["volume_root"],
            port=params["port"],
            bind_host=params["bind_host"],
            device_ids=params["device_ids"],
            no_auth=params["no_auth"],
            image=params["image"],
            image_user=params["image_user"],
            env_file=params["env_file"],
            name=params["name"],
            host_weights_dir=params["host_weights_dir"],
            runtime_spec_file=params["runtime_spec_file"],
            tuning=entry_tuning(entry),
            image_map=lambda image, what: map_image(image, params["registry_mirrors"], what),
        )
    for warning in catalog.get("warnings", []):
        module.warn(warning)
    volume = result.get("volume")
    result["volume_exists"] = os.path.lexists(volume) if params["volume_root"] and volume else None
    # The file's text as ansible's to_nice_json writes it (sorted keys, indent 4, ASCII): serializing the document
    # here costs the controller nothing, where templating it costs a copy of it in every task worker (issue 34).
    spec_doc = result.get("runtime_model_spec")
    result["runtime_model_spec_text"] = (
        json.dumps(spec_doc, indent=4, sort_keys=True, separators=(",", ": ")) + "\n" if spec_doc is not None else None
    )
    module.exit_json(changed=False, release_version=catalog.get("release_version"), **result)


if __name__ == "__main__":
    main()
