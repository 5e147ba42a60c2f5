# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The s3 store: entries under ``s3://<bucket>/<prefix>/`` with the path store's layout, through
module_utils._net.s3.client, and its writer (packs into a spool on the host and uploads from there)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.atomic import TEMP_PREFIX
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import Body
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    MANIFEST_NAME,
    NO_VLLM,
    SHA_NAME,
    KernelError,
    entry_parts,
    key_mismatch,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.manifest import (
    SHA_MAX,
    json_bytes,
    json_object,
    parse_sha_file,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import TempArchive
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_JSON_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import show_origin

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key
    from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

    _T = TypeVar("_T")


class S3Store:
    """Entries under ``s3://<bucket>/<prefix>/`` with the path store's layout, through module_utils._net.s3.client.

    Archives are packed into ``spool`` on the host (a directory with room for one archive) and uploaded from
    there; the manifest is uploaded last and removed first when an entry is replaced.
    """

    kind = "s3"

    def __init__(self, client: S3Client, bucket: str, prefix: str | None = "", spool: str | None = None) -> None:
        if not bucket:
            raise KernelError("s3_bucket is required for the s3 store, for example kernel-caches")
        self.client = client
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        self.spool = spool

    def _object(self, key: Key, name: str = "") -> str:
        return "/".join(p for p in [self.prefix, *entry_parts(key), name] if p)

    def describe(self, key: Key | None = None) -> str:
        base = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        return f"s3://{self.bucket}/{self._object(key)}/" if key else base

    def _call(self, what: str, func: Callable[..., _T], *args: Any) -> _T:
        try:
            return func(*args)
        except S3Error as exc:
            raise KernelError(f"{what} failed: {exc}; check the s3 endpoint, bucket and credentials") from None

    def _read_small(self, key: Key, name: str, limit: int, missing_ok: bool = False) -> bytes | None:
        """The object ``name`` of the entry, refused past ``limit`` bytes; None when missing and ``missing_ok``."""
        obj = self._object(key, name)
        info = self._call(f"HEAD {self.describe(key)}{name}", self.client.head_object, self.bucket, obj)
        if info is None:
            if missing_ok:
                return None
            raise KernelError(f"{self.describe(key)}{name} is missing; remove the entry and harvest again")
        if info["size"] > limit:
            raise KernelError(
                f"{self.describe(key)}{name} is {info['size']} bytes, above the {limit}-byte cap of such a file; "
                "remove the entry and harvest again"
            )
        _status, _headers, raw = self._call(
            f"GET {self.describe(key)}{name}",
            lambda: self.client.request("GET", self.bucket, obj, limit=limit),
        )
        return raw

    def read_manifest(self, key: Key) -> JSON | None:
        raw = self._read_small(key, MANIFEST_NAME, MAX_JSON_BYTES, missing_ok=True)
        if raw is None:
            return None
        return json_object(raw, f"{self.describe(key)}{MANIFEST_NAME}", "remove the entry and harvest again")

    def read_sha(self, key: Key) -> str:
        # Never None: only missing_ok makes _read_small return None.
        raw = cast(bytes, self._read_small(key, SHA_NAME, SHA_MAX))
        return parse_sha_file(raw.decode("ascii", "replace"), f"{self.describe(key)}{SHA_NAME}")

    def open_archive(self, key: Key, size: int | None = None) -> Body:
        """The archive's body, of ``size`` bytes (what the manifest states) or refused before reading."""
        obj = self._object(key, ARCHIVE_NAME)
        resp, _start = self._call(
            f"GET {self.describe(key)}{ARCHIVE_NAME}", self.client.open_object, self.bucket, obj, 0, size
        )
        return Body(resp, resp.connection_to_close, resp.ttfleet_deadline, show_origin(self.client.endpoint))

    def siblings(self, key: Key) -> list[Key]:
        base = "/".join(p for p in [self.prefix, key["model_name"], key["mesh"], key["impl_id"]] if p) + "/"
        listing = self._call(f"listing {self.describe()}", lambda: list(self.client.list_objects(self.bucket, base)))
        found: list[Key] = []
        for item in listing:
            parts = item["key"][len(base) :].split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_NAME:
                found.append(
                    {**key, "tt_metal_commit": parts[0], "vllm_commit": None if parts[1] == NO_VLLM else parts[1]}
                )
        return [k for k in found if key_mismatch(k, key)]

    def writer(self, key: Key) -> _S3Writer:
        if not self.spool:
            raise KernelError("the s3 store needs a spool directory on the host to pack the archive in")
        return _S3Writer(self, key)


class _S3Writer(TempArchive):
    """Packs into the spool (by default ``<volume>/tt_metal_cache``, a directory the container UID can write) and
    uploads from the descriptor."""

    def __init__(self, store: S3Store, key: Key) -> None:
        hint = f"{key['model_name']}-{key['mesh']}.tar.zst"
        # store.spool is set: S3Store.writer refuses to make a writer without one.
        super().__init__(cast(str, store.spool), hint, f"{TEMP_PREFIX}{hint}.", dir_mode=0o700)
        self.store = store
        self.key = key

    def commit(self, sha256: str, manifest: JSON) -> None:
        store, key = self.store, self.key
        try:
            store._call(
                "DELETE of the old manifest",
                store.client.delete_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
            )
            store._call(
                f"upload to {store.describe(key)}",
                # From the descriptor that was packed and hashed: the container UID can swap names in the spool.
                store.client.upload_file,
                store.bucket,
                store._object(key, ARCHIVE_NAME),
                self.fd,
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, SHA_NAME),
                f"{sha256}  {ARCHIVE_NAME}\n".encode(),
            )
            store._call(
                f"upload to {store.describe(key)}",
                store.client.put_object,
                store.bucket,
                store._object(key, MANIFEST_NAME),
                json_bytes(manifest),
            )
        finally:
            self.abort()
