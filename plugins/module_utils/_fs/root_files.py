# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Root's directories and files at a given content and mode, in one pass (ttfleet.inference.root_files).

What ansible.builtin.file, copy and template do for a role's own files (units, a wrapper, configuration), for many paths
in one module call: a converged host answers in one round trip instead of two a file (issue 34). Every directory is
opened component by component without following a link a non-root user could plant (``_fs.dirs``); a file is read
without following a link and replaced through a random O_EXCL temporary file whose mode and owner are set on its
descriptor before the rename (``_fs.atomic``). An existing link, directory or special file where a file belongs is an
error and is left as it is. Run as root, a directory that holds a file must be root's and writable by root alone.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import unlink, write_atomic
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import make_path, open_dir, opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, untrusted_dir

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

# The files a role writes this way are small (a unit, a wrapper script, a JSON configuration).
FILE_LIMIT = 4 << 20
# A listed directory holds at most this many matching entries (a state directory holds one file an instance).
LIST_LIMIT = 10000
# A diff shows text up to this size; a larger or binary file is summarised.
DIFF_LIMIT = 64 << 10


class RootFilesError(FleetError):
    """A path that cannot be kept safely; the message names it and says what to do."""


def _mode(value: Any, path: str) -> int:
    text = str(value)
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise RootFilesError(f"mode {value!r} of {path} is not an octal mode such as '0644'.")
    return mode


def _absolute(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or os.path.normpath(path) != path:
        raise RootFilesError(f"path {path!r} must be an absolute, normalised path such as /etc/ttfleet/serve/x.conf.")
    if path == "/":
        raise RootFilesError("path / cannot be kept as a file or directory.")
    return path


def _owner(euid: int) -> tuple[int, int] | None:
    return (0, 0) if euid == 0 else None


def keep_directory(path: str, mode: int, check_mode: bool, euid: int) -> dict[str, Any]:
    """Create ``path`` (and missing parents, with ``mode``) or fix its mode and owner; ``{changed, before, after}``.

    A link at ``path`` is followed only where open_dir follows one (in a directory only root can change), as
    ansible.builtin.file follows it; a link a user could have planted is an error."""
    wanted = {"mode": f"{mode:04o}", "uid": euid, "gid": 0 if euid == 0 else None}
    try:
        fd = open_dir(path)
    except FileNotFoundError:
        if not check_mode:
            os.close(make_path(path, mode, _owner(euid)))
        return {"changed": True, "before": "absent", "after": wanted}
    except SafeFileError as exc:
        raise RootFilesError(f"{exc}: move it away and run again.") from exc
    try:
        st = os.fstat(fd)
        before = {"mode": f"{stat.S_IMODE(st.st_mode):04o}", "uid": st.st_uid, "gid": st.st_gid if euid == 0 else None}
        if before == wanted:
            return {"changed": False, "before": before, "after": wanted}
        if not check_mode:
            if euid == 0:
                os.fchown(fd, 0, 0)
            os.fchmod(fd, mode)
        return {"changed": True, "before": before, "after": wanted}
    finally:
        os.close(fd)


def list_entries(path: str, pattern: str, check_mode: bool) -> list[dict[str, Any]]:
    """``{path, isreg}`` of each entry of directory ``path`` whose name matches ``pattern`` (fnmatch; names starting
    with a dot are left out, as ansible.builtin.find leaves hidden files out), sorted by name. Read from a descriptor
    opened without following a link; nothing is followed or opened."""
    try:
        with opened_dir(path) as fd:
            names = sorted(
                name for name in os.listdir(fd) if not name.startswith(".") and fnmatch.fnmatch(name, pattern)
            )
            if len(names) > LIST_LIMIT:
                raise RootFilesError(f"{path} holds more than {LIST_LIMIT} entries matching {pattern}.")
            return [
                {"path": os.path.join(path, name),
                 "isreg": stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)}
                for name in names
            ]  # fmt: skip
    except FileNotFoundError:
        if check_mode:
            return []
        raise


def _text(data: bytes | None) -> str:
    if data is None:
        return ""
    if len(data) > DIFF_LIMIT:
        return f"({len(data)} bytes)\n"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return f"(binary, {len(data)} bytes)\n"


def keep_file(path: str, content: str | None, mode: int, check_mode: bool, euid: int) -> dict[str, Any]:
    """Bring ``path`` to ``content`` (None: absent) with ``mode``, root's; ``{changed, diff}``."""
    directory, name = os.path.split(path)
    data = None if content is None else content.encode("utf-8")
    try:
        with opened_dir(directory) as dirfd:
            problem = untrusted_dir(dirfd, directory, f"so {name} is not written there")
            if problem:
                raise RootFilesError(problem)
            current = read_bytes(dirfd, name, FILE_LIMIT, where=directory)
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False) if current is not None else None
            if data is None:
                changed = current is not None
                if changed and not check_mode:
                    unlink(dirfd, name)
            else:
                owner_wrong = st is not None and (
                    stat.S_IMODE(st.st_mode) != mode or (euid == 0 and (st.st_uid, st.st_gid) != (0, 0))
                )
                changed = current != data or owner_wrong
                if changed and not check_mode:
                    write_atomic(dirfd, name, data, mode=mode, owner=_owner(euid), where=directory)
    except FileNotFoundError:
        if check_mode:
            # A directory this run creates first (in the same call or an earlier task).
            return {"changed": data is not None, "diff": {"before": "", "after": _text(data)}}
        raise RootFilesError(f"the directory {directory} of {path} does not exist: create it first.") from None
    except SafeFileError as exc:
        raise RootFilesError(f"{exc}; move it away and run again (it was left untouched).") from exc
    return {"changed": changed, "diff": {"before": _text(current), "after": _text(data)}}


def keep(
    directories: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]], check_mode: bool = False
) -> dict[str, Any]:
    """Directories first (in order), then files (in order). ``{changed, directories, files, diff}`` with a result per
    path; raises RootFilesError, its message the module's ``msg``."""
    euid = os.geteuid()
    result: dict[str, Any] = {"changed": False, "directories": {}, "files": {}, "diff": []}
    for entry in directories:
        path = _absolute(entry.get("path"))
        kept = keep_directory(path, _mode(entry.get("mode") or "0755", path), check_mode, euid)
        result["directories"][path] = {"changed": kept["changed"]}
        if entry.get("list"):
            result["directories"][path]["entries"] = list_entries(path, str(entry["list"]), check_mode)
        if kept["changed"]:
            result["changed"] = True
            result["diff"].append({"before_header": path, "after_header": path,
                                   "before": f"{kept['before']}\n", "after": f"{kept['after']}\n"})  # fmt: skip
    for entry in files:
        path = _absolute(entry.get("path"))
        content = entry.get("content")
        if content is not None and not isinstance(content, str):
            raise RootFilesError(f"the content of {path} must be text, got {type(content).__name__}.")
        kept = keep_file(path, content, _mode(entry.get("mode") or "0644", path), check_mode, euid)
        result["files"][path] = {"changed": kept["changed"], "state": "absent" if content is None else "present"}
        if kept["changed"]:
            result["changed"] = True
            result["diff"].append(dict(kept["diff"], before_header=path, after_header=path))
    return result
