# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The registry HTTP API v2: one registry with the credentials set for it only, manifests, blobs and uploads.

``image_mirror`` copies an image from its origin into the site registry once per site (each blob read once,
verified while it streams through, ``VerifyingReader``); ``container_image`` asks for a manifest and the sizes of its
layers before a pull. Every call is bounded by ``_net.deadline.Deadline`` (a stall limit and an overall limit).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import platform
import re
import ssl
import urllib.error
import urllib.parse
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import CERTS_DIR, encode_auth, ssl_context
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    ACCEPT,
    DIGEST_RE,
    DOCKER_HUB,
    DOCKER_HUB_API,
    ERROR_LIMIT,
    INDEXES,
    MANIFEST_LIMIT,
    TOKEN_LIMIT,
    ImageError,
    json_object,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    connection,
    describe,
    open_url,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import CHUNK, DEFAULT_STALL, DEFAULT_TOTAL
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of, show_origin

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    JSON = dict[str, Any]

_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')
_MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    return "linux", _MACHINES.get(machine, machine)


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = read_capped(exc, ERROR_LIMIT, "the error", exc.geturl() or "")
    except NetError:
        body = b""
    try:
        errors = json.loads(body).get("errors") or []
        text = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError):
        text = body.decode("utf-8", "replace")
    return printable(text.strip() or exc.reason, 300)


class Registry:
    """One registry (host[:port]), with the credentials set for it only.

    Authentication follows the registry's challenge: Basic, or a Bearer token from its realm. The username and
    password go to the realm only when it has the registry's own origin (a token service elsewhere gets an
    anonymous request); a token goes only to the registry."""

    def __init__(
        self,
        registry: str,
        auth: tuple[str, str] | None = None,
        plain_http: bool = False,
        certs_dir: str = CERTS_DIR,
        timeout: float = DEFAULT_TOTAL,
        stall: float = DEFAULT_STALL,
        ca_data: str | None = None,
    ) -> None:
        self.registry = registry
        host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        self.base = f"{'http' if plain_http else 'https'}://{host}"
        self.auth = auth
        self.context = None if plain_http else ssl_context(registry, certs_dir)
        if self.context is not None and ca_data:
            try:
                self.context.load_verify_locations(cadata=ca_data)
            except (ssl.SSLError, ValueError):
                raise ImageError(f"the CA certificate given for {registry} is not a PEM certificate") from None
        self.timeout = timeout
        self.stall = stall
        self.tokens: dict[str, dict[str, str]] = {}

    def _deadline(self, what: str, size: int | None = None) -> Deadline:
        if size is not None:
            return Deadline.for_size(size, stall=self.stall, what=what)
        return Deadline(total=self.timeout, stall=self.stall, what=what)

    def _open(
        self,
        url: str,
        deadline: Deadline,
        headers: Mapping[str, str] | None = None,
        credentials: Mapping[str, str] | None = None,
        method: str | None = None,
    ) -> http.client.HTTPResponse:
        return open_url(
            url,
            deadline,
            headers=headers,
            credentials=credentials,
            method=method,
            context=self.context,
            credential_origin=origin_of(self.base),
            use_proxy=True,
        )

    def _challenge(self, header: str) -> tuple[str, dict[str, str]]:
        scheme, _sep, params = header.strip().partition(" ")
        return scheme.lower(), dict(_CHALLENGE_RE.findall(params))

    def _token(self, challenge: dict[str, str], scope: str) -> dict[str, str]:
        realm = challenge.get("realm", "")
        if urllib.parse.urlsplit(realm).scheme not in ("http", "https"):
            raise ImageError(f"registry {self.registry} names no usable token service ({printable(realm, 120)})")
        query = {"service": challenge.get("service", ""), "scope": scope}
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        creds = {}
        if self.auth and origin_of(realm) == origin_of(self.base):
            creds = {"Authorization": "Basic " + encode_auth(*self.auth)}
        deadline = self._deadline(f"the token for {scope} from {self.registry}")
        try:
            with open_url(url, deadline, credentials=creds, context=self.context, use_proxy=True) as resp:
                data = json.loads(read_capped(resp, TOKEN_LIMIT, "the token", url, deadline))
        except urllib.error.HTTPError as exc:
            raise self._refused(exc.code, scope, _error_text(exc)) from None
        except ValueError:
            raise ImageError(f"registry {self.registry}: its token service sent no JSON") from None
        token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise ImageError(f"registry {self.registry}: its token service sent no token")
        return {"Authorization": f"Bearer {token}"}

    def _refused(self, code: int, scope: str, detail: str) -> ImageError:
        image = scope.split(":")[1] if scope.count(":") >= 2 else scope
        who = f"as {self.auth[0]!r}" if self.auth else "anonymously (no credentials are set for it)"
        return ImageError(
            f"registry {self.registry} refused access to {self.registry}/{image} {who}: HTTP {code} {detail}; "
            f"check tt_registry_credentials for {self.registry}"
        )

    def authorize(self, path: str, actions: str = "pull") -> dict[str, str]:
        """The headers that authorise ``actions`` on repository ``path`` (cached per scope)."""
        scope = f"repository:{path}:{actions}"
        if scope in self.tokens:
            return self.tokens[scope]
        deadline = self._deadline(f"the API check of {self.registry}")
        headers: dict[str, str] = {}
        try:
            with self._open(f"{self.base}/v2/", deadline) as resp:
                read_capped(resp, ERROR_LIMIT, "the answer", self.base, deadline)
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise ImageError(
                    f"registry {self.registry} answered /v2/ with HTTP {exc.code} {_error_text(exc)}: "
                    "is it a registry (API v2)?"
                ) from None
            scheme, challenge = self._challenge(exc.headers.get("WWW-Authenticate", ""))
            exc.close()
            if scheme == "basic":
                if not self.auth:
                    raise self._refused(401, scope, "(it asks for a username and password)") from None
                headers = {"Authorization": "Basic " + encode_auth(*self.auth)}
            elif scheme == "bearer":
                headers = self._token(challenge, scope)
            else:
                raise ImageError(f"registry {self.registry} asks for an unknown authentication ({scheme!r})") from None
        except NetError as exc:
            raise ImageError(f"registry {self.registry} cannot be reached: {exc}") from None
        self.tokens[scope] = headers
        return headers

    def _call(
        self,
        path: str,
        url_path: str,
        what: str,
        actions: str = "pull",
        method: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: Deadline | None = None,
    ) -> http.client.HTTPResponse:
        creds = self.authorize(path, actions)
        deadline = deadline or self._deadline(what)
        try:
            return self._open(self.base + url_path, deadline, headers=headers, credentials=creds, method=method)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise self._refused(exc.code, f"repository:{path}:{actions}", _error_text(exc)) from None
            raise
        except NetError as exc:
            raise ImageError(f"{what} from {self.registry}: {exc}") from None

    def manifest(
        self, path: str, reference: str, method: str = "GET", missing_ok: bool = False
    ) -> tuple[bytes, str, str]:
        """(body, media type, digest) of a manifest; ImageError when the registry does not have it (with
        ``missing_ok``: empty values)."""
        what = f"the manifest of {self.registry}/{path}:{reference}"
        deadline = self._deadline(what)
        try:
            with self._call(
                path,
                f"/v2/{path}/manifests/{reference}",
                what,
                method=method,
                headers={"Accept": ACCEPT},
                deadline=deadline,
            ) as resp:
                body = b"" if method == "HEAD" else read_capped(resp, MANIFEST_LIMIT, what, self.base, deadline)
                media = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
                digest = resp.headers.get("Docker-Content-Digest") or ""
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                if missing_ok:
                    return b"", "", ""
                raise ImageError(
                    f"registry {self.registry} has no image {path}:{reference} (HTTP 404 {_error_text(exc)})"
                ) from None
            raise ImageError(f"{what}: HTTP {exc.code} {_error_text(exc)}") from None
        except NetError as exc:
            raise ImageError(f"{what}: {exc}") from None
        if body:
            actual = "sha256:" + hashlib.sha256(body).hexdigest()
            if digest and digest != actual:
                raise ImageError(f"{what}: its Docker-Content-Digest {digest} is not the digest of the body ({actual})")
            if reference.startswith("sha256:") and reference != actual:
                raise ImageError(f"{what}: the registry sent a manifest of digest {actual}")
            digest = actual
        return body, media, digest

    def resolve(self, path: str, reference: str) -> JSON:
        """The digest, the platform manifest and its size (config and compressed layers) of an image."""
        body, media, digest = self.manifest(path, reference)
        data = json_object(body, f"the manifest of {self.registry}/{path}:{reference}")
        media = media or data.get("mediaType", "")
        result: JSON = {"digest": digest, "media_type": media, "manifest": body}
        if media in INDEXES or "manifests" in data:
            wanted = host_platform()
            chosen = None
            for item in data.get("manifests") or []:
                plat = item.get("platform") or {} if isinstance(item, dict) else {}
                if (plat.get("os"), plat.get("architecture")) == wanted:
                    chosen = item
                    break
            if chosen is None:
                raise ImageError(
                    f"{self.registry}/{path}:{reference} has no {wanted[0]}/{wanted[1]} image in its index"
                )
            body, media, child = self.manifest(path, str(chosen.get("digest")))
            data = json_object(body, f"the {wanted[1]} manifest of {self.registry}/{path}")
            result.update(platform_digest=child, platform_manifest=body, platform_media_type=media)
        layers = data.get("layers")
        config = data.get("config")
        if not isinstance(layers, list) or not isinstance(config, dict):
            raise ImageError(f"{self.registry}/{path}:{reference}: the manifest lists no layers and config")
        blobs = [config] + [layer for layer in layers if isinstance(layer, dict)]
        for blob in blobs:
            if not DIGEST_RE.match(str(blob.get("digest"))) or not isinstance(blob.get("size"), int):
                raise ImageError(f"{self.registry}/{path}:{reference}: a blob has no sha256 digest or size")
        result["blobs"] = [{"digest": b["digest"], "size": b["size"]} for b in blobs]
        result["bytes"] = sum(b["size"] for b in blobs)
        return result

    def has_blob(self, path: str, digest: str) -> bool:
        what = f"the blob {digest[:19]} of {self.registry}/{path}"
        try:
            with self._call(path, f"/v2/{path}/blobs/{digest}", what, "pull,push", method="HEAD"):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise ImageError(f"{what}: HTTP {exc.code} {_error_text(exc)}") from None

    def open_blob(self, path: str, digest: str, size: int) -> http.client.HTTPResponse:
        what = f"the blob {digest[:19]} of {self.registry}/{path}"
        try:
            return self._call(path, f"/v2/{path}/blobs/{digest}", what, deadline=self._deadline(what, size))
        except urllib.error.HTTPError as exc:
            raise ImageError(f"{what}: HTTP {exc.code} {_error_text(exc)}") from None

    def upload_blob(self, path: str, digest: str, size: int, body: Any) -> None:
        """A monolithic upload: POST a session, then PUT ``size`` bytes of ``body`` (a file-like) with the digest."""
        what = f"the upload of {digest[:19]} to {self.registry}/{path}"
        try:
            with self._call(
                path, f"/v2/{path}/blobs/uploads/", what, "pull,push", method="POST", headers={"Content-Length": "0"}
            ) as resp:
                location = resp.headers.get("Location") or ""
        except urllib.error.HTTPError as exc:
            raise ImageError(f"{what}: HTTP {exc.code} {_error_text(exc)}") from None
        url = urllib.parse.urljoin(self.base + "/", location)
        if origin_of(url) != origin_of(self.base):
            raise ImageError(f"{what}: the registry sent the upload to another origin ({show_origin(url)})")
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        deadline = self._deadline(what, size)
        creds = self.authorize(path, "pull,push")
        req_headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        try:
            conn = connection(*origin_of(url), deadline, context=self.context, use_proxy=True)
            split = urllib.parse.urlsplit(url)
            conn.putrequest("PUT", split.path + ("?" + split.query if split.query else ""))
            for name, value in {**req_headers, **creds}.items():
                conn.putheader(name, value)
            conn.endheaders()
            sent = 0
            while sent < size:
                chunk = body.read(min(CHUNK, size - sent))
                if not chunk:
                    raise ImageError(f"{what}: the source ended after {sent} of {size} bytes")
                conn.send(chunk)
                sent += len(chunk)
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            raise ImageError(f"{what}: {describe(exc, deadline, url)}") from None
        _answer(conn, what, url, deadline, (201, 204))

    def put_manifest(self, path: str, tag: str, body: bytes, media_type: str) -> str:
        what = f"the manifest of {self.registry}/{path}:{tag}"
        creds = self.authorize(path, "pull,push")
        deadline = self._deadline(what)
        try:
            conn = connection(*origin_of(self.base), deadline, context=self.context, use_proxy=True)
            conn.request("PUT", f"/v2/{path}/manifests/{tag}", body=body, headers={"Content-Type": media_type, **creds})
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            raise ImageError(f"{what}: {describe(exc, deadline, self.base)}") from None
        return _answer(conn, what, self.base, deadline, (200, 201))


def _answer(conn: Any, what: str, url: str, deadline: Deadline, accepted: tuple[int, ...]) -> str:
    """Read the (capped) answer to a request sent on ``conn``; returns its Docker-Content-Digest."""
    try:
        resp = conn.getresponse()
        answer = read_capped(resp, ERROR_LIMIT, "the answer", url, deadline)
        digest = resp.headers.get("Docker-Content-Digest") or ""
        resp.close()
        conn.close()
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        raise ImageError(f"{what}: {describe(exc, deadline, url)}") from None
    if resp.status not in accepted:
        raise ImageError(f"{what}: HTTP {resp.status} {printable(answer.decode('utf-8', 'replace'), 300)}")
    return digest


class VerifyingReader:
    """Reads exactly ``size`` bytes of a blob from ``resp`` and checks its sha256 at the end (``finish``)."""

    def __init__(self, resp: Any, digest: str, size: int, report: Callable[[int], object] | None = None) -> None:
        self.resp = resp
        self.digest = digest
        self.size = size
        self.done = 0
        self.hash = hashlib.sha256()
        self.report = report

    def read(self, amount: int) -> bytes:
        want = min(amount, self.size - self.done)
        if want <= 0:
            return b""
        try:
            data = self.resp.read(want)
        except (OSError, http.client.HTTPException) as exc:
            raise ImageError(
                f"the blob {self.digest[:19]} broke off after {self.done} of its {self.size} bytes "
                f"({type(exc).__name__}: {printable(exc, 200)})"
            ) from None
        self.done += len(data)
        self.hash.update(data)
        if self.report is not None and data:
            self.report(len(data))
        if not data or self.done == self.size:
            self.finish()
        return data

    def finish(self) -> None:
        if self.done != self.size:
            raise ImageError(f"the blob {self.digest[:19]} ended after {self.done} of its {self.size} bytes")
        actual = "sha256:" + self.hash.hexdigest()
        if actual != self.digest:
            raise ImageError(f"the blob {self.digest[:19]} arrived with digest {actual[:19]}: refused")
