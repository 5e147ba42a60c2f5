# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""AWS Signature Version 4 for S3 requests: pure functions, tested against the AWS documentation's examples.

Target hosts may lack boto3, so requests are signed here. Credentials are only ever used to compute signatures: the
client (``client.S3Client``) puts the result in the ``Authorization`` header; no presigned URL is ever made.
"""

from __future__ import annotations

import hashlib
import hmac
import urllib.parse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, Optional, Union

    # The query of a request: a dict or pairs (a None value is sent as "").
    Query = Optional[Union[dict[str, Any], Iterable[tuple[Any, Any]]]]  # noqa: UP007, UP045 - ansible-test pylint reads `|` here as an operation

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


def uri_encode(text: str, keep_slash: bool = True) -> str:
    """RFC 3986 encoding as SigV4 wants it: everything but ``A-Za-z0-9-._~`` (and ``/`` when kept)."""
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def canonical_query(query: Query) -> str:
    """``k=v&...`` from a dict or list of pairs, sorted by encoded key then value, both URI-encoded."""
    pairs = query.items() if isinstance(query, dict) else (query or [])
    encoded = sorted((uri_encode(str(k), False), uri_encode("" if v is None else str(v), False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_key: str, date: str, region: str, service: str = "s3") -> bytes:
    """The derived key of SigV4 for one day, region and service."""
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def sign_v4(
    method: str,
    path: str,
    query: Query,
    headers: Mapping[str, object],
    payload_hash: str,
    access_key: str,
    secret_key: str,
    region: str,
    amz_date: str,
    service: str = "s3",
) -> str:
    """The ``Authorization`` header value for a request; every header in ``headers`` is signed.

    ``path`` is the already URI-encoded absolute path, ``headers`` must hold ``host`` and
    ``x-amz-date`` (= ``amz_date``, ``YYYYMMDDTHHMMSSZ``), ``payload_hash`` is the hex sha256 of the body
    (or ``UNSIGNED-PAYLOAD``).
    """
    canon = {name.lower().strip(): " ".join(str(value).strip().split()) for name, value in headers.items()}
    names = sorted(canon)
    canonical_request = "\n".join(
        [
            method,
            path or "/",
            canonical_query(query),
            "".join(f"{name}:{canon[name]}\n" for name in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )
    signature = hmac.new(
        signing_key(secret_key, amz_date[:8], region, service), string_to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
