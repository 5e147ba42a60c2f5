# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""The secrets env file of a served instance (``/etc/ttfleet/serve/<instance>.env``), kept by serve_env.

Only what the container needs (serve.desired_env), owned by root with mode 0600, replaced atomically through the safe
file layer; an existing file that is a link, a special file or not UTF-8 text is an error and is left as it is: it may
hold a key that clients use. Secret values never leave this module: the result and the diff name the variables only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import write_atomic
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, untrusted_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.serve import (
    ServeError,
    desired_env,
    parse_env,
    render_env,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

HEADER = "Managed by ttfleet.inference (role serve): secrets of one instance, read by docker run --env-file."
# An env file holds a few keys; anything far larger is not one of ours.
ENV_FILE_LIMIT = 64 << 10


def describe(names: Iterable[str]) -> str:
    """The diff text of an env file: its variable names, every value hidden."""
    return "".join(f"{key}=<secret>\n" for key in sorted(names))


def _read_existing(dirfd: int, directory: str, name: str, path: str) -> tuple[str | None, os.stat_result | None]:
    """``(text, stat)`` of the env file, ``(None, None)`` when there is none."""
    try:
        raw = read_bytes(dirfd, name, ENV_FILE_LIMIT, where=directory)
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False) if raw is not None else None
    except SafeFileError as exc:
        raise ServeError(f"{exc}; move it away or remove it, then run again (it was left untouched).") from exc
    except OSError as exc:
        raise ServeError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), st
    except UnicodeDecodeError as exc:
        raise ServeError(
            f"{path} is not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start} cannot be decoded. "
            "Fix that line or remove the file (its API key is then generated anew); it was left untouched."
        ) from exc


def keep_env_file(
    path: str,
    engine: str,
    api_key: str | None = None,
    hf_token: str | None = None,
    no_auth: bool = False,
    check_mode: bool = False,
) -> dict[str, Any]:
    """Bring the env file at ``path`` to what the instance needs; the module's result (changed, variables,
    generated, diff). Raises ServeError, its message the module's ``msg``.

    Run as root on the hosts (the file is root's, its directory must be root's alone), as the running user elsewhere
    (tests). In check mode a missing directory is one the role creates earlier in the same run.
    """
    if not os.path.isabs(path):
        raise ServeError(f"path {path!r} must be absolute, for example /etc/ttfleet/serve/qwen3-32b.env.")
    directory, name = os.path.split(os.path.normpath(path))
    if not os.path.isdir(directory):
        if check_mode:
            return {"changed": True, "variables": [], "generated": not (api_key or no_auth), "diff": {}}
        raise ServeError(f"the directory {directory} of path does not exist; create it first.")
    owner = os.geteuid()
    try:
        with opened_dir(directory) as dirfd:
            problem = untrusted_dir(dirfd, directory, "so it cannot hold secrets")
            if problem:
                raise ServeError(problem)
            return _apply(dirfd, directory, name, path, owner, engine, api_key, hf_token, no_auth, check_mode)
    except SafeFileError as exc:
        raise ServeError(f"cannot open the directory of {path}: {exc}") from exc
    except OSError as exc:
        raise ServeError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _apply(
    dirfd: int,
    directory: str,
    name: str,
    path: str,
    owner: int,
    engine: str,
    api_key: str | None,
    hf_token: str | None,
    no_auth: bool,
    check_mode: bool,
) -> dict[str, Any]:
    text, stat = _read_existing(dirfd, directory, name, path)
    existing = parse_env(text or "")
    try:
        values, generated = desired_env(engine, existing, api_key=api_key, hf_token=hf_token, no_auth=no_auth)
        wanted = render_env(values, header=HEADER)
    except ServeError as exc:
        raise ServeError(f"{path}: {exc}") from exc
    content_changed = text != wanted
    perms_changed = stat is not None and (
        (stat.st_mode & 0o7777) != 0o600 or stat.st_uid != owner or (owner == 0 and stat.st_gid != 0)
    )
    changed = content_changed or perms_changed
    diff = {
        "before_header": path,
        "after_header": path,
        "before": "" if text is None else describe(existing) + ("(mode or owner to fix)\n" if perms_changed else ""),
        "after": describe(values),
    }
    if content_changed and text is not None and set(existing) == set(values):
        diff["after"] += "(values changed)\n"
    if changed and not check_mode:
        # A new file (random name, O_EXCL) renamed over the old one: the 0600 mode and the owner are set on its
        # descriptor before it gets the name, so the key is never readable by anyone else.
        write_atomic(dirfd, name, wanted.encode("utf-8"), mode=0o600, owner=(0, 0) if owner == 0 else None)
    return {"changed": changed, "variables": sorted(values), "generated": generated, "diff": diff}
