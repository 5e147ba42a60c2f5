# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Image references, site registry mirrors, the registry API v2 client and the Docker Engine API stream.

The mirror mapping runs over every image of the real spec exports and the run.py v0.20.0 recorded commands; the
registry and engine protocol tests use small local servers (stand-ins for a registry and for dockerd's socket: the
molecule scenario `images` runs the real ones).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import socket
import tarfile
import threading
from typing import ClassVar

import pytest
from http_servers import QuietHandler, serve

from ansible_collections.ttfleet.inference.plugins.module_utils import _images as images
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures")
SPECS = os.path.join(FIXTURES, "specs")
RUNPY = os.path.join(FIXTURES, "runpy", "runpy-v0.20.0-docker-examples.json")
MIRROR = {"ghcr.io/tenstorrent": "registry.site.example:5000/tenstorrent"}


def _spec_images():
    found = set()
    for name in sorted(os.listdir(SPECS)):
        if name.startswith("release_model_spec-") and name.endswith(".json.gz"):
            catalog = ttis_catalog.load_spec_file(os.path.join(SPECS, name))
            for spec in ttis_catalog.iter_specs(catalog):
                if spec.get("docker_image"):
                    found.add(spec["docker_image"])
    return sorted(found)


SPEC_IMAGES = _spec_images()


def test_the_exports_name_images():
    assert len(SPEC_IMAGES) > 20
    assert all(image.startswith("ghcr.io/tenstorrent/") for image in SPEC_IMAGES)


@pytest.mark.parametrize("image", SPEC_IMAGES)
def test_every_spec_image_parses_and_maps_by_its_prefix_only(image):
    ref = images.parse_reference(image)
    assert ref.registry == "ghcr.io"
    assert str(ref) == image
    mapped, prefix = images.map_image(image, MIRROR)
    assert prefix == "ghcr.io/tenstorrent"
    assert mapped == "registry.site.example:5000/tenstorrent" + image[len("ghcr.io/tenstorrent") :]
    assert images.parse_reference(mapped).tag == ref.tag


@pytest.mark.parametrize(
    ("text", "registry", "path", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", None, None),
        ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("index.docker.io/x/y:1", "docker.io", "x/y", "1", None),
        ("localhost/a", "localhost", "a", None, None),
        ("localhost:5000/a/b:t", "localhost:5000", "a/b", "t", None),
        ("img-cache:5000/tenstorrent/x:1.0-rc", "img-cache:5000", "tenstorrent/x", "1.0-rc", None),
        ("ghcr.io/a/b@sha256:" + "a" * 64, "ghcr.io", "a/b", None, "sha256:" + "a" * 64),
        ("ghcr.io/a/b:t@sha256:" + "b" * 64, "ghcr.io", "a/b", "t", "sha256:" + "b" * 64),
    ],
)
def test_docker_reference_rules(text, registry, path, tag, digest):
    ref = images.parse_reference(text)
    assert (ref.registry, ref.path, ref.tag, ref.digest) == (registry, path, tag, digest)


@pytest.mark.parametrize(
    "text",
    ["", " ghcr.io/a", "ghcr.io/A/b", "ghcr.io/a/b:", "ghcr.io/a/b@sha256:12", "ghcr.io/a//b", "-x", "a b", None, 5],
)
def test_bad_references_are_refused_by_name(text):
    with pytest.raises(images.ImageError, match="image"):
        images.parse_reference(text)


def test_mapping_matches_whole_components_and_the_longest_prefix():
    mirrors = {"ghcr.io": "m.example:5000/ghcr", "ghcr.io/tenstorrent": "m.example:5000/tt"}
    assert images.map_image("ghcr.io/tenstorrent/x:1", mirrors) == ("m.example:5000/tt/x:1", "ghcr.io/tenstorrent")
    assert images.map_image("ghcr.io/tenstorrentx/y:1", mirrors) == (
        "m.example:5000/ghcr/tenstorrentx/y:1",
        "ghcr.io",
    )
    assert images.map_image("quay.io/a/b:1", mirrors) == ("quay.io/a/b:1", None)
    assert images.map_image("ghcr.io/tenstorrent/x:1", {}) == ("ghcr.io/tenstorrent/x:1", None)
    assert images.map_image("ghcr.io/tenstorrent/x:1", None) == ("ghcr.io/tenstorrent/x:1", None)
    assert images.map_image("ubuntu:22.04", {"docker.io": "m.example/hub"}) == (
        "m.example/hub/library/ubuntu:22.04",
        "docker.io",
    )
    digest = "sha256:" + "c" * 64
    assert images.map_image(f"ghcr.io/tenstorrent/x@{digest}", mirrors)[0] == f"m.example:5000/tt/x@{digest}"


@pytest.mark.parametrize(
    ("mirrors", "message"),
    [
        ({"https://ghcr.io/tenstorrent": "m.example/t"}, "without a scheme"),
        ({"ghcr.io/tenstorrent": "http://m.example/t"}, "without a scheme"),
        ({"tenstorrent": "m.example/t"}, "registry host"),
        ({"ghcr.io/tenstorrent": "mirror/t"}, "registry host"),
        ({"ghcr.io/Tenstorrent": "m.example/t"}, "repository path"),
        (["ghcr.io"], "mapping"),
    ],
)
def test_bad_mirrors_name_the_key_and_the_fix(mirrors, message):
    with pytest.raises(images.ImageError, match=message):
        images.map_image("ghcr.io/tenstorrent/x:1", mirrors)


def test_pinned_keeps_the_tag():
    ref = images.parse_reference("m.example:5000/tt/x:1")
    assert ref.pinned("sha256:" + "d" * 64) == "m.example:5000/tt/x:1@sha256:" + "d" * 64


# --- container_command: only the image changes -------------------------------------------------------------------


with open(RUNPY, encoding="utf-8") as _handle:
    RECORDED = json.load(_handle)["cases"]


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(os.path.join(SPECS, "release_model_spec-v0.20.0.json.gz"))


@pytest.mark.parametrize("case", RECORDED, ids=[f"{c['model']}-{c['tt_device']}" for c in RECORDED])
def test_a_mirror_changes_the_image_of_the_argv_and_nothing_else(v20, case):
    spec = ttis_select.select_spec(v20, case["model"], case["tt_device"])
    plain = container_utils.container_command(spec, v20, volume_root="/srv/tt")
    mapped = container_utils.container_command(
        spec, v20, volume_root="/srv/tt", image_map=lambda image, what: images.map_image(image, MIRROR, what)
    )
    index = plain["argv"].index(plain["image"])
    assert mapped["argv"][:index] == plain["argv"][:index]
    assert mapped["argv"][index + 1 :] == plain["argv"][index + 1 :]
    assert mapped["argv"][index] == mapped["image"] == plain["image"].replace("ghcr.io/", "registry.site.example:5000/")
    assert mapped["image_origin"] == plain["image"] == plain["image_origin"]
    assert (mapped["image_mirror"], plain["image_mirror"]) == ("ghcr.io/tenstorrent", None)


def test_a_bad_mirror_is_an_image_error_naming_the_model(v20):
    spec = ttis_select.select_spec(v20, "Llama-3.2-1B-Instruct", "n150")
    mirrors = {"https://ghcr.io": "m.example/x"}

    def mapper(image, what):
        return images.map_image(image, mirrors, what)

    with pytest.raises(images.ImageError, match=r"tt_registry_mirrors key 'https://ghcr\.io'.*without a scheme"):
        container_utils.container_command(spec, v20, image_map=mapper)


# --- credentials --------------------------------------------------------------------------------------------------


def test_docker_config_auth_is_read_per_registry(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "auths": {
                    "reg.example:5000": {"auth": images.encode_auth("fleet", "pa:ss")},
                    "https://index.docker.io/v1/": {"auth": images.encode_auth("hub", "x")},
                }
            }
        )
    )
    assert images.read_auth(str(config), "reg.example:5000") == ("fleet", "pa:ss")
    assert images.read_auth(str(config), "docker.io") == ("hub", "x")
    assert images.read_auth(str(config), "other.example") is None
    assert images.read_auth(str(tmp_path / "missing.json"), "reg.example:5000") is None
    header = images.engine_auth_header("reg.example:5000", ("fleet", "pa:ss"))["X-Registry-Auth"]
    assert json.loads(base64.urlsafe_b64decode(header)) == {
        "username": "fleet",
        "password": "pa:ss",
        "serveraddress": "reg.example:5000",
    }
    assert images.engine_auth_header("reg.example:5000", None) == {}


# --- a registry stand-in over HTTP ---------------------------------------------------------------------------------

CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
LAYER = os.urandom(3000)


def _digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _manifest(layer=LAYER):
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": images.MANIFEST_V2,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(CONFIG),
                "digest": _digest(CONFIG),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": _digest(layer),
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
            return got == "Basic " + images.encode_auth(self.user, self.password)
        return got == "Bearer tok"

    def _challenge(self):
        if self.auth == "basic":
            return {"WWW-Authenticate": 'Basic realm="test"'}
        realm = self.realm or f"http://{self.headers['Host']}/token"
        return {"WWW-Authenticate": f'Bearer realm="{realm}",service="reg",scope="repository:tt/x:pull"'}

    def do_GET(self):
        if self.path.startswith("/token"):
            self.token_seen.append(self.headers.get("Authorization", ""))
            good = self.headers.get("Authorization") == "Basic " + images.encode_auth(self.user, self.password)
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
            digest = _digest(body) if not self.lie_digest else _digest(b"other")
            return self.answer(200, body, {"Content-Type": images.MANIFEST_V2, "Docker-Content-Digest": digest})
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
            if _digest(body) != digest:
                return self.answer(400, b'{"errors":[{"code":"DIGEST_INVALID","message":"digest"}]}')
            self.blobs[digest] = body
            return self.answer(201)
        self.manifests[self.path.split("/")[-1]] = body
        return self.answer(201, b"", {"Docker-Content-Digest": _digest(body)})


@contextlib.contextmanager
def registry(**attrs):
    handler = type("Handler", (RegistryStandIn,), {"blobs": {}, "manifests": {}, "seen": [], "token_seen": [], **attrs})
    with serve(handler) as server:
        yield handler, f"127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_resolve_gives_the_digest_and_the_compressed_size(auth):
    body = _manifest()
    with registry(auth=auth, manifests={"1.0": body}) as (handler, address):
        client = images.Registry(address, ("fleet", "right"), plain_http=True)
        resolved = client.resolve("tt/x", "1.0")
    assert resolved["digest"] == _digest(body)
    assert resolved["bytes"] == len(CONFIG) + len(LAYER)
    if auth == "bearer":
        assert handler.token_seen == ["Basic " + images.encode_auth("fleet", "right")]
        assert all(seen[2] in ("", "Bearer tok") for seen in handler.seen)


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_a_wrong_password_names_the_registry_and_the_image_not_the_secret(auth):
    with registry(auth=auth, manifests={"1.0": _manifest()}) as (_handler, address):
        client = images.Registry(address, ("fleet", "s3cr3t-wrong"), plain_http=True)
        with pytest.raises(images.ImageError) as caught:
            client.resolve("tt/x", "1.0")
    message = str(caught.value)
    assert f"registry {address} refused access to {address}/tt/x" in message
    assert "'fleet'" in message and "tt_registry_credentials" in message
    assert "s3cr3t" not in message


def test_no_credentials_say_so():
    with (
        registry(manifests={"1.0": _manifest()}) as (_handler, address),
        pytest.raises(images.ImageError, match="no credentials are set"),
    ):
        images.Registry(address, None, plain_http=True).resolve("tt/x", "1.0")


def test_a_token_service_of_another_origin_gets_no_password():
    with contextlib.ExitStack() as stack:
        token_handler, token_address = stack.enter_context(registry(auth="bearer"))
        realm = f"http://{token_address}/token"
        _handler, address = stack.enter_context(registry(auth="bearer", realm=realm, manifests={"1.0": _manifest()}))
        with pytest.raises(images.ImageError, match="refused"):
            images.Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "1.0")
    assert token_handler.token_seen == [""]


def test_a_manifest_whose_digest_lies_is_refused():
    with (
        registry(manifests={"1.0": _manifest()}, lie_digest=True) as (_handler, address),
        pytest.raises(images.ImageError, match="not the digest of the body"),
    ):
        images.Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "1.0")


def test_a_missing_image_is_named():
    with registry() as (_handler, address), pytest.raises(images.ImageError, match=r"has no image tt/x:9\.9"):
        images.Registry(address, ("fleet", "right"), plain_http=True).resolve("tt/x", "9.9")


def test_copy_through_upload_and_manifest_put():
    with registry() as (handler, address):
        client = images.Registry(address, ("fleet", "right"), plain_http=True)
        assert not client.has_blob("tt/x", _digest(LAYER))
        client.upload_blob("tt/x", _digest(LAYER), len(LAYER), _Reader(LAYER))
        assert client.has_blob("tt/x", _digest(LAYER))
        assert client.put_manifest("tt/x", "1.0", _manifest(), images.MANIFEST_V2) == _digest(_manifest())
        assert handler.manifests["1.0"] == _manifest()


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, amount):
        chunk = self.data[self.at : self.at + amount]
        self.at += len(chunk)
        return chunk


def test_verifying_reader_refuses_other_bytes():
    good = images.VerifyingReader(_Reader(LAYER), _digest(LAYER), len(LAYER))
    assert b"".join(iter(lambda: good.read(1000), b"")) == LAYER
    bad = images.VerifyingReader(_Reader(b"x" * len(LAYER)), _digest(LAYER), len(LAYER))
    with pytest.raises(images.ImageError, match="refused"):
        while bad.read(1000):
            pass
    short = images.VerifyingReader(_Reader(LAYER[:10]), _digest(LAYER), len(LAYER))
    with pytest.raises(images.ImageError, match="ended after 10"):
        while short.read(1000):
            pass


# --- the engine's API stream over a Unix socket --------------------------------------------------------------------


@contextlib.contextmanager
def engine(tmp_path, lines, status=200, stall_after=None):
    path = str(tmp_path / "docker.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    requests = []

    def serve():
        while True:
            try:
                conn, _addr = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                requests.append(data.decode("latin-1"))
                conn.sendall(
                    f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n".encode()
                )
                for index, line in enumerate(lines):
                    if stall_after is not None and index == stall_after:
                        threading.Event().wait(3)
                        break
                    conn.sendall(json.dumps(line).encode() + b"\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, requests
    finally:
        listener.close()


PROGRESS = [
    {"status": "Pulling from tt/x", "id": "1.0"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "aaa"},
    {"status": "Downloading", "progressDetail": {"current": 100, "total": 300}, "id": "aaa"},
    {"status": "Downloading", "progressDetail": {"current": 300, "total": 300}, "id": "aaa"},
    {"status": "Download complete", "progressDetail": {}, "id": "aaa"},
    {"status": "Downloading", "progressDetail": {"current": 50, "total": 200}, "id": "bbb"},
    {"status": "Download complete", "progressDetail": {}, "id": "bbb"},
    {"status": "Pull complete", "progressDetail": {}, "id": "bbb"},
    {"status": "Digest: sha256:" + "e" * 64},
]


def test_pull_follows_the_layers_and_sends_the_credentials_in_a_header(tmp_path):
    seen = []
    with engine(tmp_path, PROGRESS) as (path, requests):
        done = images.Engine(path).pull(
            images.parse_reference("reg.example:5000/tt/x:1.0"), ("fleet", "pw"), 500, report=seen.append
        )
    assert done == 500
    assert seen[-1] == 500 and seen == sorted(seen)
    assert requests[0].startswith("POST /images/create?fromImage=reg.example%3A5000%2Ftt%2Fx&tag=1.0 ")
    assert "X-Registry-Auth: " in requests[0]
    assert "pw" not in requests[0].split("X-Registry-Auth")[0]


def test_an_error_in_the_stream_fails_the_pull_with_the_engines_words(tmp_path):
    lines = [*PROGRESS[:3], {"errorDetail": {"message": "unauthorized: \x1b[31mauthentication required"}, "error": "x"}]
    with (
        engine(tmp_path, lines) as (path, _requests),
        pytest.raises(images.ImageError, match=r"failed: unauthorized: \\x1b\[31mauthentication required"),
    ):
        images.Engine(path).pull(images.parse_reference("reg.example:5000/tt/x:1.0"), None, 500)


def test_a_silent_engine_is_a_stall(tmp_path):
    with (
        engine(tmp_path, PROGRESS, stall_after=2) as (path, _requests),
        pytest.raises(images.ImageError, match="stalled"),
    ):
        images.Engine(path, stall=0.5).pull(images.parse_reference("reg.example:5000/tt/x:1.0"), None, 500)


def test_no_engine_is_named(tmp_path):
    with pytest.raises(images.EngineAbsent, match="no Docker engine answers"):
        images.Engine(str(tmp_path / "none.sock")).inspect("x")
    # A socket file nobody listens on any more (a stopped engine): the same words.
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    with pytest.raises(images.EngineAbsent, match="no Docker engine answers"):
        images.Engine(str(tmp_path / "dead.sock")).inspect("x")


def save_tar(path, tags, config=CONFIG, extra=()):
    """A ``docker save`` archive (legacy layout: manifest.json, the config, one layer) of one image; returns its ID."""
    image_id = _digest(config)
    members = {f"{image_id[7:]}.json": config, "aaa/layer.tar": LAYER}
    manifest = [{"Config": f"{image_id[7:]}.json", "RepoTags": list(tags), "Layers": ["aaa/layer.tar"]}, *extra]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return image_id


def test_check_mode_on_a_host_without_its_engine_yet_counts_every_image_to_fetch(tmp_path):
    # A bare host under --check: tt_host would install the engine in the same run, so the plan is "fetch it all".
    from ansible_collections.ttfleet.inference.plugins.modules import container_image

    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, ["reg.example:5000/tt/x:1.0"])
    item = {"image": "reg.example:5000/tt/x:1.0", "archive": str(archive), "archive_sha256": image_id}
    params = {"images": [item], "pull": True}
    warnings = []
    engine = images.Engine(str(tmp_path / "none.sock"))
    plan = container_image._plan(params, engine, True, warnings.append)
    size = archive.stat().st_size
    assert [(e["source"], e["size"], e["record"], e["expected_id"]) for e in plan] == [
        ("archive", size, None, image_id)
    ]
    assert len(warnings) == 1 and "no Docker engine answers" in warnings[0] and "check mode" in warnings[0]
    # A real run still fails with the fix named.
    with pytest.raises(images.EngineAbsent, match="install and start it"):
        container_image._plan(params, engine, False, warnings.append)


def test_repo_digest_is_the_one_of_the_repository():
    ref = images.parse_reference("reg.example:5000/tt/x:1.0")
    record = {"RepoDigests": ["ghcr.io/tt/x@sha256:" + "1" * 64, "reg.example:5000/tt/x@sha256:" + "2" * 64]}
    assert images.repo_digest(record, ref) == "sha256:" + "2" * 64
    assert images.repo_digest({"RepoDigests": []}, ref) is None
    assert images.repo_digest(None, ref) is None


# --- image archives: root's trees or a pin -------------------------------------------------------------------------

REF = images.parse_reference("reg.example:5000/tt/x:1.0")


def test_an_archive_in_a_tree_others_can_write_names_each_level(tmp_path):
    archive = tmp_path / "x.tar"
    archive.write_bytes(b"t")
    os.chmod(tmp_path, 0o777)
    with open(archive, "rb") as handle:
        found = images.archive_writers(handle.fileno())
    assert f"{tmp_path} (owner {'root' if os.geteuid() == 0 else f'uid {os.geteuid()}'}, mode 0777" in "; ".join(found)


def test_a_root_file_in_roots_tree_has_no_writers():
    st = os.stat("/etc/passwd")
    if st.st_uid != 0 or st.st_mode & 0o022 or os.stat("/etc").st_mode & 0o022:
        pytest.skip("/etc/passwd is not root's alone here")
    with open("/etc/passwd", "rb") as handle:
        assert images.archive_writers(handle.fileno()) == []


def test_an_archive_pinned_by_its_image_id_or_its_own_sha256_passes(tmp_path):
    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, [str(REF)])
    with open(archive, "rb") as handle:
        assert images.check_archive_pin(handle, image_id, REF, str(archive), "pin") == image_id
        whole = _digest(archive.read_bytes())
        assert images.check_archive_pin(handle, whole, REF, str(archive), "pin") == image_id
        assert handle.tell() == 0


def test_a_swapped_archive_names_both_digests_and_the_pin(tmp_path):
    archive = tmp_path / "x.tar"
    pin = save_tar(archive, [str(REF)])
    save_tar(archive, [str(REF)], config=CONFIG.replace(b"amd64", b"arm64"))
    with open(archive, "rb") as handle, pytest.raises(images.ImageError) as caught:
        images.check_archive_pin(handle, pin, REF, str(archive), "archive_sha256")
    message = str(caught.value)
    assert f"the archive {archive} of {REF} is not the pinned one (archive_sha256 {pin})" in message
    assert _digest(archive.read_bytes()) in message and _digest(CONFIG.replace(b"amd64", b"arm64")) in message


def test_an_image_id_pin_does_not_cover_other_tags_in_the_archive(tmp_path):
    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, [str(REF), "ghcr.io/tenstorrent/other:1"])
    with (
        open(archive, "rb") as handle,
        pytest.raises(images.ImageError, match=r"also holds ghcr\.io/tenstorrent/other:1"),
    ):
        images.check_archive_pin(handle, image_id, REF, str(archive), "pin")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a" * 64, "sha256:" + "a" * 64), ("sha256:" + "B" * 64, "sha256:" + "b" * 64), ("sha256:abc", None), (3, None)],
)
def test_pins_take_hex_with_or_without_the_prefix(text, expected):
    if expected is None:
        with pytest.raises(images.ImageError, match="is not a sha256"):
            images.check_pin(text, "archive_sha256")
    else:
        assert images.check_pin(text, "archive_sha256") == expected


# --- credentials per registry ---------------------------------------------------------------------------------------


def test_logins_are_one_per_registry():
    logins = images.check_logins(
        [
            {"registry": "reg-a.example:5000", "username": "a", "password": "pa"},
            {"registry": "index.docker.io", "username": "hub", "password": "ph", "ca_cert": None},
        ]
    )
    assert logins["reg-a.example:5000"].auth == ("a", "pa")
    assert logins["docker.io"].auth == ("hub", "ph")
    assert "pa" not in repr(logins)
    with pytest.raises(images.ImageError, match=r"registry_credentials\[1\] and registry_credentials\[0\] both name"):
        images.check_logins([{"registry": "r.example", "username": "a", "password": "x"}] * 2)
    with pytest.raises(images.ImageError, match="without a scheme or a path"):
        images.check_logins([{"registry": "https://r.example", "username": "a", "password": "x"}])


def test_image_mirror_binds_the_old_options_to_one_registry():
    from ansible_collections.ttfleet.inference.plugins.modules import image_mirror

    params = {
        "registry_credentials": [],
        "source_registry": None,
        "source_username": "fleet",
        "source_password": "pw",
        "target_username": None,
        "target_password": None,
    }
    with pytest.raises(images.ImageError, match="never sent to every origin: give both with source_registry"):
        image_mirror.logins_of(params, {"site.example:5000"})
    params["source_registry"] = "ghcr.io"
    assert set(image_mirror.logins_of(params, {"site.example:5000"})) == {"ghcr.io"}
    params.update(target_username="push", target_password="pp")
    with pytest.raises(images.ImageError, match=r"the targets name a\.example:5000, b\.example:5000"):
        image_mirror.logins_of(params, {"a.example:5000", "b.example:5000"})
    assert image_mirror.logins_of(params, {"a.example:5000"})["a.example:5000"].auth == ("push", "pp")
