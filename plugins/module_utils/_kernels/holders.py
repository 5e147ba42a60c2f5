# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The holders of a fan-out round as one read-only store: an archive that one holder fails to send is resumed
from the next, and the parts each sent are recorded (Span) to blame the right one."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import Body, HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    MANIFEST_NAME,
    SHA_NAME,
    KernelError,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import NoReturn, TypeVar

    from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import JSON, Key

    _T = TypeVar("_T")


# What makes a holder of a fan-out round fail over to the next one.
HOLDER_ERRORS = (KernelError, NetError, OSError)


class Span:
    """Bytes ``start`` to ``stop`` (exclusive) of an archive and the sha256 of what a stream held there: a holder's
    part of a spliced archive, or the same bytes of the archive read again whole."""

    def __init__(self, start: int, stop: int | None = None, holder: int = 0) -> None:
        self.start = start
        self.stop = stop
        self.holder = holder
        self.seen = 0
        self._digest = hashlib.sha256()

    @property
    def end(self) -> int:
        return self.start + self.seen

    def feed(self, offset: int, block: bytes) -> None:
        """Hash the part of ``block`` (found at byte ``offset`` of the archive) that falls in the span."""
        stop = offset + len(block) if self.stop is None else min(self.stop, offset + len(block))
        low = max(self.start, offset)
        if low < stop:
            self._digest.update(block[low - offset : stop - offset])
            self.seen += stop - low

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class HolderChain:
    """The holders of one fan-out round (HttpStore each) as one read-only store.

    The manifest and the sha256 come from the first holder that answers. With ``pinned`` (the archive's sha256 as
    the origin's manifest gives it, carried by the plan), a holder whose manifest or sha256 file names another
    archive is passed over, named, before a byte of its archive is read: a holder's own files prove nothing. When a
    holder fails while the archive streams (it stops, stalls, cuts the connection, answers an error), the next one
    is asked for the rest only, with ``Range`` from the byte where the last one stopped, once it names the same
    archive. The bytes are read as one stream, so the archive is still hashed and verified whole before anything is
    put in place; ``parts`` records which holder sent which bytes, so that a spliced archive that fails blames no
    one holder (deploy.deploy_from_any asks the last one again for the whole archive). A holder that lacks the
    entry or fails is passed over, with a line in ``failures``."""

    kind = "http"

    def __init__(
        self,
        stores: Sequence[HttpStore],
        failures: list[str],
        pinned: str | None = None,
        witness: Sequence[Span] = (),
    ) -> None:
        if not stores:
            raise KernelError("no holder to deploy from: store_url and store_fallback_urls are empty")
        self.stores = list(stores)
        self.index = 0
        self.failures = failures
        self.pinned = pinned
        # The sha256 of the archive being read, once fixed (pinned) or a holder named it, and the holders known to
        # name that archive.
        self.sha256: str | None = pinned
        self.same: set[int] = set()
        # The part each holder sent of the archive streaming, in order (Span.holder: the index in stores).
        self.parts: list[Span] = []
        # Spans of an earlier, spliced try to hash again in this one (see deploy.deploy_from_any).
        self.witness = list(witness)

    @property
    def exhausted(self) -> bool:
        return self.index >= len(self.stores)

    @property
    def spliced(self) -> bool:
        """The holder in use sent only the rest of an archive that another holder began."""
        return not self.exhausted and len(self.parts) > 1 and self.parts[-1].holder == self.index

    def describe(self, key: Key | None = None) -> str:
        return self.stores[min(self.index, len(self.stores) - 1)].describe(key)

    def describe_archive(self, key: Key) -> str:
        """Where the archive's bytes came from: one holder's archive, or the holders it was spliced from."""
        if len(self.parts) <= 1:
            return f"the archive {self.describe(key)}{ARCHIVE_NAME}"
        pieces = ", ".join(f"{self.stores[part.holder].describe()} (from byte {part.start})" for part in self.parts)
        return f"the archive spliced from {pieces}"

    def fail(self, why: object) -> None:
        """Record the holder in use as failed and pass to the next."""
        self.failures.append(f"{self.describe()}: {why}")
        self.index += 1

    def _each(self, what: Callable[[HttpStore], _T]) -> _T:
        while not self.exhausted:
            try:
                return what(self.stores[self.index])
            except HOLDER_ERRORS as exc:
                self.fail(exc)
        raise KernelError(f"every holder failed ({len(self.stores)} asked)")

    def _against_pin(self, sha: object, what: str) -> None:
        if self.pinned is not None and sha != self.pinned:
            raise KernelError(
                f"its {what} names the archive sha256 {printable(sha, 80)}, not {self.pinned}, the sha256 the "
                "plan fixed at the origin (expected_sha256); this holder holds another archive and is refused"
            )

    def _manifest_of(self, store: HttpStore, key: Key) -> JSON | None:
        manifest = store.read_manifest(key)
        if manifest is not None:
            self._against_pin(manifest.get("sha256"), MANIFEST_NAME)
        return manifest

    def _sha_of(self, store: HttpStore, key: Key) -> str:
        sha = store.read_sha(key)
        self._against_pin(sha, SHA_NAME)
        return sha

    def read_manifest(self, key: Key) -> JSON | None:
        while True:
            manifest = self._each(lambda store: self._manifest_of(store, key))
            if manifest is not None or self.index == len(self.stores) - 1:
                return manifest
            self.fail("holds no such entry")

    def read_sha(self, key: Key) -> str:
        self.sha256 = self._each(lambda store: self._sha_of(store, key))
        self.same.add(self.index)
        return self.sha256

    def open_archive(self, key: Key, size: int | None = None) -> _ResumingBody:
        if size is None:
            raise KernelError("a holder chain needs the archive's size (archive_bytes) to resume a transfer")
        self.parts = []
        return _ResumingBody(self, key, size)

    def siblings(self, key: Key) -> list[Key]:
        return []

    def writer(self, key: Key) -> NoReturn:
        raise KernelError(f"the holders of a fan-out round ({self.describe()} first) are read-only")


class _ResumingBody:
    """The archive from the holders of a HolderChain: a failed holder's part is resumed from the next one."""

    def __init__(self, chain: HolderChain, key: Key, size: int) -> None:
        self.chain = chain
        self.key = key
        self.size = size
        self.offset = 0
        self.body: Body | None = None

    def _next(self) -> Body:
        chain = self.chain
        while not chain.exhausted:
            store = chain.stores[chain.index]
            try:
                if chain.index not in chain.same:
                    # Never splice another archive's bytes: the holder must name the same sha256 first. This only
                    # spares a useless transfer; the bytes themselves are proven by the digest of the whole archive.
                    sha = chain._sha_of(store, self.key)
                    if sha != chain.sha256:
                        raise KernelError(f"holds another archive (sha256 {sha}, not {chain.sha256})")
                    chain.same.add(chain.index)
                body = store.open_archive(self.key, self.size, offset=self.offset)
            except HOLDER_ERRORS as exc:
                chain.fail(exc)
                continue
            chain.parts.append(Span(self.offset, holder=chain.index))
            return body
        raise KernelError(
            f"every holder failed ({len(chain.stores)} asked) after {self.offset} of {self.size} bytes of the archive"
        )

    def _failed(self, why: object) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None
        self.chain.fail(f"{why} (at byte {self.offset} of {self.size}; the rest was asked of the next holder)")

    def read(self, size: int = -1) -> bytes:
        while True:
            if self.body is None:
                self.body = self._next()
            try:
                block = self.body.read(size)
            except HOLDER_ERRORS as exc:
                self._failed(exc)
                continue
            if not block and self.offset < self.size:
                self._failed("the answer ended early")
                continue
            for span in (self.chain.parts[-1], *self.chain.witness):
                span.feed(self.offset, block)
            self.offset += len(block)
            return block

    def close(self) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None

    def __enter__(self) -> _ResumingBody:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
