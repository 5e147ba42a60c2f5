# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The registry API v2 client against a stand-in registry: auth challenges, manifests, blobs, uploads, verified
reads."""

from __future__ import annotations

import contextlib

import pytest
from images_helpers import CONFIG, LAYER, Reader, digest_of, manifest_of, registry

from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import MANIFEST_V2, ImageError
from ansible_collections.ttfleet.inference.plugins.module_utils._images.registry import Registry, VerifyingReader


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_resolve_gives_the_digest_and_the_compressed_size(auth):
    body = manifest_of()
    with registry(auth=auth, manifests={"1.0": body}) as (handler, address):
        client = Registry(address, ("fleet", "right"), plain_http=True)
        resolved = client.resolve("tt/x", "1.0")
    assert resolved["digest"] == digest_of(body)
    assert resolved["bytes"] == len(CONFIG) + len(LAYER)
    if auth == "bearer":
        assert handler.token_seen == ["Basic " + encode_auth("fleet", "right")]
        assert all(seen[2] in ("", "Bearer tok") for seen in handler.seen)


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_a_wrong_password_names_the_registry_and_the_image_not_the_secret(auth):
    with registry(auth=auth, manifests={"1.0": manifest_of()}) as (_handler, address):
        client = Registry(address, ("fleet", "s3cr3t-wrong"), plain_http=True)
        with pytest.raises(ImageError) as caught:
            client.resolve("tt/x", "1.0")
    message = str(caught.value)
    assert f"registry {address} refused access to {address}/tt/x" in message
    assert "'fleet'" in message and "tt_registry_credentials" in message
    assert "s3cr3t" not in message


def test_no_credentials_say_so():
    with (
        registry(manifests={"1.0": manifest_of()}) as (_handler, address),
        pytest.raises(ImageError, match="no credentials are set"),
    ):
        Registry(address, None, plain_http=True).resolve("tt/x", "1.0")


def test_a_token_service_of_another_origin_gets_no_password():
    with contextlib.ExitStack() as stack:
        token_handler, token_address = stack.enter_context(registry(auth="bearer"))
        realm = f"http://{token_address}/token"
        _handler, address = stack.enter_context(registry(auth="bearer", realm=realm, manifests={"1.0": manifest_of()}))
        with pytest.raises(ImageError, match="refused"):
            Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "1.0")
    assert token_handler.token_seen == [""]


def test_a_manifest_whose_digest_lies_is_refused():
    with (
        registry(manifests={"1.0": manifest_of()}, lie_digest=True) as (_handler, address),
        pytest.raises(ImageError, match="not the digest of the body"),
    ):
        Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "1.0")


def test_a_missing_image_is_named():
    with registry() as (_handler, address), pytest.raises(ImageError, match=r"has no image tt/x:9\.9"):
        Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "9.9")


def test_copy_through_upload_and_manifest_put():
    with registry() as (handler, address):
        client = Registry(address, ("fleet", "right"), plain_http=True)
        assert not client.has_blob("tt/x", digest_of(LAYER))
        client.upload_blob("tt/x", digest_of(LAYER), len(LAYER), Reader(LAYER))
        assert client.has_blob("tt/x", digest_of(LAYER))
        assert client.put_manifest("tt/x", "1.0", manifest_of(), MANIFEST_V2) == digest_of(manifest_of())
        assert handler.manifests["1.0"] == manifest_of()


def test_verifying_reader_refuses_other_bytes():
    good = VerifyingReader(Reader(LAYER), digest_of(LAYER), len(LAYER))
    assert b"".join(iter(lambda: good.read(1000), b"")) == LAYER
    bad = VerifyingReader(Reader(b"x" * len(LAYER)), digest_of(LAYER), len(LAYER))
    with pytest.raises(ImageError, match="refused"):
        while bad.read(1000):
            pass
    short = VerifyingReader(Reader(LAYER[:10]), digest_of(LAYER), len(LAYER))
    with pytest.raises(ImageError, match="ended after 10"):
        while short.read(1000):
            pass
