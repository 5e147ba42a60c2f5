# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Deploy: put a store's kernel cache archive in place, verified against its manifest and the sha256 fixed at
the origin, staged beside the cache and renamed; from the holders of a fan-out round, failing over between them."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.attrs import set_attrs
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_nearest, open_subdir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes, human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.trees import remove_tree
from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.archive import find_zstd, unpack
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.holders import HolderChain, Span
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    DIR_MODE,
    NO_VLLM,
    SHA_NAME,
    KernelError,
    check_key,
    key_text,
    refusing,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.local import (
    clear_leftovers,
    local_state,
    open_parent,
    write_marker,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import HEX64_RE, check_manifest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import moved_aside_name

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, TypeAlias

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key
    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.s3_store import S3Store

    Store: TypeAlias = "PathStore | HttpStore | S3Store | HolderChain"


def pinned_sha256(options: Mapping[str, Any]) -> str | None:
    """The archive's sha256 fixed at the origin (``expected_sha256``), None when not given; anything but 64 lowercase
    hex digits is refused, an empty value included: a plan that lost the origin's digest must not pull unanchored."""
    pinned = options.get("expected_sha256")
    if pinned is None:
        return None
    if not isinstance(pinned, str) or not HEX64_RE.match(pinned):
        raise KernelError(
            f"expected_sha256 {printable(pinned, 80)!r} of the kernel cache of {options.get('model_name')} is not "
            "a sha256 (64 lowercase hex digits); give the sha256 of the origin's manifest (the peer's pack result, "
            "manifest.sha256), or leave expected_sha256 unset"
        )
    return pinned


def _free_space(path: str) -> tuple[str, int]:
    """``(existing, bytes)``: free bytes on the filesystem of ``path`` or of its nearest existing directory."""
    fd, existing, _missing = open_nearest(path)
    try:
        return existing, free_bytes(fd)
    finally:
        os.close(fd)


def _make_staging(parent_fd: int, mesh: str, parent: str) -> tuple[str, int]:
    """``(name, fd)`` of a new root-only directory with a random name in ``parent_fd``: mkdir never reuses an
    existing name, so nothing a user planted becomes the staging directory."""
    for _attempt in range(16):
        name = f"{TEMP_PREFIX}{mesh}-{secrets.token_hex(8)}"
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            continue
        fd = open_subdir(parent_fd, name, parent)
        if os.fstat(fd).st_uid != os.geteuid():
            os.close(fd)
            raise KernelError(f"{parent}/{name} was replaced right after it was made; nothing was deployed. Run again")
        return name, fd
    raise KernelError(f"{parent}: no free name for a staging directory after 16 tries")


class _Tee:
    """A reader that writes what it reads to ``fd`` as well: the archive kept for this host's own store."""

    def __init__(self, source: Any, fd: int) -> None:
        self.source = source
        self.fd = fd

    def read(self, size: int = -1) -> bytes:
        block = self.source.read(size)
        view = memoryview(block)
        while view:
            view = view[os.write(self.fd, view) :]
        return block


class _Kept:
    """The entry of the deploying host's own path store (``keep_store_path``) being written beside the deploy."""

    def __init__(self, store: PathStore, key: Key) -> None:
        self.entry = store.describe(key)
        self.writer = store.writer(key)
        self.fd: int | None = self.writer.prepare()

    def commit(self, sha256: str, manifest: JSON) -> None:
        self.writer.commit(sha256, manifest)
        self.fd = None

    def abort(self) -> None:
        self.writer.abort()
        self.fd = None


def _keeper(options: Mapping[str, Any], key: Key, manifest: JSON, host: str) -> _Kept | None:
    """The writer of the copy this host keeps for its peers, or None when ``keep_store_path`` is not set."""
    root = options.get("keep_store_path")
    if not root:
        return None
    kept = _Kept(PathStore(root), key)
    try:
        space = kept.writer.free_bytes()
        if space < manifest["archive_bytes"]:
            raise KernelError(
                f"{host}: keep_store_path {root} has {human_bytes(space)} free, too little to keep the archive of "
                f"{human_bytes(manifest['archive_bytes'])} for the next hosts; free space there or leave "
                "keep_store_path unset"
            )
    except BaseException:
        kept.abort()
        raise
    return kept


@refusing
def deploy(options: Mapping[str, Any], store: Store, check_mode: bool = False, now: float | None = None) -> JSON:
    """Put the store's archive of the key in place at the volume's cache path, verified, staged, renamed."""
    key = check_key(options)
    host = options.get("host") or socket.gethostname()
    state = local_state(options)
    path, aside = state["path"], state["aside"]
    parent = os.path.dirname(path)
    result: JSON = {"changed": False, "action": "none", "cache_path": path, "store": store.describe(key), "key": key}
    if state["reason"]:
        result["reason"] = state["reason"]
        return result

    manifest = store.read_manifest(key)
    if manifest is None:
        others = store.siblings(key)
        if others:
            commits = ", ".join(sorted({f"{k['tt_metal_commit']}/{k.get('vllm_commit') or NO_VLLM}" for k in others}))
            reason = (
                f"the store {store.describe()} holds kernel caches of {key['model_name']} on {key['mesh']} "
                f"({key['impl_id']}) only for tt_metal_commit/vllm_commit {commits}, not for this spec's "
                f"tt_metal_commit {key['tt_metal_commit']} / vllm_commit {key.get('vllm_commit') or NO_VLLM}; kernel "
                "caches are never mixed across tt_metal_commits. Harvest one from a host warmed up with this spec"
            )
        else:
            reason = (
                f"the store {store.describe()} holds no kernel cache of {key_text(key)}; harvest one after a warm-up"
            )
        if options.get("required"):
            raise KernelError(f"{host}: {reason}")
        result.update(reason=reason, missing=True)
        return result
    check_manifest(manifest, key, f"the store entry {store.describe(key)}")
    pinned = pinned_sha256(options)
    if pinned is not None and manifest["sha256"] != pinned:
        raise KernelError(
            f"{host}: the store entry {store.describe(key)} names the archive sha256 {manifest['sha256']}, not "
            f"{pinned}, the sha256 fixed at the origin (expected_sha256); it holds another archive and is refused"
        )
    result.update(manifest=manifest, files=manifest["files"], bytes=manifest["bytes"])
    need = manifest["bytes"] + int(float(options.get("disk_margin_gb") or 0) * (1 << 30))
    measured, space = _free_space(parent)
    if space < need:
        raise KernelError(
            f"{host}: {measured} has {human_bytes(space)} free; the kernel cache of {key_text(key)} "
            f"needs {human_bytes(manifest['bytes'])} plus the margin of {options.get('disk_margin_gb') or 0} GiB. "
            "Free space on the volume filesystem"
        )
    result.update(changed=True, action="deployed")
    verb = "would deploy" if check_mode else "deployed"
    result["reason"] = (
        f"{verb} {manifest['files']} files ({human_bytes(manifest['bytes'])}) of {key_text(key)} from "
        f"{store.describe(key)}" + (", moving the cache in place aside first" if aside else "")
    )
    if check_mode:
        return result

    zstd = find_zstd(host)
    sha_file = store.read_sha(key)
    if sha_file != manifest["sha256"]:
        raise KernelError(
            f"the store entry {store.describe(key)} is inconsistent: {SHA_NAME} says {sha_file}, the manifest "
            f"{manifest['sha256']}; remove the entry and harvest again"
        )
    keep = _keeper(options, key, manifest, host)
    try:
        _deploy_verified(options, store, manifest, zstd, state, keep, result, now)
    finally:
        if keep is not None:
            keep.abort()
    return result


def _deploy_verified(
    options: Mapping[str, Any],
    store: Store,
    manifest: JSON,
    zstd: str,
    state: JSON,
    keep: _Kept | None,
    result: JSON,
    now: float | None,
) -> None:
    """Stream the archive into a staging directory beside the cache, check it against the manifest, rename it into
    place and write the marker (all into ``result``); with ``keep``, the archive is kept in this host's own store
    as well."""
    key = result["key"]
    owner = (options.get("owner", 1000), options.get("group", 1000))
    volume = os.path.normpath(options["volume"])
    parent = os.path.dirname(state["path"])
    mesh = key["mesh"]
    # Never None with create: a missing directory is made, a failure raises.
    parent_fd = cast(int, open_parent(volume, key, create=True, owner=owner))
    try:
        clear_leftovers(parent_fd, mesh)
        staging, staging_fd = _make_staging(parent_fd, mesh, parent)
        try:
            progress = Progress(manifest["archive_bytes"], options.get("status_file"))
            with store.open_archive(key, manifest["archive_bytes"]) as opened:
                source = opened if keep is None else _Tee(opened, cast(int, keep.fd))
                try:
                    got = unpack(
                        source, staging_fd, zstd, manifest["bytes"], owner, progress, expected=manifest["archive_bytes"]
                    )
                except KernelError as exc:
                    raise KernelError(f"{_archive_text(store, key)}: {exc}; nothing was put in place") from None
            progress.write(state="done")
            problems = []
            if got["sha256"] != manifest["sha256"]:
                problems.append(f"sha256 {got['sha256']} instead of {manifest['sha256']}")
            if got["archive_bytes"] != manifest["archive_bytes"]:
                problems.append(f"{got['archive_bytes']} archive bytes instead of {manifest['archive_bytes']}")
            if (got["files"], got["bytes"]) != (manifest["files"], manifest["bytes"]):
                problems.append(
                    f"{got['files']} files / {got['bytes']} bytes instead of {manifest['files']} / {manifest['bytes']}"
                )
            if problems:
                raise KernelError(
                    f"{_archive_text(store, key)} does not match its manifest ({'; '.join(problems)}); nothing was put "
                    f"in place. {_mismatch_fix(store)}"
                )
            if keep is not None:
                # Verified: this host now holds the entry too and can serve it (the fan-out's next holder).
                keep.commit(manifest["sha256"], manifest)
                result["kept"] = keep.entry
            set_attrs(staging_fd, DIR_MODE, owner)
            # The parent belongs to the container UID: its names may have been swapped while the archive streamed.
            named, ours = os.lstat(staging, dir_fd=parent_fd), os.fstat(staging_fd)
            if (named.st_dev, named.st_ino) != (ours.st_dev, ours.st_ino):
                raise KernelError(
                    f"{parent}/{staging} was replaced while the cache was unpacked into it; nothing was put in place. "
                    "Run again"
                )
            if state["aside"]:
                moved = moved_aside_name(mesh, now)
                os.rename(mesh, moved, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                result["moved_aside"] = os.path.join(parent, moved)
            elif state["kind"] == "empty":
                os.rmdir(mesh, dir_fd=parent_fd)
            os.rename(staging, mesh, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError, SafeFileError):
                remove_tree(parent_fd, staging)
            raise
        finally:
            os.close(staging_fd)
        write_marker(
            parent_fd,
            key,
            {
                "key": manifest["key"],
                "sha256": manifest["sha256"],
                "source": f"store {store.describe(key)}",
                "evidence": manifest.get("evidence"),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            },
            owner,
        )
    finally:
        os.close(parent_fd)
    result.update(sha256=got["sha256"], archive_bytes=got["archive_bytes"], hashed=True)


def _archive_text(store: Store, key: Key) -> str:
    if isinstance(store, HolderChain):
        return store.describe_archive(key)
    return f"the archive {os.path.join(store.describe(key), ARCHIVE_NAME)}"


def _mismatch_fix(store: Store) -> str:
    if isinstance(store, HolderChain):
        # No holder's entry is named for removal on the word of a spliced stream: deploy_from_any asks the last
        # holder for the whole archive and names the one whose bytes differed.
        return "Check the kernel spool of the holder that sent it and the network path to it"
    return "Remove the store entry and harvest again"


def deploy_from_any(options: Mapping[str, Any], stores: Sequence[HttpStore], check_mode: bool = False) -> JSON:
    """Deploy from the holders of a fan-out round (``stores``, in the order to ask them), as one HolderChain.

    With ``expected_sha256`` (fixed at the origin and carried by the plan), a holder whose manifest or sha256 file
    names another archive is refused, named, and the next one asked. A holder that fails (does not answer, stalls,
    stops mid-archive, lacks the entry) hands over to the next, which is asked only for the bytes still missing.

    When the archive fails its verification (or its unpacking) after such a splice, the wrong bytes may be those of
    a holder before: the holder that sent the rest is asked again for the whole archive from byte 0, in a fresh
    staging directory, before it is failed over. When that archive verifies, each part of the failed splice is
    compared (by sha256) with the same bytes of the verified archive, and the holder whose bytes differed is the
    one named. An archive that fails whole names the holder that sent it, and the deploy starts over from the
    holders not asked yet. The result names the failures in ``store_failures``; when every holder failed, the error
    names each."""
    pinned = pinned_sha256(options)
    failures: list[str] = []
    remaining = list(stores)
    asked_whole: set[int] = set()  # id() of the holders asked again from byte 0
    # The last failed splice: each part's holder, the part, and the same bytes of the archive read again.
    spliced: list[tuple[HttpStore, Span, Span]] = []
    while remaining:
        chain = HolderChain(remaining, failures, pinned, [again for _holder, _part, again in spliced])
        try:
            result = deploy(options, chain, check_mode=check_mode)
        except (KernelError, OSError) as exc:
            holder = None if chain.exhausted else chain.stores[chain.index]
            if holder is not None and chain.spliced and id(holder) not in asked_whole:
                asked_whole.add(id(holder))
                spliced = [(chain.stores[part.holder], part, Span(part.start, part.end)) for part in chain.parts]
                remaining = chain.stores[chain.index :]
                continue
            if holder is not None:
                chain.fail(exc)
            remaining = chain.stores[chain.index :]
            continue
        if spliced and result.get("hashed"):
            failures.extend(_splice_verdict(spliced))
        result["store"] = chain.describe(result["key"])
        result["store_failures"] = failures
        return result
    raise KernelError(
        f"{options.get('host') or socket.gethostname()}: every store failed for the kernel cache of "
        f"{options['model_name']} ({len(stores)} asked): " + " | ".join(failures)
    )


def _splice_verdict(spliced: Sequence[tuple[HttpStore, Span, Span]]) -> list[str]:
    """The holders of a failed splice whose part differs from the same bytes of the archive that then verified."""
    return [
        f"{holder.describe()}: bytes {part.start} to {part.end} it sent differ from the same bytes of the archive "
        "that verified, so the archive spliced with them failed; check that holder's kernel spool and the network "
        "path to it"
        for holder, part, again in spliced
        if part.hexdigest() != again.hexdigest()
    ]
