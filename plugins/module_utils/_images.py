# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Container images: references, site registry mirrors, the registry HTTP API v2 and the Docker Engine API.

Private to the collection. ``container_command`` maps the image a release's spec names to the site's mirror
(``map_image``); ``container_image`` fetches images on a host through the Docker Engine API (credentials in the
``X-Registry-Auth`` header, never in argv; progress from the engine's JSON stream); ``image_mirror`` copies an
image from its origin into the site registry once per site (``Registry``: each blob read once, verified while it
streams through). Every network call is bounded by ``_net.deadline.Deadline`` (a stall limit and an overall limit).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import platform
import re
import socket
import ssl
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import O_DIR
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import trusted
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline, watch
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    WatchedHTTPConnection,
    connection,
    describe,
    open_url,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import CHUNK, DEFAULT_STALL, DEFAULT_TOTAL
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of, show_origin

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]
    # callback(done_bytes, total_bytes, what)
    Report = Callable[[int, int, str], object]

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_CONFIG = "/root/.docker/config.json"
CERTS_DIR = "/etc/docker/certs.d"

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFESTS = (MANIFEST_V2, OCI_MANIFEST)
INDEXES = (MANIFEST_LIST, OCI_INDEX)
ACCEPT = ", ".join(MANIFESTS + INDEXES)

# Caps on what a registry or the engine may send back.
MANIFEST_LIMIT = 4 * 1024 * 1024
TOKEN_LIMIT = 1024 * 1024
ERROR_LIMIT = 64 * 1024
STREAM_LINE_LIMIT = 64 * 1024
STREAM_LIMIT = 256 * 1024 * 1024
# An extracted image takes about twice its compressed layers; the download sits beside it while it unpacks.
EXPANSION = 2.5

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*\Z")
_DOMAIN_RE = re.compile(rf"{_DOMAIN}\Z")
_TAG_RE = re.compile(rf"{_TAG}\Z")
_DIGEST_RE = re.compile(rf"{_DIGEST}\Z")
_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')
_MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class ImageError(Exception):
    """An image that cannot be named, found, fetched or loaded; the message names it and the fix."""


class EngineAbsent(ImageError):
    """No Docker engine listens on the socket (not installed yet, or stopped)."""


@dataclass(frozen=True)
class Reference:
    """An image reference as Docker reads it: ``registry/path[:tag][@digest]``."""

    registry: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.path}"

    @property
    def reference(self) -> str:
        """What to ask a registry for: the digest when there is one, else the tag (latest by default)."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def pinned(self, digest: str) -> str:
        """``name:tag@digest``: Docker runs exactly that content and still shows the tag."""
        return self.name + (f":{self.tag}" if self.tag else "") + f"@{digest}"


def _split_domain(text: str) -> tuple[str | None, str]:
    first, sep, rest = text.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first, rest
    return None, text


def parse_reference(text: object, what: str = "image") -> Reference:
    """Parse ``text`` with Docker's rules (docker.io and library/ by default); ImageError names it otherwise."""
    if not isinstance(text, str) or not text or len(text) > 512 or text != text.strip():
        raise ImageError(f"{what} {printable(text, 120)!r} is not an image reference (registry/path:tag)")
    rest, digest = text, None
    if "@" in rest:
        rest, _sep, digest = rest.partition("@")
        if not _DIGEST_RE.match(digest):
            raise ImageError(f"{what} {text!r}: {digest!r} is not a sha256 digest (sha256: and 64 hex digits)")
    domain, remainder = _split_domain(rest)
    tag = None
    last_slash = remainder.rfind("/")
    colon = remainder.rfind(":")
    if colon > last_slash:
        remainder, tag = remainder[:colon], remainder[colon + 1 :]
        if not _TAG_RE.match(tag):
            raise ImageError(f"{what} {text!r}: {tag!r} is not a valid tag")
    if domain is not None and not _DOMAIN_RE.match(domain):
        raise ImageError(f"{what} {text!r}: {domain!r} is not a registry host[:port]")
    if not _PATH_RE.match(remainder):
        raise ImageError(
            f"{what} {text!r}: {remainder!r} is not a repository path (lowercase letters, digits, '.', '_', '-', '/')"
        )
    registry = domain or DOCKER_HUB
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in remainder:
        remainder = f"library/{remainder}"
    return Reference(registry, remainder, tag, digest)


def _check_prefix(text: object, what: str) -> str:
    if not isinstance(text, str) or not text:
        raise ImageError(f"{what} {printable(text, 120)!r}: give a registry with an optional path")
    if "://" in text:
        raise ImageError(
            f"{what} {text!r}: give a registry and path without a scheme (registry.site.example:5000/tenstorrent); "
            "Docker talks HTTPS to a registry, trusting the CA in /etc/docker/certs.d/<registry>/ca.crt"
        )
    domain, path = _split_domain(text.rstrip("/") + ("/x" if "/" not in text.rstrip("/") else ""))
    if domain is None or not _DOMAIN_RE.match(domain):
        raise ImageError(
            f"{what} {text!r}: the first part must be a registry host (with a '.' or a port, or localhost), "
            "for example ghcr.io/tenstorrent"
        )
    if not _PATH_RE.match(path):
        raise ImageError(f"{what} {text!r}: {path!r} is not a repository path")
    return text.rstrip("/")


def check_mirrors(mirrors: Mapping[str, str] | None, what: str = "tt_registry_mirrors") -> dict[str, str]:
    """Validated registry mappings ``{"ghcr.io/tenstorrent": "registry.site.example:5000/tenstorrent"}``."""
    checked: dict[str, str] = {}
    if mirrors is None:
        return checked
    if not isinstance(mirrors, dict):
        raise ImageError(f"{what} must be a mapping of origin prefix to mirror prefix, not {type(mirrors).__name__}")
    for key, value in mirrors.items():
        origin = _check_prefix(key, f"{what} key")
        checked[origin] = _check_prefix(value, f"{what}[{key!r}]")
    return checked


def map_image(image: str, mirrors: Mapping[str, str] | None, what: str = "image") -> tuple[str, str | None]:
    """The reference to pull and run for ``image`` and the prefix that mapped it (None: not mapped).

    A prefix matches whole path components of the image's name (``ghcr.io/tenstorrent`` matches
    ``ghcr.io/tenstorrent/x:1``, not ``ghcr.io/tenstorrentx/y``); the longest prefix wins; the rest of the reference
    (path below the prefix, tag, digest) is kept as written."""
    ref = parse_reference(image, what)
    checked = check_mirrors(mirrors)
    best = None
    for prefix in checked:
        matches = ref.name == prefix or ref.name.startswith(prefix + "/")
        if matches and (best is None or len(prefix) > len(best)):
            best = prefix
    if best is None:
        return image, None
    mapped = checked[best] + str(ref)[len(best) :]
    parse_reference(mapped, f"{what} mapped by {best!r}")
    return mapped, best


def registry_host(text: object, what: str = "registry") -> str:
    """A registry as image references name it, ``host[:port]`` (Docker Hub's aliases are ``docker.io``)."""
    if not isinstance(text, str) or not text or "/" in text or not _DOMAIN_RE.match(text):
        raise ImageError(
            f"{what} {printable(text, 120)!r}: give the registry as host[:port], the way image references name "
            "it, without a scheme or a path (registry.site.example:5000, ghcr.io)"
        )
    return DOCKER_HUB if text in ("index.docker.io", DOCKER_HUB_API) else text


@dataclass(frozen=True)
class Login:
    """The credentials, and the CA, set for one registry; nothing here is ever sent to another host."""

    username: str
    password: str = field(repr=False)
    ca_cert: str | None = field(default=None, repr=False)

    @property
    def auth(self) -> tuple[str, str]:
        return self.username, self.password


def check_logins(entries: object, what: str = "registry_credentials") -> dict[str, Login]:
    """``{registry: Login}`` from ``[{registry, username, password, ca_cert}]``, one entry per registry.

    A credential is looked up by the host[:port] a request actually goes to (after every mirror or upstream
    mapping), so an entry belongs to exactly one registry; two entries for one registry are refused."""
    logins: dict[str, Login] = {}
    if entries is None:
        return logins
    if not isinstance(entries, list):
        raise ImageError(f"{what} must be a list of {{registry, username, password}}, not {type(entries).__name__}")
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{what}[{index}]"
        if not isinstance(entry, dict):
            raise ImageError(f"{where} must be a mapping with registry, username and password")
        registry = registry_host(entry.get("registry"), f"{where}.registry")
        if registry in seen:
            raise ImageError(
                f"{where} and {what}[{seen[registry]}] both name registry {registry}: keep one entry per registry"
            )
        seen[registry] = index
        username, password = entry.get("username"), entry.get("password")
        if not isinstance(username, str) or not username or not isinstance(password, str):
            raise ImageError(f"{where} ({registry}): give username and password as strings")
        ca_cert = entry.get("ca_cert")
        if ca_cert is not None and not isinstance(ca_cert, str):
            raise ImageError(f"{where} ({registry}): ca_cert must be PEM text")
        logins[registry] = Login(username, password, ca_cert or None)
    return logins


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    return "linux", _MACHINES.get(machine, machine)


# ---------------------------------------------------------------------------------------------------------------------
# Credentials: Docker's own config file, for root.


def read_auth(config_path: str, registry: str) -> tuple[str, str] | None:
    """(username, password) stored for ``registry`` in Docker's config.json (``auths.<registry>.auth``), or None."""
    from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json_path

    data = read_json_path(config_path, missing=None)
    if not isinstance(data, dict):
        return None
    found = data.get("auths")
    auths: JSON = found if isinstance(found, dict) else {}
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys += ["https://index.docker.io/v1/", "index.docker.io"]
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, sep, secret = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise ImageError(
                    f"{config_path}: the auth entry of {registry} is not base64 of user:password; "
                    "log in again (tt_registry_credentials)"
                ) from None
            if sep:
                return user, secret
    return None


def encode_auth(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def engine_auth_header(registry: str, auth: tuple[str, str] | None) -> dict[str, str]:
    """The X-Registry-Auth header the Docker Engine API takes for a pull (base64url JSON)."""
    if auth is None:
        return {}
    payload = json.dumps({"username": auth[0], "password": auth[1], "serveraddress": registry}).encode()
    return {"X-Registry-Auth": base64.urlsafe_b64encode(payload).decode()}


def ssl_context(registry: str, certs_dir: str = CERTS_DIR) -> ssl.SSLContext:
    """The system CAs plus the registry's own CA from Docker's certs.d (``<certs_dir>/<registry>/ca.crt``)."""
    context = ssl.create_default_context()
    ca_file = os.path.join(certs_dir, registry, "ca.crt")
    if os.path.isfile(ca_file):
        context.load_verify_locations(cafile=ca_file)
    return context


# ---------------------------------------------------------------------------------------------------------------------
# Image archives (docker save tarballs) on the host: root loads them into the engine, so where they lie is checked.


def check_pin(text: object, what: str) -> str:
    """``sha256:<64 hex>`` from a pin given with or without its ``sha256:`` prefix."""
    value = text.lower() if isinstance(text, str) else text
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
        value = "sha256:" + value
    if not isinstance(value, str) or not _DIGEST_RE.match(value):
        raise ImageError(
            f"{what} {printable(text, 120)!r} is not a sha256 (64 hex digits, with or without sha256:): give the "
            "image ID (the Id of docker image inspect IMAGE where it was saved) or the archive's sha256sum"
        )
    return value


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


def _same_image(tag: object, ref: Reference) -> bool:
    try:
        other = parse_reference(tag)
    except ImageError:
        return False
    return (other.name, other.tag or "latest") == (ref.name, ref.tag or "latest")


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
                    raise ImageError(
                        f"{what}: {printable(name, 120)} is not a regular member of {limit} B or less"
                    )
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
        raise ImageError(
            f"{what} is not a docker save tarball ({type(exc).__name__}: {printable(exc, 200)})"
        ) from None
    finally:
        handle.seek(0)
    return found


def check_archive_pin(handle: Any, pin: str, ref: Reference, archive: str, option: str) -> str:
    """The image ID the engine must show for ``ref`` once ``archive`` is loaded, when ``pin`` is that image ID or the
    archive's own sha256; an ImageError naming the archive, both digests and the fix otherwise. Nothing reaches the
    engine before this passes; the module checks the ID again after the load."""
    images = archive_images(handle, archive)
    ours = [image_id for image_id, tags in images if any(_same_image(tag, ref) for tag in tags)]
    expected = ours[0] if ours else None
    if expected == pin:
        others = sorted({tag for _id, tags in images for tag in tags if not _same_image(tag, ref)})
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


# ---------------------------------------------------------------------------------------------------------------------
# The registry HTTP API v2.


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
        data = _json(body, f"the manifest of {self.registry}/{path}:{reference}")
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
            data = _json(body, f"the {wanted[1]} manifest of {self.registry}/{path}")
            result.update(platform_digest=child, platform_manifest=body, platform_media_type=media)
        layers = data.get("layers")
        config = data.get("config")
        if not isinstance(layers, list) or not isinstance(config, dict):
            raise ImageError(f"{self.registry}/{path}:{reference}: the manifest lists no layers and config")
        blobs = [config] + [layer for layer in layers if isinstance(layer, dict)]
        for blob in blobs:
            if not _DIGEST_RE.match(str(blob.get("digest"))) or not isinstance(blob.get("size"), int):
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


def _json(body: bytes, what: str) -> JSON:
    try:
        data = json.loads(body)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise ImageError(f"{what} is not a JSON object")
    return data


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


# ---------------------------------------------------------------------------------------------------------------------
# The Docker Engine API on its Unix socket.


class _UnixConnection(WatchedHTTPConnection):
    ttfleet_socket = DOCKER_SOCKET

    def connect(self) -> None:
        deadline = self.ttfleet_deadline
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(deadline.timeout() if deadline else 30)
        try:
            sock.connect(self.ttfleet_socket)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        if deadline is not None:
            self.ttfleet_watch = watch(sock, deadline)


def _progress_of(layers: dict[str, list[int]]) -> int:
    return sum(current for current, _total in layers.values())


class Engine:
    """The host's Docker engine (its Unix socket), bounded like every network call."""

    def __init__(self, socket_path: str = DOCKER_SOCKET, stall: float = 300.0) -> None:
        self.socket_path = socket_path
        self.stall = stall

    def _request(
        self,
        method: str,
        path: str,
        deadline: Deadline,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> http.client.HTTPResponse:
        conn = _UnixConnection("localhost", timeout=deadline.timeout())
        conn.ttfleet_socket = self.socket_path
        conn.ttfleet_deadline = deadline
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            return conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError):
            raise EngineAbsent(
                f"no Docker engine answers on {self.socket_path}: install and start it (ttfleet.inference.tt_host)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ImageError(
                f"the Docker engine on {self.socket_path}: {describe(exc, deadline, 'http://docker')}"
            ) from None

    def _json(self, method: str, path: str, what: str) -> JSON | None:
        deadline = Deadline(total=60, stall=30, what=what)
        resp = self._request(method, path, deadline)
        try:
            body = read_capped(resp, 32 * 1024 * 1024, what, "http://docker", deadline)
        except NetError as exc:
            raise ImageError(f"{what}: {exc}") from None
        finally:
            resp.close()
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise ImageError(f"{what}: the engine answered HTTP {resp.status} {_engine_message(body)}")
        return _json(body, what)

    def inspect(self, image: str) -> JSON | None:
        """The engine's record of ``image`` (Id, RepoTags, RepoDigests, Size) or None when it does not have it."""
        return self._json(
            "GET", f"/images/{urllib.parse.quote(image, safe='/:@')}/json", f"docker image inspect {image}"
        )

    def remove(self, image: str) -> None:
        """Remove the reference ``image`` from the engine (its layers too when nothing else uses them)."""
        what = f"docker image rm {image}"
        deadline = Deadline(total=120, stall=60, what=what)
        resp = self._request("DELETE", f"/images/{urllib.parse.quote(image, safe='/:@')}", deadline)
        try:
            body = read_capped(resp, ERROR_LIMIT, what, "http://docker", deadline)
        except NetError as exc:
            raise ImageError(f"{what}: {exc}") from None
        finally:
            resp.close()
        if resp.status not in (200, 404):
            raise ImageError(f"{what}: the engine answered HTTP {resp.status} {_engine_message(body)}")

    def info(self) -> JSON:
        return self._json("GET", "/info", "docker info") or {}

    def _stream(self, resp: http.client.HTTPResponse, what: str, deadline: Deadline) -> Iterator[JSON]:
        """The engine's JSON messages, one per line, each capped; a stall or the deadline ends it as an ImageError."""
        total = 0
        buffer = b""
        try:
            while True:
                try:
                    data = resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)
                except TimeoutError:
                    raise ImageError(f"{what} stalled: the engine sent nothing for {deadline.stall:.0f} s") from None
                except (OSError, http.client.HTTPException) as exc:
                    if deadline.expired:
                        raise ImageError(f"{what} did not finish within its {deadline.total:.0f} s limit") from None
                    raise ImageError(f"{what}: the engine's stream broke ({type(exc).__name__})") from None
                if deadline.expired:
                    raise ImageError(f"{what} did not finish within its {deadline.total:.0f} s limit")
                if not data:
                    break
                total += len(data)
                if total > STREAM_LIMIT:
                    raise ImageError(f"{what}: the engine sent more than {STREAM_LIMIT} bytes of progress")
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > STREAM_LINE_LIMIT:
                    raise ImageError(f"{what}: a progress message of the engine passed {STREAM_LINE_LIMIT} bytes")
                for line in lines:
                    if line.strip():
                        yield _json(line, f"a progress message of {what}")
            if buffer.strip():
                yield _json(buffer, f"a progress message of {what}")
        finally:
            resp.close()

    def pull(
        self,
        ref: Reference,
        auth: tuple[str, str] | None,
        total: int,
        report: Callable[[int], object] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Pull ``ref`` through the engine; returns the bytes it downloaded. ``report(done)`` follows the layers."""
        what = f"the pull of {ref}"
        deadline = (
            Deadline.for_size(total, stall=self.stall, what=what)
            if timeout is None
            else Deadline(total=timeout, stall=self.stall, what=what)
        )
        query = urllib.parse.urlencode({"fromImage": ref.name, "tag": ref.digest or ref.tag or "latest"})
        resp = self._request(
            "POST", f"/images/create?{query}", deadline, body=b"", headers=engine_auth_header(ref.registry, auth)
        )
        if resp.status != 200:
            try:
                body = read_capped(resp, ERROR_LIMIT, what, "http://docker", deadline)
            except NetError:
                body = b""
            resp.close()
            raise ImageError(f"{what}: the engine answered HTTP {resp.status} {_engine_message(body)}")
        layers: dict[str, list[int]] = {}
        for message in self._stream(resp, what, deadline):
            if message.get("error") or message.get("errorDetail"):
                error = message.get("errorDetail")
                text = error.get("message") if isinstance(error, dict) else None
                raise ImageError(f"{what} failed: {printable(text or message.get('error'), 400)}")
            layer = str(message.get("id") or "")
            status = str(message.get("status") or "")
            found = message.get("progressDetail")
            detail: JSON = found if isinstance(found, dict) else {}
            if not layer:
                continue
            if status == "Downloading" and isinstance(detail.get("current"), int):
                entry = layers.setdefault(layer, [0, 0])
                entry[0] = max(entry[0], detail["current"])
                if isinstance(detail.get("total"), int):
                    entry[1] = detail["total"]
            elif status in ("Download complete", "Pull complete", "Verifying Checksum") and layer in layers:
                entry = layers[layer]
                entry[0] = max(entry[0], entry[1])
            else:
                continue
            if report is not None:
                report(_progress_of(layers))
        return _progress_of(layers)

    def load(self, handle: Any, size: int, report: Callable[[int], object] | None = None) -> list[str]:
        """``docker load`` of an archive (``handle``, ``size`` bytes); returns the references it loaded."""
        what = "docker load"
        deadline = Deadline.for_size(size, stall=self.stall, what=what)

        class Counting:
            done = 0

            def read(self, amount: int) -> bytes:
                data = handle.read(min(amount, 1024 * 1024))
                Counting.done += len(data)
                if report is not None and data:
                    report(Counting.done)
                return data

        resp = self._request(
            "POST",
            "/images/load?quiet=1",
            deadline,
            body=Counting(),
            headers={"Content-Type": "application/x-tar", "Content-Length": str(size)},
        )
        if resp.status != 200:
            body = read_capped(resp, ERROR_LIMIT, what, "http://docker", deadline)
            resp.close()
            raise ImageError(f"{what}: the engine answered HTTP {resp.status} {_engine_message(body)}")
        loaded = []
        for message in self._stream(resp, what, deadline):
            if message.get("error") or message.get("errorDetail"):
                raise ImageError(f"{what} failed: {printable(message.get('error'), 400)}")
            stream = str(message.get("stream") or "")
            for prefix in ("Loaded image: ", "Loaded image ID: "):
                if stream.startswith(prefix):
                    loaded.append(stream[len(prefix) :].strip())
        return loaded


def _engine_message(body: bytes) -> str:
    try:
        return printable(json.loads(body).get("message", ""), 400)
    except (ValueError, AttributeError):
        return printable(body.decode("utf-8", "replace"), 400)


def repo_digest(record: Mapping[str, Any] | None, ref: Reference) -> str | None:
    """The digest the engine recorded for ``ref``'s repository (RepoDigests ``name@sha256:...``), or None."""
    if not record:
        return None
    for item in record.get("RepoDigests") or []:
        if not isinstance(item, str) or "@" not in item:
            continue
        name, _sep, digest = item.partition("@")
        try:
            if parse_reference(name).name == ref.name and _DIGEST_RE.match(digest):
                return digest
        except ImageError:
            continue
    return None
