# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The host's Docker engine through its API on the Unix socket: inspect, remove, pull and load, bounded in time and
bytes. Credentials go in the X-Registry-Auth header, never in argv; progress comes from the engine's JSON stream."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import engine_auth_header
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    ERROR_LIMIT,
    STREAM_LIMIT,
    STREAM_LINE_LIMIT,
    ImageError,
    Reference,
    json_object,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline, watch
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import (
    WatchedHTTPConnection,
    describe,
    read_capped,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import CHUNK
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    JSON = dict[str, Any]

DOCKER_SOCKET = "/var/run/docker.sock"


class EngineAbsent(ImageError):
    """No Docker engine listens on the socket (not installed yet, or stopped)."""


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

    def _body(self, method: str, path: str, what: str) -> bytes | None:
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
        return body

    def _json(self, method: str, path: str, what: str) -> JSON | None:
        body = self._body(method, path, what)
        return None if body is None else json_object(body, what)

    def _list(self, path: str, what: str) -> list[JSON]:
        """A listing of the engine (a JSON array of objects); anything else is an ImageError."""
        body = self._body("GET", path, what)
        try:
            data = json.loads(body or b"[]")
        except ValueError:
            raise ImageError(f"{what} is not JSON") from None
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise ImageError(f"{what} is not a JSON array of objects")
        return data

    def images(self) -> list[JSON]:
        """The engine's images (Id, RepoTags, RepoDigests, Size), as ``docker image ls`` lists them."""
        return self._list("/images/json", "docker image ls")

    def containers(self) -> list[JSON]:
        """Every container, running or not (Id, Names, Image, ImageID, Mounts), as ``docker ps -a`` lists them."""
        return self._list("/containers/json?all=1", "docker ps -a")

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
                        yield json_object(line, f"a progress message of {what}")
            if buffer.strip():
                yield json_object(buffer, f"a progress message of {what}")
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
