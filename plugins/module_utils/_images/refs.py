# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Image references as Docker reads them, site registry mirrors, digests and pins, and the limits on what a registry
or the engine may send back.

``container_command`` maps the image a release's spec names to the site's mirror (``map_image``); the registry client
and the engine client (registry.py, engine.py) take a ``Reference``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"


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

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*\Z")
_DOMAIN_RE = re.compile(rf"{_DOMAIN}\Z")
_TAG_RE = re.compile(rf"{_TAG}\Z")
DIGEST_RE = re.compile(rf"{_DIGEST}\Z")


class ImageError(FleetError):
    """An image that cannot be named, found, fetched or loaded; the message names it and the fix."""


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
        if not DIGEST_RE.match(digest):
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


def check_pin(text: object, what: str) -> str:
    """``sha256:<64 hex>`` from a pin given with or without its ``sha256:`` prefix."""
    value = text.lower() if isinstance(text, str) else text
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
        value = "sha256:" + value
    if not isinstance(value, str) or not DIGEST_RE.match(value):
        raise ImageError(
            f"{what} {printable(text, 120)!r} is not a sha256 (64 hex digits, with or without sha256:): give the "
            "image ID (the Id of docker image inspect IMAGE where it was saved) or the archive's sha256sum"
        )
    return value


def same_image(tag: object, ref: Reference) -> bool:
    try:
        other = parse_reference(tag)
    except ImageError:
        return False
    return (other.name, other.tag or "latest") == (ref.name, ref.tag or "latest")


def json_object(body: bytes, what: str) -> JSON:
    try:
        data = json.loads(body)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise ImageError(f"{what} is not a JSON object")
    return data


def repo_digest(record: Mapping[str, Any] | None, ref: Reference) -> str | None:
    """The digest the engine recorded for ``ref``'s repository (RepoDigests ``name@sha256:...``), or None."""
    if not record:
        return None
    for item in record.get("RepoDigests") or []:
        if not isinstance(item, str) or "@" not in item:
            continue
        name, _sep, digest = item.partition("@")
        try:
            if parse_reference(name).name == ref.name and DIGEST_RE.match(digest):
                return digest
        except ImageError:
            continue
    return None
