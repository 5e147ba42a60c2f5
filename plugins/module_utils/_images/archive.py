# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Image archives (docker save tarballs) on the host: root loads them into the engine, so where they lie is checked,
or they are pinned by a sha256."""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import O_DIR
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import open_path
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError, trusted
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    MANIFEST_LIMIT,
    ImageError,
    Reference,
    same_image,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import CHUNK
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable

if TYPE_CHECKING:
    from typing import Any


def _not_root_only(st: os.stat_result, path: str) -> str | None:
    """What lets a non-root user change ``path`` (the safe-file layer's rule for a trusted directory), or None."""
    if trusted(st):
        return None
    mode = st.st_mode & 0o7777
    if st.st_uid != 0:
        return f"{path} (owner uid {st.st_uid}, mode {mode:04o})"
    return f"{path} (owner root, mode {mode:04o}: its group or others can write it)"


def archive_writers(fd: int) -> list[str]:
    """The levels of the file open on ``fd`` that a non-root user could change: the file itself and every directory
    from ``/`` down to it (its real path: links were resolved when it was opened), each with its owner and mode.
    Empty when only root can change any of them, so no one else can swap or rewrite the archive."""
    st = os.fstat(fd)
    real = os.readlink(f"/proc/self/fd/{fd}")
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return [f"{real} (the file has no path any more)"]
    parts = [part for part in real.split("/") if part]
    found = []
    dirfd = os.open("/", O_DIR)
    try:
        walked = "/"
        for name in parts[:-1]:
            problem = _not_root_only(os.fstat(dirfd), walked)
            if problem:
                found.append(problem)
            try:
                nxt = os.open(name, O_DIR, dir_fd=dirfd)
            except OSError:
                return [*found, f"{os.path.join(walked, name)} (it changed while it was checked)"]
            os.close(dirfd)
            dirfd = nxt
            walked = os.path.join(walked, name)
        problem = _not_root_only(os.fstat(dirfd), walked)
        if problem:
            found.append(problem)
        try:
            here = os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False) if parts else None
        except OSError:
            here = None
        if here is None or (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
            return [*found, f"{real} (it changed while it was checked)"]
    finally:
        os.close(dirfd)
    problem = _not_root_only(st, real)
    return [*found, problem] if problem else found


def archive_images(handle: Any, archive: str) -> list[tuple[str, list[str]]]:
    """``(image ID, RepoTags)`` of each image in a ``docker save`` archive: its ``manifest.json``, each image ID the
    sha256 of the config the entry names (what the engine computes as the ID), never the name the archive gives it."""
    import tarfile

    what = f"the archive {archive}"
    handle.seek(0)
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:

            def member_bytes(name: object, limit: int) -> bytes:
                member = tar.getmember(str(name))
                if not member.isfile() or member.size > limit:
                    raise ImageError(f"{what}: {printable(name, 120)} is not a regular member of {limit} B or less")
                data = tar.extractfile(member)
                return data.read() if data is not None else b""

            manifest = json.loads(member_bytes("manifest.json", MANIFEST_LIMIT))
            if not isinstance(manifest, list):
                raise ImageError(f"{what}: its manifest.json is not a list")
            found = []
            for entry in manifest:
                config = entry.get("Config") if isinstance(entry, dict) else None
                tags = entry.get("RepoTags") if isinstance(entry, dict) else None
                image_id = "sha256:" + hashlib.sha256(member_bytes(config, MANIFEST_LIMIT)).hexdigest()
                found.append((image_id, [str(tag) for tag in tags or []]))
    except (tarfile.TarError, KeyError, ValueError, OSError) as exc:
        raise ImageError(f"{what} is not a docker save tarball ({type(exc).__name__}: {printable(exc, 200)})") from None
    finally:
        handle.seek(0)
    return found


def check_archive_pin(handle: Any, pin: str, ref: Reference, archive: str, option: str) -> str:
    """The image ID the engine must show for ``ref`` once ``archive`` is loaded, when ``pin`` is that image ID or the
    archive's own sha256; an ImageError naming the archive, both digests and the fix otherwise. Nothing reaches the
    engine before this passes; the module checks the ID again after the load."""
    images = archive_images(handle, archive)
    ours = [image_id for image_id, tags in images if any(same_image(tag, ref) for tag in tags)]
    expected = ours[0] if ours else None
    if expected == pin:
        others = sorted({tag for _id, tags in images for tag in tags if not same_image(tag, ref)})
        if len(images) != 1 or others:
            raise ImageError(
                f"the archive {archive} of {ref}, pinned by its image ID ({option}), also holds "
                f"{', '.join(others) or 'other images'}, which the pin does not cover: save {ref} alone "
                "(docker save IMAGE) or pin the whole archive by its sha256sum"
            )
        return expected
    digest = hashlib.sha256()
    while True:
        chunk = handle.read(CHUNK)
        if not chunk:
            break
        digest.update(chunk)
    handle.seek(0)
    actual = "sha256:" + digest.hexdigest()
    if actual == pin and expected is not None:
        return expected
    if actual == pin:
        raise ImageError(
            f"the archive {archive} matches its pin ({option}) but holds no {ref}: save it with docker save {ref}"
        )
    raise ImageError(
        f"the archive {archive} of {ref} is not the pinned one ({option} {pin}): its sha256 is {actual} and the image "
        f"ID of {ref} in it is {expected or 'absent'}. Someone may have replaced it; put the right archive back, or "
        "pin the one you trust (its image ID, or its sha256sum)"
    )


def open_archive(path: str, ref: Reference, pin: str | None) -> tuple[Any, int, str | None]:
    """(handle, size, image ID to expect or None) of a local archive that may be loaded: root's own, in a tree only
    root can write, or matching its pin. The handle is what gets loaded, so a later swap of the path changes nothing."""
    try:
        fd, st = open_path(path)
    except (OSError, SafeFileError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc.reason
        raise ImageError(
            f"{ref}: its archive {path} cannot be read ({reason}): copy the docker save tarball there or remove archive"
        ) from None
    handle = os.fdopen(fd, "rb")
    try:
        if pin is not None:
            return handle, st.st_size, check_archive_pin(handle, pin, ref, path, "archive_sha256")
        writers = archive_writers(fd)
        if writers:
            raise ImageError(
                f"{ref}: its archive {path} is refused: a non-root user can replace or rewrite it before root loads it "
                f"into the engine, through {'; '.join(writers)}. Move it into a directory only root can write "
                "(owned by root, chmod go-w on every level, the file root's too), or pin it with image_archive_sha256 "
                "(its image ID, the Id of docker image inspect IMAGE where it was saved, or its sha256sum)"
            )
        return handle, st.st_size, None
    except BaseException:
        handle.close()
        raise


class HashingReader:
    """A reader that hashes what passes through it (an S3 archive is pinned by what was streamed)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.hash = hashlib.sha256()

    def read(self, amount: int) -> bytes:
        data: bytes = self.handle.read(amount)
        self.hash.update(data)
        return data

    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()
