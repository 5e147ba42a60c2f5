# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Stand-ins shared by the image tests: a registry API v2 over HTTP, blobs and manifests, docker save archives.

Imported by name (``from images_helpers import registry``): pytest puts this directory on sys.path (no __init__.py).
The molecule scenario ``images`` runs a real registry and a real engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from typing import ClassVar

from http_servers import QuietHandler, serve

from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import MANIFEST_V2

CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
LAYER = os.urandom(3000)


def digest_of(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest_of(layer=LAYER):
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(CONFIG),
                "digest": digest_of(CONFIG),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": digest_of(layer),
                }
            ],
        }
    ).encode()


class RegistryStandIn(QuietHandler):
    """A registry API v2 stand-in: Basic or Bearer auth, one repository, uploads kept in memory."""

    auth = "basic"
    user, password = "fleet", "right"
    blobs: ClassVar[dict] = {}
    manifests: ClassVar[dict] = {}
    seen: ClassVar[list] = []
    token_seen: ClassVar[list] = []
    realm = None
    lie_digest = False

    def _authorised(self):
        got = self.headers.get("Authorization", "")
        self.seen.append((self.command, self.path, got))
        if self.path.startswith("/token"):
            return True
        if self.auth == "basic":
            return got == "Basic " + encode_auth(self.user, self.password)
        return got == "Bearer tok"

    def _challenge(self):
        if self.auth == "basic":
            return {"WWW-Authenticate": 'Basic realm="test"'}
        realm = self.realm or f"http://{self.headers['Host']}/token"
        return {"WWW-Authenticate": f'Bearer realm="{realm}",service="reg",scope="repository:tt/x:pull"'}

    def do_GET(self):
        if self.path.startswith("/token"):
            self.token_seen.append(self.headers.get("Authorization", ""))
            good = self.headers.get("Authorization") == "Basic " + encode_auth(self.user, self.password)
            if not good:
                return self.answer(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}')
            return self.answer(200, b'{"token":"tok"}')
        if not self._authorised():
            body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            return self.answer(401, body, self._challenge())
        if self.path == "/v2/":
            return self.answer(200, b"{}")
        parts = self.path.split("/")
        if "/manifests/" in self.path:
            body = self.manifests.get(parts[-1])
            if body is None:
                return self.answer(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}')
            digest = digest_of(body) if not self.lie_digest else digest_of(b"other")
            return self.answer(200, body, {"Content-Type": MANIFEST_V2, "Docker-Content-Digest": digest})
        if "/blobs/" in self.path:
            body = self.blobs.get(parts[-1])
            if body is None:
                return self.answer(404)
            return self.answer(200, body)
        return self.answer(404)

    do_HEAD = do_GET

    def do_POST(self):
        if not self._authorised():
            return self.answer(401, b"", self._challenge())
        return self.answer(202, b"", {"Location": "/v2/tt/x/blobs/uploads/u1?state=1"})

    def do_PUT(self):
        if not self._authorised():
            return self.answer(401, b"", self._challenge())
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if "/blobs/uploads/" in self.path:
            digest = self.path.split("digest=")[1].replace("%3A", ":")
            if digest_of(body) != digest:
                return self.answer(400, b'{"errors":[{"code":"DIGEST_INVALID","message":"digest"}]}')
            self.blobs[digest] = body
            return self.answer(201)
        self.manifests[self.path.split("/")[-1]] = body
        return self.answer(201, b"", {"Docker-Content-Digest": digest_of(body)})


@contextlib.contextmanager
def registry(**attrs):
    handler = type("Handler", (RegistryStandIn,), {"blobs": {}, "manifests": {}, "seen": [], "token_seen": [], **attrs})
    with serve(handler) as server:
        yield handler, f"127.0.0.1:{server.server_address[1]}"


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, amount):
        chunk = self.data[self.at : self.at + amount]
        self.at += len(chunk)
        return chunk


def save_tar(path, tags, config=CONFIG, extra=()):
    """A ``docker save`` archive (legacy layout: manifest.json, the config, one layer) of one image; returns its ID."""
    image_id = digest_of(config)
    members = {f"{image_id[7:]}.json": config, "aaa/layer.tar": LAYER}
    manifest = [{"Config": f"{image_id[7:]}.json", "RepoTags": list(tags), "Layers": ["aaa/layer.tar"]}, *extra]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return image_id
