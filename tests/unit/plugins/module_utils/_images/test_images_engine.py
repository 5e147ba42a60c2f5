# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The Docker Engine API client against a stand-in of dockerd's socket: the pull's JSON stream, stalls, no engine."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError, parse_reference

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
        done = Engine(path).pull(parse_reference("reg.example:5000/tt/x:1.0"), ("fleet", "pw"), 500, report=seen.append)
    assert done == 500
    assert seen[-1] == 500 and seen == sorted(seen)
    assert requests[0].startswith("POST /images/create?fromImage=reg.example%3A5000%2Ftt%2Fx&tag=1.0 ")
    assert "X-Registry-Auth: " in requests[0]
    assert "pw" not in requests[0].split("X-Registry-Auth")[0]


def test_an_error_in_the_stream_fails_the_pull_with_the_engines_words(tmp_path):
    lines = [*PROGRESS[:3], {"errorDetail": {"message": "unauthorized: \x1b[31mauthentication required"}, "error": "x"}]
    with (
        engine(tmp_path, lines) as (path, _requests),
        pytest.raises(ImageError, match=r"failed: unauthorized: \\x1b\[31mauthentication required"),
    ):
        Engine(path).pull(parse_reference("reg.example:5000/tt/x:1.0"), None, 500)


def test_a_silent_engine_is_a_stall(tmp_path):
    with (
        engine(tmp_path, PROGRESS, stall_after=2) as (path, _requests),
        pytest.raises(ImageError, match="stalled"),
    ):
        Engine(path, stall=0.5).pull(parse_reference("reg.example:5000/tt/x:1.0"), None, 500)


def test_no_engine_is_named(tmp_path):
    with pytest.raises(EngineAbsent, match="no Docker engine answers"):
        Engine(str(tmp_path / "none.sock")).inspect("x")
    # A socket file nobody listens on any more (a stopped engine): the same words.
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    with pytest.raises(EngineAbsent, match="no Docker engine answers"):
        Engine(str(tmp_path / "dead.sock")).inspect("x")
