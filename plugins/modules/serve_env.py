#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: serve_env
short_description: Keep the secrets env file of a served tt-inference-server instance
version_added: 0.1.0
description:
  - Writes the C(docker run --env-file) file of one instance (C(/etc/ttfleet/serve/<instance>.env)), owned by root with
    mode C(0600), holding only what the container needs, and nothing else.
  - The API key goes into the variable the O(engine) reads (E(VLLM_API_KEY) for vLLM, E(API_KEY) for media and forge
    images). It is O(api_key) when given; otherwise the key already in the file is kept, and a missing key is
    generated on the host (256 bits from Python's C(secrets)) and kept from then on. Upstream's well-known default
    media key is refused and replaced. With O(no_auth=true) no key is written.
  - E(HF_TOKEN) is written only when O(hf_token) is given.
  - Secret values never appear in the result, the diff or the logs; the diff lists variable names only.
  - The file is replaced atomically (a new file with a random name in the same directory, then a rename), opened
    relative to its directory; that directory must be root's alone. An existing file that is a link, a special file or
    not UTF-8 text fails the task and is left as it is.
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The diff names the variables, their values are shown as V(<secret>).
  idempotent:
    support: full
options:
  path:
    description: Absolute path of the env file. Its directory must exist.
    type: path
    required: true
  engine:
    description: Inference engine of the instance (the C(inference_engine) of its spec).
    type: str
    required: true
    choices: [vLLM, media, forge]
  api_key:
    description: API key to set. Left out, the file's key is kept or a new one generated.
    type: str
  hf_token:
    description: Hugging Face token, for images that download gated weights at start.
    type: str
  no_auth:
    description: The instance runs without API authorisation (C(--no-auth), E(NO_AUTH=1)); no key is written.
    type: bool
    default: false
notes:
  - "A client sends the key as C(Authorization: Bearer <key>); root reads it from the env file."
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Keep the env file of the qwen3-32b instance, generating its API key once
  ttfleet.inference.serve_env:
    path: /etc/ttfleet/serve/qwen3-32b.env
    engine: vLLM
  no_log: true
"""

RETURN = r"""
variables:
  description: Names of the variables in the file.
  returned: success
  type: list
  elements: str
  sample: [VLLM_API_KEY]
generated:
  description: Whether a new API key was generated (or would be, in check mode).
  returned: success
  type: bool
  sample: false
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve_env import keep_env_file


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "engine": {"type": "str", "required": True, "choices": ["vLLM", "media", "forge"]},
            "api_key": {"type": "str", "no_log": True},
            "hf_token": {"type": "str", "no_log": True},
            "no_auth": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    with fail_on(module):
        result = keep_env_file(
            module.params["path"],
            module.params["engine"],
            api_key=module.params["api_key"],
            hf_token=module.params["hf_token"],
            no_auth=module.params["no_auth"],
            check_mode=module.check_mode,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
