"""The anchor of a kernel pull from holders (issue 29): the pinned sha256, HolderChain's refusal of a holder that names
another archive, the parts of a spliced archive (Span) and the verdict on which holder's bytes were wrong."""

from __future__ import annotations

import hashlib
import io

import pytest
from unit_helpers import KEY

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import _splice_verdict, pinned_sha256
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.holders import HolderChain, Span
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError

PIN = hashlib.sha256(b"the origin's archive").hexdigest()
OTHER = hashlib.sha256(b"a holder's own archive").hexdigest()


@pytest.mark.parametrize("value", [None, PIN])
def test_a_pin_is_a_sha256_or_unset(value):
    assert pinned_sha256({"expected_sha256": value}) == value


@pytest.mark.parametrize("value", ["", PIN.upper(), PIN[:63], PIN + "0", f" {PIN}", 42, "g" * 64])
def test_anything_else_is_refused_naming_the_option_and_the_model(value):
    with pytest.raises(KernelError, match=r"expected_sha256 .* of the kernel cache of M is not a sha256"):
        pinned_sha256({"expected_sha256": value, "model_name": "M"})


def test_a_pin_with_control_characters_is_shown_printable():
    with pytest.raises(KernelError) as err:
        pinned_sha256({"expected_sha256": "\x1b]0;owned\x07", "model_name": "M"})
    assert "\x1b" not in str(err.value)


class Holder:
    """An in-memory holder with a manifest and a sha256 file (None: it holds no such entry) and an archive."""

    def __init__(self, name, sha=None, manifest_sha=None, data=b"", missing=False):
        self.name = name
        self.sha = sha
        self.manifest_sha = manifest_sha if manifest_sha is not None else sha
        self.data = data
        self.missing = missing
        self.asked = []

    def describe(self, key=None, name=""):
        return f"http://{self.name}/<base path>/"

    def read_manifest(self, key):
        self.asked.append("manifest")
        return None if self.missing else {"sha256": self.manifest_sha}

    def read_sha(self, key):
        self.asked.append("sha")
        return self.sha

    def open_archive(self, key, size=None, offset=0):
        self.asked.append(("archive", offset))
        return io.BytesIO(self.data[offset:])


def test_a_holder_whose_manifest_names_another_archive_is_refused_by_name_before_its_archive():
    failures = []
    liar, honest = Holder("liar", OTHER), Holder("honest", PIN)
    chain = HolderChain([liar, honest], failures, PIN)
    assert chain.read_manifest(KEY) == {"sha256": PIN}
    assert failures == [
        f"http://liar/<base path>/: its manifest.json names the archive sha256 {OTHER}, not {PIN}, the sha256 the "
        "plan fixed at the origin (expected_sha256); this holder holds another archive and is refused"
    ]
    assert liar.asked == ["manifest"]


def test_a_holder_whose_sha_file_alone_names_another_archive_is_refused_by_name():
    failures = []
    # Its manifest names the pinned archive, its sha256 file another: its files disagree, it is passed over.
    odd, honest = Holder("odd", OTHER, manifest_sha=PIN), Holder("honest", PIN)
    chain = HolderChain([odd, honest], failures, PIN)
    assert chain.read_sha(KEY) == PIN and chain.index == 1
    assert failures[0].startswith("http://odd/<base path>/: its kernels.tar.zst.sha256 names the archive sha256 ")
    assert f"{OTHER}, not {PIN}" in failures[0]


def test_unpinned_the_first_holder_names_the_archive_as_before():
    failures = []
    chain = HolderChain([Holder("a", OTHER)], failures)
    assert chain.read_manifest(KEY) == {"sha256": OTHER} and chain.read_sha(KEY) == OTHER and failures == []


def test_the_parts_of_a_spliced_archive_are_recorded_per_holder():
    data = bytes(range(256)) * 40
    failures = []
    first = Holder("a", PIN, data=data[:1000])  # ends early
    second = Holder("b", PIN, data=data)
    chain = HolderChain([first, second], failures, PIN)
    chain.read_sha(KEY)
    with chain.open_archive(KEY, len(data)) as body:
        got = b"".join(iter(lambda: body.read(300), b""))
    assert got == data and not chain.exhausted and chain.spliced
    assert second.asked[-1] == ("archive", 1000)
    assert [(p.holder, p.start, p.end) for p in chain.parts] == [(0, 0, 1000), (1, 1000, len(data))]
    assert chain.parts[0].hexdigest() == hashlib.sha256(data[:1000]).hexdigest()
    assert chain.parts[1].hexdigest() == hashlib.sha256(data[1000:]).hexdigest()
    assert chain.describe_archive(KEY) == (
        "the archive spliced from http://a/<base path>/ (from byte 0), http://b/<base path>/ (from byte 1000)"
    )
    assert failures and failures[0].startswith("http://a/<base path>/: the answer ended early (at byte 1000 of")


def test_an_archive_from_one_holder_is_not_spliced():
    data = b"x" * 5000
    chain = HolderChain([Holder("a", PIN, data=data)], [], PIN)
    with chain.open_archive(KEY, len(data)) as body:
        assert body.read(-1) == data
    assert not chain.spliced and chain.describe_archive(KEY) == "the archive http://a/<base path>/kernels.tar.zst"


@pytest.mark.parametrize("blocks", [[10], [3, 3, 4], [1] * 10, [7, 3]])
@pytest.mark.parametrize(("start", "stop"), [(0, 10), (2, 7), (4, None), (9, 10), (0, 0)])
def test_a_span_hashes_exactly_its_bytes_whatever_the_blocks(blocks, start, stop):
    data = b"0123456789"
    span = Span(start, stop)
    offset = 0
    for size in blocks:
        span.feed(offset, data[offset : offset + size])
        offset += size
    assert span.hexdigest() == hashlib.sha256(data[start:stop]).hexdigest()
    assert span.end == start + len(data[start:stop])


def test_the_verdict_names_only_the_holder_whose_part_differs():
    good = b"g" * 100
    bad = b"b" * 40
    parts, again = [Span(0, holder=0), Span(40, holder=1)], [Span(0, 40), Span(40, 100)]
    parts[0].feed(0, bad)
    parts[1].feed(40, good[40:])
    for span in again:
        span.feed(0, good)
    liar, honest = Holder("liar"), Holder("honest")
    verdict = _splice_verdict([(liar, parts[0], again[0]), (honest, parts[1], again[1])])
    assert len(verdict) == 1 and verdict[0].startswith("http://liar/<base path>/: bytes 0 to 40 it sent differ")
