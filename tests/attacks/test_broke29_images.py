"""Issue 29 case 6 and the registry_auth finding: image archives and root's Docker config, against the real modules.

``container_image`` loads ``image_archive`` (a ``docker save`` tarball) into the engine as root, and the unit then runs
what it holds with ``--ipc host``, the devices and the volume. The archive was refused only when it was a link or a
FIFO: a regular file in a directory uid 1000 can write was loaded, so uid 1000 swapped the tarball and the engine
loaded its image under the operator's tag. Now an archive is loaded only from a tree only root can write, or when it
matches its pin (``archive_sha256``: the image ID or the archive's sha256), checked before any byte reaches the engine.

The engine is a stand-in on a root-only Unix socket that records every load (what the real engine would have loaded)
and answers like dockerd: ``Loaded image: <tag>`` and, after it, the image ID of the config in the archive.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import socketserver
import stat
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import attacker

TAG = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.20.0-b204341"
OPERATOR_CONFIG = b'{"architecture":"amd64","os":"linux","config":{"User":"1000"},"rootfs":{"type":"layers"}}'
ATTACKER_CONFIG = b'{"architecture":"amd64","os":"linux","config":{"User":"0"},"rootfs":{"type":"layers"}}'


def image_id(config):
    return "sha256:" + hashlib.sha256(config).hexdigest()


def save_tar(config, tag=TAG):
    """The bytes of a ``docker save`` archive (legacy layout) of one image: manifest.json, its config, one layer."""
    members = {f"{image_id(config)[7:]}.json": config, "aaa/layer.tar": config * 50}
    members["manifest.json"] = json.dumps(
        [{"Config": f"{image_id(config)[7:]}.json", "RepoTags": [tag], "Layers": ["aaa/layer.tar"]}]
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Engine:
    """dockerd's image API, as much of it as container_image uses; ``loads`` keeps every archive it received."""

    def __init__(self, path):
        self.path = str(path)
        self.loads = []
        self.images = {}
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/info":
                    return self._send(200, {"DockerRootDir": os.path.dirname(engine.path)})
                name = self.path[len("/images/") : -len("/json")]
                record = engine.images.get(name)
                return self._send(200, record) if record else self._send(404, {"message": "No such image"})

            def do_POST(self):
                data = self.rfile.read(int(self.headers["Content-Length"]))
                engine.loads.append(data)
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    entry = json.loads(tar.extractfile("manifest.json").read())[0]
                    config = tar.extractfile(entry["Config"]).read()
                for tag in entry["RepoTags"]:
                    engine.images[tag] = {"Id": image_id(config), "RepoTags": [tag], "RepoDigests": []}
                self._send(200, {"stream": f"Loaded image: {entry['RepoTags'][0]}\n"})

            def do_DELETE(self):
                engine.images.pop(self.path[len("/images/") :], None)
                self._send(200, [])

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def get_request(self):
                conn, _addr = super().get_request()
                return conn, ("local", 0)

        self.server = Server(self.path, Handler)
        os.chmod(self.path, 0o600)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine(arena):
    made = Engine(arena.private / "docker.sock")
    yield made
    made.close()


def fetch(arena, engine, archive, pin=None):
    item = {"image": TAG, "archive": str(archive)}
    if pin:
        item["archive_sha256"] = pin
    return arena.module("container_image", {"images": [item], "pull": False, "docker_socket": engine.path})


def operator_archive_in_users_directory(arena):
    """The operator's archive, root's own file, in a directory uid 1000 owns (a shared images directory)."""
    images = arena.root / "images"
    arena.mkdirs(images)
    return arena.write(images / "vllm.tar", save_tar(OPERATOR_CONFIG), owner=0)


def swap(arena, archive):
    """uid 1000 replaces the archive with its own image under the same tag (a rename in its own directory)."""
    planted = arena.write(arena.home / "vllm.tar", save_tar(ATTACKER_CONFIG))
    attacker("mv", "-f", planted, archive)
    assert archive.stat().st_uid == 1000


@pytest.mark.broke29(6)
def test_case06_a_swapped_archive_in_a_users_directory_is_refused_before_the_load(arena, engine):
    archive = operator_archive_in_users_directory(arena)
    swap(arena, archive)
    result = fetch(arena, engine, archive)
    assert engine.loads == [], "the engine loaded the archive uid 1000 planted"
    assert TAG not in engine.images
    assert result.failed and not result.timed_out
    message = result["msg"]
    assert f"its archive {archive} is refused" in message
    assert f"{archive.parent} (owner uid 1000" in message and "image_archive_sha256" in message


@pytest.mark.broke29(6)
def test_case06_even_roots_own_archive_is_refused_where_uid_1000_can_swap_it(arena, engine):
    # Not swapped yet: nothing proves it will not be between the check and the next run, so it is refused as well.
    archive = operator_archive_in_users_directory(arena)
    result = fetch(arena, engine, archive)
    assert engine.loads == [] and result.failed
    assert f"{archive.parent} (owner uid 1000" in result["msg"]


@pytest.mark.broke29(6)
def test_case06_a_pinned_archive_that_was_swapped_is_refused_naming_the_pin(arena, engine):
    archive = operator_archive_in_users_directory(arena)
    swap(arena, archive)
    pin = image_id(OPERATOR_CONFIG)
    result = fetch(arena, engine, archive, pin)
    assert engine.loads == [] and result.failed
    assert f"the archive {archive} of {TAG} is not the pinned one (archive_sha256 {pin})" in result["msg"]
    assert image_id(ATTACKER_CONFIG) in result["msg"]


def test_case06_control_a_pinned_archive_loads_from_any_directory(arena, engine):
    archive = operator_archive_in_users_directory(arena)
    result = fetch(arena, engine, archive, image_id(OPERATOR_CONFIG)[7:])
    assert not result.failed, result
    assert engine.loads == [save_tar(OPERATOR_CONFIG)]
    assert result["images"][0]["id"] == image_id(OPERATOR_CONFIG)


def test_case06_control_an_archive_in_roots_own_tree_loads_unpinned(arena, engine):
    top = Path(tempfile.mkdtemp(prefix="ttfleet-attack-images-", dir="/var/lib"))
    arena.cleanups.append(lambda: shutil.rmtree(top))
    for level in ("/", "/var", "/var/lib"):
        if os.stat(level).st_uid != 0 or os.stat(level).st_mode & 0o022:
            pytest.skip(f"{level} is not root's alone on this machine")
    os.chmod(top, 0o755)
    archive = top / "vllm.tar"
    archive.write_bytes(save_tar(OPERATOR_CONFIG))
    os.chmod(archive, 0o644)
    result = fetch(arena, engine, archive)
    assert not result.failed, result
    assert engine.loads == [save_tar(OPERATOR_CONFIG)]


@pytest.mark.broke29("side")
@pytest.mark.parametrize("stored", [False, True], ids=["first-login", "already-stored"])
def test_side_registry_auth_makes_roots_docker_config_directory_0700(arena, stored):
    directory = arena.private / "dot-docker"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    args = {
        "registry": "registry.site.example:5000",
        "username": "fleet",
        "password": "site-pw",
        "docker_config": str(directory / "config.json"),
        "certs_dir": str(arena.private / "certs"),
    }
    if stored:
        assert not arena.module("registry_auth", args).failed
        os.chmod(directory, 0o755)
    result = arena.module("registry_auth", args)
    assert not result.failed, result
    assert result["changed"]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "config.json").stat().st_mode) == 0o600
    again = arena.module("registry_auth", args)
    assert not again.failed and not again["changed"]
