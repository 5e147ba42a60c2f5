# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Temporary (STS) S3 credentials: the session token is sent as ``x-amz-security-token`` and covered by the
SigV4 signature on every kind of request, never sent without one, never shown; the modules and the
model_cache role pass it wherever the S3 keys go.

SeaweedFS does not issue or check session tokens, so the requests go to a stand-in S3 service on 127.0.0.1
that checks every request the way S3 does. It recomputes the signature from the request as it arrived, with
its own SigV4 code (pinned to AWS's published test vectors below, not to the client's signer). It refuses
unsigned ``x-amz-*`` headers and payloads that do not match their hash. It refuses a missing, wrong or
expired token. It stores objects in memory (PUT, multipart, ranged GET, HEAD, ListObjectsV2, DELETE).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import http.server
import json
import os
import re
import threading
import urllib.parse
import uuid

import pytest
import yaml
from conftest import ROOT, patch_module_args
from http_servers import QuietHandler, serving
from unit_helpers import KEY, warm_cache

from ansible_collections.ttfleet.inference.plugins.doc_fragments import weights_source
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.options import S3_OPTIONS
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.sigv4 import sign_v4
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import MANIFEST_NAME
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.manifest import build_manifest, identity_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import WeightsError
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sources import S3Files, s3_prefix_of
from ansible_collections.ttfleet.inference.plugins.module_utils._weights.sync import sync_weights
from ansible_collections.ttfleet.inference.plugins.modules import kernel_cache as kernel_cache_module
from ansible_collections.ttfleet.inference.plugins.modules import model_weights as model_weights_module
from ansible_collections.ttfleet.inference.plugins.plugin_utils import progress_action

ROLE = os.path.join(ROOT, "roles", "model_cache")

# Temporary credentials are shaped like STS's (an ASIA key id, a base64 token with / + =), assembled at run
# time so that no credential-like string is committed.
ACCESS = "ASIA" + "TTFLEETTEST0001"
SECRET = "sts/secret+" + "value-0123456789abcdef"
TOKEN = "IQoJb3JpZ2luX2Vj" + "EttfleetTEST/session+token" + "0123456789abcdefABCDEF=="
LONG_ACCESS = "TTFLEET" + "LONGTERM01"
LONG_SECRET = "long/secret+" + "value-0123456789"
REGION = "eu-west-1"

# aws-sig-v4-test-suite, post-sts-token/post-sts-header-before: a POST to a generic service with the session
# token as a signed header. Example credentials published by AWS (not secrets), split for secret scanners.
SUITE_ACCESS = "AKID" + "EXAMPLE"
SUITE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEX" + "AMPLEKEY"
SUITE_TOKEN = (
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUu"
    "wthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcH"
    "NVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oL"
    "xBA=="
)
SUITE_SIGNATURE = "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"
SUITE_DATE = "20150830T123600Z"
EMPTY = hashlib.sha256(b"").hexdigest()


# ---------------------------------------------------------------------------
# The verifier's own SigV4 (no code of the client's)


def _aws_quote(text):
    return urllib.parse.quote(text, safe="-_.~")


def _canonical_query(raw_query):
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        name, _sep, value = part.partition("=")
        pairs.append((_aws_quote(urllib.parse.unquote(name)), _aws_quote(urllib.parse.unquote(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def expected_signature(method, target, header_pairs, signed, payload_hash, secret, region, amz_date, service="s3"):
    """The SigV4 signature of a request as it was received: ``target`` is the raw request target, ``header_pairs``
    the headers as (name, value) pairs, ``signed`` the names listed in SignedHeaders."""
    raw_path, _sep, raw_query = target.partition("?")
    values = {}
    for name, value in header_pairs:
        values.setdefault(name.lower(), []).append(value)
    canonical_headers = "".join(f"{name}:{' '.join(','.join(values.get(name, [])).split())}\n" for name in signed)
    canonical_request = "\n".join(
        [
            method,
            urllib.parse.quote(urllib.parse.unquote(raw_path), safe="/-_.~"),
            _canonical_query(raw_query),
            canonical_headers,
            ";".join(signed),
            payload_hash,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
    ).encode()
    key = ("AWS4" + secret).encode()
    for part in (amz_date[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign, hashlib.sha256).hexdigest()


def test_the_verifier_and_the_client_match_the_aws_sts_test_vector():
    headers = [("Host", "example.amazonaws.com"), ("X-Amz-Date", SUITE_DATE), ("X-Amz-Security-Token", SUITE_TOKEN)]
    signed = ["host", "x-amz-date", "x-amz-security-token"]
    assert (
        expected_signature("POST", "/", headers, signed, EMPTY, SUITE_SECRET, "us-east-1", SUITE_DATE, "service")
        == SUITE_SIGNATURE
    )
    auth = sign_v4(
        "POST",
        "/",
        None,
        {name.lower(): value for name, value in headers},
        EMPTY,
        SUITE_ACCESS,
        SUITE_SECRET,
        "us-east-1",
        SUITE_DATE,
        service="service",
    )
    assert auth == (
        f"AWS4-HMAC-SHA256 Credential={SUITE_ACCESS}/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date;x-amz-security-token, Signature={SUITE_SIGNATURE}"
    )


def test_the_verifier_matches_the_aws_s3_get_object_example():
    # The S3 API reference's GET Object example (ranged, long-term credentials).
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
    headers = [
        ("Host", "examplebucket.s3.amazonaws.com"),
        ("Range", "bytes=0-9"),
        ("x-amz-content-sha256", EMPTY),
        ("x-amz-date", "20130524T000000Z"),
    ]
    signed = ["host", "range", "x-amz-content-sha256", "x-amz-date"]
    assert (
        expected_signature("GET", "/test.txt", headers, signed, EMPTY, secret, "us-east-1", "20130524T000000Z")
        == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


# ---------------------------------------------------------------------------
# The stand-in S3 service

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/s3/aws4_request, "
    r"SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<sig>[0-9a-f]{64})$"
)


class VerifyingS3(http.server.ThreadingHTTPServer):
    """Checks every request as S3 does, then serves an in-memory bucket store. ``token`` is the session token the
    credentials belong to (None: long-term keys); ``expired`` answers ExpiredToken for a correct one."""

    daemon_threads = True

    def __init__(self, access, secret, token=None, region=REGION, expired=False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.access, self.secret, self.token, self.region, self.expired = access, secret, token, region, expired
        self.objects = {}
        self.uploads = {}
        self.seen = []
        self.lock = threading.Lock()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def check(self, method, target, header_pairs, body):
        """None when the request passes, else ``(status, code, message)``."""
        headers = {}
        for name, value in header_pairs:
            headers.setdefault(name.lower(), value)
        match = _AUTH_RE.match(headers.get("authorization", ""))
        if not match:
            return 403, "AccessDenied", "no SigV4 Authorization header"
        signed = match.group("signed").split(";")
        amz_date = headers.get("x-amz-date", "")
        if match.group("region") != self.region:
            return 400, "AuthorizationHeaderMalformed", f"the region is wrong; expecting '{self.region}'"
        if match.group("date") != amz_date[:8]:
            return 403, "SignatureDoesNotMatch", "credential date differs from x-amz-date"
        sent = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        if abs((datetime.datetime.now(datetime.timezone.utc) - sent).total_seconds()) > 900:
            return 403, "RequestTimeTooSkewed", "x-amz-date is off by more than 15 minutes"
        missing = {"host", "x-amz-date", "x-amz-content-sha256"} - set(signed)
        unsigned = sorted(name for name in headers if name.startswith("x-amz-") and name not in signed)
        if missing or unsigned:
            return 403, "AccessDenied", f"headers present but not signed: {sorted(missing) + unsigned}"
        payload = headers["x-amz-content-sha256"]
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            return 400, "XAmzContentSHA256Mismatch", "the payload does not match x-amz-content-sha256"
        if match.group("key") != self.access:
            return 403, "InvalidAccessKeyId", "unknown access key id"
        want = expected_signature(method, target, header_pairs, signed, payload, self.secret, self.region, amz_date)
        if not hmac.compare_digest(want, match.group("sig")):
            return 403, "SignatureDoesNotMatch", "the signature does not match"
        token = headers.get("x-amz-security-token")
        if self.token is None and token is not None:
            return 400, "InvalidToken", "The provided token is malformed or otherwise invalid."
        if self.token is not None and token is None:
            # What AWS answers for temporary keys sent without their token.
            return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
        if self.token is not None and not hmac.compare_digest(token, self.token):
            return 400, "InvalidToken", "The provided token is malformed or otherwise invalid."
        if self.expired:
            return 400, "ExpiredToken", "The provided token has expired."
        return None


class _Handler(QuietHandler):
    def _error(self, status, code, message):
        body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        extra = {"x-amz-bucket-region": self.server.region} if code == "AuthorizationHeaderMalformed" else {}
        self.answer(status, body, {"Content-Type": "application/xml", **extra})

    def _handle(self):
        server = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        pairs = list(self.headers.items())
        verdict = server.check(self.command, self.path, pairs, body)
        with server.lock:
            server.seen.append(
                {
                    "method": self.command,
                    "target": self.path,
                    "headers": {name.lower(): value for name, value in pairs},
                    "signed": (_AUTH_RE.match(self.headers.get("Authorization", "")) or {"signed": ""})["signed"],
                    "refused": verdict,
                }
            )
        if verdict:
            self._error(*verdict)
            return
        raw_path, _sep, raw_query = self.path.partition("?")
        query = dict(urllib.parse.parse_qsl(raw_query, keep_blank_values=True))
        bucket, _sep, key = urllib.parse.unquote(raw_path).lstrip("/").partition("/")
        with server.lock:
            self._route(server, bucket, key, query, body)

    def _route(self, server, bucket, key, query, body):
        objects = server.objects
        if self.command == "GET" and not key:
            self._list(objects, bucket, query)
        elif self.command == "PUT" and not key:
            self.answer(200)
        elif self.command == "PUT" and "uploadId" in query:
            server.uploads[query["uploadId"]][int(query["partNumber"])] = body
            self.answer(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})
        elif self.command == "PUT":
            objects[(bucket, key)] = body
            self.answer(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})
        elif self.command == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            server.uploads[upload] = {}
            answer = f"<InitiateMultipartUploadResult><UploadId>{upload}</UploadId></InitiateMultipartUploadResult>"
            self.answer(200, answer.encode())
        elif self.command == "POST" and "uploadId" in query:
            parts = server.uploads.pop(query["uploadId"])
            objects[(bucket, key)] = b"".join(parts[number] for number in sorted(parts))
            answer = f'<CompleteMultipartUploadResult><ETag>"x-{len(parts)}"</ETag></CompleteMultipartUploadResult>'
            self.answer(200, answer.encode())
        elif self.command == "DELETE":
            server.uploads.pop(query.get("uploadId"), None)
            objects.pop((bucket, key), None)
            self.answer(204)
        elif (bucket, key) not in objects:
            self._error(404, "NoSuchKey", "The specified key does not exist.")
        elif self.command == "HEAD":
            data = objects[(bucket, key)]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
            self.end_headers()
        else:
            data = objects[(bucket, key)]
            start = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if start and int(start.group(1)) < len(data):
                first = int(start.group(1))
                self.answer(206, data[first:], {"Content-Range": f"bytes {first}-{len(data) - 1}/{len(data)}"})
            else:
                self.answer(200, data)

    def _list(self, objects, bucket, query):
        prefix, size = query.get("prefix", ""), int(query.get("max-keys", "1000"))
        keys = sorted(key for (b, key) in objects if b == bucket and key.startswith(prefix))
        after = query.get("continuation-token")
        if after:
            keys = [key for key in keys if key > after]
        page, more = keys[:size], len(keys) > size
        items = "".join(
            f"<Contents><Key>{key}</Key><Size>{len(objects[(bucket, key)])}</Size></Contents>" for key in page
        )
        token = f"<NextContinuationToken>{page[-1]}</NextContinuationToken>" if more else ""
        truncated = "true" if more else "false"
        body = f"<ListBucketResult><IsTruncated>{truncated}</IsTruncated>{token}{items}</ListBucketResult>"
        self.answer(200, body.encode(), {"Content-Type": "application/xml"})

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@pytest.fixture
def serve():
    with contextlib.ExitStack() as started:
        yield lambda **kwargs: started.enter_context(serving(VerifyingS3(**kwargs)))


# ---------------------------------------------------------------------------
# The client


def _every_call(client, tmp_path):
    """One of each request the collection makes: PUT (bytes and a streamed file), multipart, HEAD, GET (whole and
    resumed), ListObjectsV2 across pages, DELETE."""
    client.put_object("models", "a/config.json", b'{"a": 1}\n')
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(70000))
    client.put_object("models", "a/small.bin", str(small))
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom((5 << 20) + 1234))
    client.upload_file("models", "a/big.bin", str(big), part_size=5 << 20)
    assert client.head_object("models", "a/big.bin")["size"] == big.stat().st_size
    out = tmp_path / "out.bin"
    out.write_bytes(big.read_bytes()[:4096])
    got = client.get_object("models", "a/big.bin", str(out), offset=4096)
    assert got["start"] == 4096 and out.read_bytes() == big.read_bytes()
    assert [o["key"] for o in client.list_objects("models", "a/", page_size=2)] == [
        "a/big.bin",
        "a/config.json",
        "a/small.bin",
    ]
    client.delete_object("models", "a/config.json")
    assert client.head_object("models", "a/config.json") is None


def test_the_token_is_sent_and_signed_on_every_request(serve, tmp_path):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    _every_call(S3Client(server.endpoint, ACCESS, SECRET, region=REGION, session_token=TOKEN), tmp_path)
    kinds = {(seen["method"], "uploadId" in seen["target"] or "uploads" in seen["target"]) for seen in server.seen}
    assert kinds >= {("PUT", False), ("PUT", True), ("POST", True), ("HEAD", False), ("GET", False)}
    assert ("DELETE", False) in kinds
    for seen in server.seen:
        assert seen["refused"] is None, seen
        assert seen["headers"]["x-amz-security-token"] == TOKEN
        assert "x-amz-security-token" in seen["signed"].split(";")


def test_without_a_token_no_token_header_is_sent(serve, tmp_path):
    server = serve(access=LONG_ACCESS, secret=LONG_SECRET)
    _every_call(S3Client(server.endpoint, LONG_ACCESS, LONG_SECRET, region=REGION, session_token=""), tmp_path)
    assert len(server.seen) > 10
    for seen in server.seen:
        assert seen["refused"] is None, seen
        assert "x-amz-security-token" not in seen["headers"]
        assert "x-amz-security-token" not in seen["signed"]


def test_a_token_left_out_of_the_signature_is_refused(serve, monkeypatch):
    """The verifier's own check: a client that adds the token after signing fails, so the tests above would too."""
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    client = S3Client(server.endpoint, ACCESS, SECRET, region=REGION)
    signed_headers = client._signed_headers

    def token_after_signing(*args):
        return dict(signed_headers(*args), **{"X-Amz-Security-Token": TOKEN})

    monkeypatch.setattr(client, "_signed_headers", token_after_signing)
    with pytest.raises(S3Error) as err:
        list(client.list_objects("models"))
    assert err.value.status == 403 and server.seen[-1]["refused"][1] == "AccessDenied"
    assert TOKEN not in str(err.value)


def test_temporary_keys_without_their_token_say_so(serve):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    with pytest.raises(S3Error) as err:
        list(S3Client(server.endpoint, ACCESS, SECRET, region=REGION).list_objects("models"))
    assert err.value.code == "InvalidAccessKeyId"
    assert "temporary (STS) keys, whose id starts with ASIA, also need their session token" in str(err.value)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    ("server_token", "expired", "client_token", "code"),
    [
        (TOKEN, True, TOKEN, "ExpiredToken"),
        (TOKEN, False, TOKEN[::-1], "InvalidToken"),
        (None, False, TOKEN, "InvalidToken"),
    ],
)
def test_a_bad_token_asks_for_new_credentials_and_is_never_shown(serve, server_token, expired, client_token, code):
    server = serve(access=ACCESS, secret=SECRET, token=server_token, expired=expired)
    client = S3Client(server.endpoint, ACCESS, SECRET, region=REGION, session_token=client_token)
    with pytest.raises(S3Error) as err:
        client.head_object("models", "k")
    assert err.value.code is None  # a HEAD answer has no body
    with pytest.raises(S3Error) as err:
        list(client.list_objects("models"))
    assert err.value.code == code
    assert "get new temporary credentials" in str(err.value)
    for value in (TOKEN, TOKEN[::-1], SECRET):
        assert value not in str(err.value) and value not in repr(client)


@pytest.mark.parametrize("bad", [TOKEN + "\n", " " + TOKEN, TOKEN[:20] + "\r\nX-Evil: 1"])
def test_a_token_with_whitespace_is_refused_without_showing_it(bad):
    with pytest.raises(S3Error) as err:
        S3Client("http://127.0.0.1:9", ACCESS, SECRET, session_token=bad)
    assert "session token holds spaces, line breaks or control characters" in str(err.value)
    assert TOKEN[:20] not in str(err.value)


def test_an_access_key_ending_in_a_newline_is_refused():
    with pytest.raises(S3Error, match="access key holds spaces or control characters"):
        S3Client("http://127.0.0.1:9", ACCESS + "\n", SECRET, session_token=TOKEN)


def test_a_wrong_region_names_the_bucket_region(serve):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    with pytest.raises(S3Error) as err:
        list(S3Client(server.endpoint, ACCESS, SECRET, session_token=TOKEN).list_objects("models"))
    assert err.value.code == "AuthorizationHeaderMalformed"
    assert f"the bucket is in region {REGION}: set s3_region to it" in str(err.value)


# ---------------------------------------------------------------------------
# The modules

REPO = "ttfleet-lab/Tiny-STS"
REV = "0123456789abcdef0123456789abcdef01234567"


def _publish_model(server):
    contents = {"config.json": b'{"model_type": "llama"}\n', "model.safetensors": os.urandom(300000)}
    files = [{"path": rel, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in contents.items()]
    manifest = build_manifest(identity_of("hf", REPO, REV), files, source="hf")
    base = s3_prefix_of("fleet", REPO, REV)
    client = S3Client(server.endpoint, ACCESS, SECRET, region=REGION, session_token=TOKEN)
    for rel, data in contents.items():
        client.put_object("models", base + rel, data)
    client.put_object("models", base + MANIFEST_NAME, json.dumps(manifest).encode())
    server.seen.clear()
    return contents


def _run(module, args, capsys):
    """``(exit code, everything printed, result)``. Warnings are in the result, or on stderr when this process also
    loaded controller code (Ansible then shows a module's warnings through its display at once)."""
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        module.main()
    printed = capsys.readouterr()
    return exc.value.code, printed.out + printed.err, json.loads(printed.out)


def _s3_args(server, **extra):
    args = {
        "s3_endpoint": server.endpoint,
        "s3_region": REGION,
        "s3_access_key": ACCESS,
        "s3_secret_key": SECRET,
        "s3_session_token": TOKEN,
    }
    args.update(extra)
    return {name: value for name, value in args.items() if value is not None}


def test_model_weights_fetches_with_the_token_and_never_returns_it(serve, tmp_path, capsys):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    contents = _publish_model(server)
    dest = tmp_path / "vol" / "weights" / "Tiny-STS"
    status = tmp_path / "progress.json"
    args = _s3_args(
        server,
        dest=str(dest),
        source="s3",
        repo_id=REPO,
        revision=REV,
        s3_bucket="models",
        s3_prefix="fleet",
        owner=os.getuid(),
        group=os.getgid(),
        disk_margin_gb=0,
        status_file=str(status),
        _ansible_diff=True,
    )
    code, out, result = _run(model_weights_module, args, capsys)
    assert code == 0, result
    assert result["changed"] and result["fetched_bytes"] == sum(len(d) for d in contents.values())
    assert all((dest / rel).read_bytes() == data for rel, data in contents.items())
    # The option is no_log: Ansible masks it in the invocation it returns.
    assert result["invocation"]["module_args"]["s3_session_token"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    # Everything the run leaves for an operator to read: result, diff, warnings, manifest, progress.
    progress = json.loads(status.read_text())
    line = progress_action.progress_line("lab", progress, 12.0, show_file=True)
    assert "model_weights" in line and progress["done_bytes"] == result["fetched_bytes"]
    for text in (out, (dest / MANIFEST_NAME).read_text(), status.read_text(), line):
        assert TOKEN not in text and SECRET not in text
    assert server.seen and all(seen["headers"].get("x-amz-security-token") == TOKEN for seen in server.seen)
    assert all(seen["refused"] is None for seen in server.seen)


def test_model_weights_failure_names_the_fix_without_the_token(serve, tmp_path, capsys):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN, expired=True)
    args = _s3_args(
        server,
        dest=str(tmp_path / "vol" / "weights" / "Tiny-STS"),
        source="s3",
        repo_id=REPO,
        revision=REV,
        s3_bucket="models",
        owner=os.getuid(),
        group=os.getgid(),
    )
    code, out, result = _run(model_weights_module, args, capsys)
    assert code == 1
    assert "ExpiredToken" in result["msg"] and "get new temporary credentials" in result["msg"]
    assert TOKEN not in out and SECRET not in out


def test_sync_weights_scrubs_the_token_from_its_own_errors(serve, tmp_path, monkeypatch):
    """_weights scrubs every secret it was given, the token too, from errors raised below it."""
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)

    def leaky_list(self, *args, **kwargs):
        raise WeightsError(f"the store answered for token {TOKEN} and key {SECRET}")

    monkeypatch.setattr(S3Files, "list", leaky_list)
    options = _s3_args(
        server, dest=str(tmp_path / "w" / "M"), source="s3", repo_id=REPO, revision=REV, s3_bucket="models"
    )
    with pytest.raises(WeightsError) as err:
        sync_weights(options)
    assert TOKEN not in str(err.value) and SECRET not in str(err.value)
    assert "token ******** and key ********" in str(err.value)


def _kernel_args(volume, **extra):
    args = dict(KEY, volume=str(volume), host="lab", store="s3", s3_bucket="kernels", s3_prefix="caches")
    args.update(owner=os.getuid(), group=os.getgid(), quiet_seconds=60)
    args.update(extra)
    return args


def test_kernel_cache_harvests_and_deploys_with_the_token(serve, tmp_path, capsys):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    files = warm_cache(str(tmp_path / "a"))[1]
    status = tmp_path / "harvest.json"
    args = _kernel_args(tmp_path / "a", state="harvested", warmed=True, status_file=str(status), **_s3_args(server))
    code, out, result = _run(kernel_cache_module, args, capsys)
    assert code == 0 and result["action"] == "harvested", result
    assert TOKEN not in out and TOKEN not in status.read_text()
    assert result["invocation"]["module_args"]["s3_session_token"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"

    code, out, result = _run(kernel_cache_module, _kernel_args(tmp_path / "b", **_s3_args(server)), capsys)
    assert code == 0 and result["action"] == "deployed", result
    cache = tmp_path / "b" / "tt_metal_cache" / f"cache_{KEY['model_name']}" / KEY["mesh"]
    assert all((cache / rel).read_bytes() == data for rel, data in files.items())
    assert TOKEN not in out

    # An absent entry is a warning (required is false): the warning and result hold no token either.
    code, out, result = _run(
        kernel_cache_module, _kernel_args(tmp_path / "c", tt_metal_commit="9d11e2f", **_s3_args(server)), capsys
    )
    assert code == 0 and result["action"] == "none" and result["missing"]
    assert "kernel caches are never mixed across tt_metal_commits" in json.dumps(result.get("warnings")) + out
    assert TOKEN not in out and SECRET not in out
    assert server.seen and all(seen["headers"].get("x-amz-security-token") == TOKEN for seen in server.seen)
    assert all(seen["refused"] is None for seen in server.seen)


def test_kernel_cache_failure_hides_the_token(serve, tmp_path, capsys):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN, expired=True)
    code, out, result = _run(kernel_cache_module, _kernel_args(tmp_path / "b", **_s3_args(server)), capsys)
    # The first request is a HEAD, whose answer has no body to name the error: the hint still names the token.
    assert code == 1 and "session token" in result["msg"] and "has not expired" in result["msg"]
    assert TOKEN not in out and SECRET not in out


def test_the_token_comes_from_the_environment_like_the_keys(serve, tmp_path, capsys, monkeypatch):
    server = serve(access=ACCESS, secret=SECRET, token=TOKEN)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    args = _kernel_args(tmp_path / "b", s3_endpoint=server.endpoint, s3_region=REGION)
    code, out, result = _run(kernel_cache_module, args, capsys)
    assert code == 0 and result["action"] == "none", result
    assert TOKEN not in out
    assert server.seen and all(seen["headers"].get("x-amz-security-token") == TOKEN for seen in server.seen)

    monkeypatch.delenv("AWS_SESSION_TOKEN")
    long_term = serve(access=ACCESS, secret=SECRET)
    code, out, result = _run(kernel_cache_module, dict(args, s3_endpoint=long_term.endpoint), capsys)
    assert code == 0, result
    assert long_term.seen and all("x-amz-security-token" not in seen["headers"] for seen in long_term.seen)


def test_the_option_mirrors_the_keys():
    token, secret = S3_OPTIONS["s3_session_token"], S3_OPTIONS["s3_secret_key"]
    assert token["no_log"] is True and secret["no_log"] is True
    assert token["fallback"][0] is secret["fallback"][0] and token["fallback"][1] == ["AWS_SESSION_TOKEN"]
    for module in (model_weights_module, kernel_cache_module):
        doc = yaml.safe_load(module.DOCUMENTATION)
        options = dict(doc["options"])
        # model_weights documents its source options in the doc fragment it shares with model_cache_plan.
        if "ttfleet.inference.weights_source" in doc.get("extends_documentation_fragment", []):
            options.update(yaml.safe_load(weights_source.ModuleDocFragment.DOCUMENTATION)["options"])
        doc = options
        assert "s3_session_token" in doc and "AWS_SESSION_TOKEN" in " ".join(doc["s3_session_token"]["description"])


# ---------------------------------------------------------------------------
# The model_cache role


def _load(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _walk(node, found):
    """Every mapping in the task files that passes s3_secret_key, with the task (or block) that holds it."""
    if isinstance(node, list):
        for item in node:
            _walk(item, found)
    elif isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and "s3_secret_key" in value:
                found.append((node, key, value))
            _walk(value, found)
    return found


def _render(expression, variables):
    """The value Ansible gives a task argument, or OMITTED."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    try:
        from ansible.template import trust_as_template
    except ImportError:  # ansible-core before 2.19 templates every string
        trust_as_template = None
    variables = dict(variables)
    if trust_as_template is None:
        variables["omit"] = "__omitted__"
    else:
        expression = trust_as_template(expression)
    try:
        value = Templar(loader=DataLoader(), variables=variables).template(expression)
    except Exception as exc:  # ansible-core 2.19 raises for a top-level omit
        if type(exc).__name__ == "AnsibleValueOmittedError":
            return "OMITTED"
        raise
    return "OMITTED" if value == "__omitted__" else value


def test_every_role_task_that_passes_the_secret_key_passes_the_token():
    found = []
    for name in sorted(os.listdir(os.path.join(ROLE, "tasks"))):
        _walk(_load("tasks", name), found)
    # model_weights and model_cache_plan through module_defaults (main.yml), kernel_cache deploy (kernels.yml) and
    # harvest (harvest.yml).
    assert len(found) == 3
    for holder, module, args in found:
        assert "s3_session_token" in args, (module, holder.get("name"))
        for store, token, expected in (("s3", TOKEN, TOKEN), ("s3", "", "OMITTED"), ("path", TOKEN, None)):
            variables = {
                "model_cache_s3_session_token": token,
                "model_cache_s3_secret_key": SECRET,
                "model_cache_kernel_store": store,
            }
            if module == "group/ttfleet.inference.weights":  # module_defaults: each module picks what it needs
                expected = TOKEN if token else "OMITTED"
            else:
                secret = _render(args["s3_secret_key"], variables)
                expected = "OMITTED" if secret == "OMITTED" else expected
                # Hidden whenever it carries the token, exactly like the secret key.
                no_log = _render(holder["no_log"], dict(variables, model_cache_no_log=True))
                assert str(no_log) == str(store == "s3")
            assert _render(args["s3_session_token"], variables) == expected, (module, store, token)


def test_a_session_token_alone_hides_the_weights_tasks():
    expression = _load("vars", "main.yml")["__model_cache_secret_task"]
    base = {"model_cache_no_log": True, "model_cache_hf_token": "", "model_cache_s3_secret_key": ""}
    assert str(_render(expression, dict(base, model_cache_s3_session_token=TOKEN))) == "True"
    assert str(_render(expression, dict(base, model_cache_s3_session_token=""))) == "False"


def test_the_role_variable_is_specified_like_the_secret_key():
    defaults = _load("defaults", "main.yml")
    assert defaults["model_cache_s3_session_token"] == ""
    specs = _load("meta", "argument_specs.yml")["argument_specs"]
    for entry in ("main", "harvest"):
        options = specs[entry]["options"]
        assert options["model_cache_s3_session_token"] == dict(
            options["model_cache_s3_secret_key"], description=options["model_cache_s3_session_token"]["description"]
        ), entry


def test_the_example_inventory_takes_the_token_from_the_vault():
    path = os.path.join(ROOT, "inventories", "example", "group_vars", "all", "main.yml")
    with open(path, encoding="utf-8") as handle:
        group_vars = yaml.safe_load(handle)
    assert group_vars["model_cache_s3_session_token"] == "{{ vault_s3_session_token | default('') }}"
