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

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_atomic
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, trusted
from ansible_collections.ttfleet.inference.plugins.module_utils._serve import (
    ServeError,
    desired_env,
    parse_env,
    render_env,
)

HEADER = "Managed by ttfleet.inference (role serve): secrets of one instance, read by docker run --env-file."
# An env file holds a few keys; anything far larger is not one of ours.
ENV_FILE_LIMIT = 64 << 10


def _describe(values: dict[str, str]) -> str:
    return "".join(f"{key}=<secret>\n" for key in sorted(values))


def _read_existing(  # type: ignore[return]  # fail_json exits, and ansible-core's AnsibleModule has no types to say so
    module: AnsibleModule, dirfd: int, directory: str, name: str, path: str
) -> tuple[str | None, os.stat_result | None]:
    """``(text, stat)`` of the env file, ``(None, None)`` when there is none. Anything that is not a small UTF-8
    regular file fails the task and is left as it is: it may hold a key that clients use."""
    try:
        raw = read_bytes(dirfd, name, ENV_FILE_LIMIT, where=directory)
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False) if raw is not None else None
    except SafeFileError as exc:
        module.fail_json(msg=f"{exc}; move it away or remove it, then run again (it was left untouched).")
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror or exc}")
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), st
    except UnicodeDecodeError as exc:
        module.fail_json(
            msg=f"{path} is not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start} cannot be decoded. "
            "Fix that line or remove the file (its API key is then generated anew); it was left untouched."
        )


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
    path = module.params["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"path {path!r} must be absolute, for example /etc/ttfleet/serve/qwen3-32b.env.")
    directory, name = os.path.split(os.path.normpath(path))
    if not os.path.isdir(directory):
        if module.check_mode:
            # The role creates the directory earlier in the same run; check mode only plans that.
            generated = not (module.params["api_key"] or module.params["no_auth"])
            module.exit_json(changed=True, variables=[], generated=generated, diff={})
        module.fail_json(msg=f"the directory {directory} of path does not exist; create it first.")
    # Root on the hosts; the running user elsewhere (tests).
    owner = os.geteuid()
    try:
        with opened_dir(directory) as dirfd:
            dir_stat = os.fstat(dirfd)
            if owner == 0 and not trusted(dir_stat):
                module.fail_json(
                    msg=f"{directory} (owner uid {dir_stat.st_uid}, mode {dir_stat.st_mode & 0o7777:04o}) can be "
                    "changed by a user other than root, so it cannot hold secrets: make it root's with mode 0755 "
                    f"(chown root: {directory}; chmod go-w {directory})."
                )
            _apply(module, dirfd, directory, name, path, owner)
    except SafeFileError as exc:
        module.fail_json(msg=f"cannot open the directory of {path}: {exc}")
    except OSError as exc:
        module.fail_json(msg=f"cannot write {path}: {exc.strerror or exc}")


def _apply(module: AnsibleModule, dirfd: int, directory: str, name: str, path: str, owner: int) -> None:
    text, stat = _read_existing(module, dirfd, directory, name, path)
    existing = parse_env(text or "")
    try:
        values, generated = desired_env(
            module.params["engine"],
            existing,
            api_key=module.params["api_key"],
            hf_token=module.params["hf_token"],
            no_auth=module.params["no_auth"],
        )
        wanted = render_env(values, header=HEADER)
    except ServeError as exc:
        module.fail_json(msg=f"{path}: {exc}")
    content_changed = text != wanted
    perms_changed = stat is not None and (
        (stat.st_mode & 0o7777) != 0o600 or stat.st_uid != owner or (owner == 0 and stat.st_gid != 0)
    )
    changed = content_changed or perms_changed
    diff = {
        "before_header": path,
        "after_header": path,
        "before": "" if text is None else _describe(existing) + ("(mode or owner to fix)\n" if perms_changed else ""),
        "after": _describe(values),
    }
    if content_changed and text is not None and set(existing) == set(values):
        diff["after"] += "(values changed)\n"
    if changed and not module.check_mode:
        # A new file (random name, O_EXCL) renamed over the old one: the 0600 mode and the owner are set on its
        # descriptor before it gets the name, so the key is never readable by anyone else.
        write_atomic(dirfd, name, wanted.encode("utf-8"), mode=0o600, owner=(0, 0) if owner == 0 else None)
    module.exit_json(changed=changed, variables=sorted(values), generated=generated, diff=diff)


if __name__ == "__main__":
    main()
