"""Readiness only from the server (issue 29, case 8): the real ttfleet-serve wrapper, started as its unit starts it,
against a container whose output carries the instance's ready_log_marker inside request text.

vLLM logs the start of every prompt ("Received request ...: prompt: '...'", --max-log-len 32), so a client that sends
the marker as its prompt wrote it into the container's output. Before the fix the wrapper matched the marker anywhere
in that output and reported READY=1 for an instance that had not logged it; now only a whole line that starts with the
marker, or with a logger prefix of the server and then the marker, counts (docs/model-packages.md, "Readiness").
"""

from __future__ import annotations

import sys

import pytest
from test_instance import Host, _messages, _notify_socket, healthy

MARKER = "Application startup complete"
VLLM_REQUEST = "INFO 12-05 01:23:45 [logger.py:43] Received request chatcmpl-1: prompt: {!r}, params: SamplingParams()"

FORGED = {
    "vllm-request-log": [VLLM_REQUEST.format(MARKER + ".")],
    "vllm-request-log-with-process-prefix": ["(APIServer pid=1) " + VLLM_REQUEST.format(MARKER)],
    # vLLM shows the prompt with repr(): a newline in it stays inside the one line.
    "prompt-with-a-newline": [VLLM_REQUEST.format("hi\n" + MARKER)],
    "request-path-in-the-access-log": [f'INFO:     127.0.0.1:40000 - "GET /{MARKER} HTTP/1.1" 404 Not Found'],
    "mid-line": [f"stand-in: echo {MARKER}"],
}
GENUINE = {
    "uvicorn": [f"INFO:     {MARKER}."],
    "uvicorn-coloured": [f"\x1b[32mINFO\x1b[0m:     {MARKER}."],
    "vllm": [f"(APIServer pid=1) INFO 12-05 01:23:45 [launcher.py:37] {MARKER}"],
    "tt-inference-server-entrypoint": [f"2026-12-05 01:23:45,123 - run_vllm_api_server.py:389 - INFO: {MARKER}"],
    "media-server": [f"2026-12-05 01:23:45,123 - INFO - {MARKER}"],
    "lab-stand-in": [f"{MARKER}."],
}


def _container(lines, seconds, long_line=0):
    """A stand-in container: prints a line of ``long_line`` bytes (if any) and ``lines``, then runs ``seconds`` more."""
    code = "import sys, time\n"
    if long_line:
        code += f"for _ in range({long_line >> 16}):\n    sys.stdout.write('x' * 65536)\nsys.stdout.write('\\n')\n"
    code += f"sys.stdout.write({''.join(line + chr(10) for line in lines)!r})\n"
    code += f"sys.stdout.flush()\ntime.sleep({seconds})\n"
    return [sys.executable, "-c", code]


def _start(hostile, tmp_path, lines, long_line=0, start_timeout=2, lifetime=4):
    host = Host(tmp_path)
    server = hostile(healthy)
    host.configure(
        server.url,
        argv=_container(lines, lifetime, long_line),
        start_timeout=start_timeout,
        stop_timeout=1,
        ready_log_marker=MARKER,
        poll_interval=0.2,
    )
    sock, path = _notify_socket(tmp_path)
    with sock:
        result = host.run("start", "x", env={"NOTIFY_SOCKET": path})
        messages = _messages(sock)
    return host, result, messages


@pytest.mark.broke29(8)
@pytest.mark.parametrize("lines", list(FORGED.values()), ids=list(FORGED))
def test_case8_request_text_does_not_declare_the_instance_ready(hostile, tmp_path, lines):
    host, result, messages = _start(hostile, tmp_path, ["INFO:     Started server process [1]", *lines])
    assert not any(message.startswith("READY=1") for message in messages), (messages, result["err"])
    assert result["rc"] == 1 and f"did not log {MARKER!r} within 2 s" in result["err"], result["err"]
    assert not (host.run_dir / "x.marker").exists()


@pytest.mark.parametrize("lines", list(GENUINE.values()), ids=list(GENUINE))
def test_case8_control_the_servers_own_line_declares_it_ready(hostile, tmp_path, lines):
    # A genuine line comes at once and READY=1 follows: the start timeout is only headroom for a loaded machine (the
    # forged cases wait their whole 2 s), so it costs nothing to make it large.
    host, result, messages = _start(
        hostile, tmp_path, ["INFO:     Started server process [1]", *lines], start_timeout=60, lifetime=6
    )
    assert any(message.startswith("READY=1") for message in messages), (messages, result["err"])
    assert result["rc"] == 0, result["err"]
    assert (host.run_dir / "x.marker").exists()


def test_case8_a_marker_line_split_across_reads_still_counts_and_a_long_line_is_bounded(hostile, tmp_path):
    # 64 MiB of one line first (read in 64 KiB chunks), then the genuine line.
    _host, result, messages = _start(
        hostile, tmp_path, [f"INFO:     {MARKER}."], long_line=64 << 20, start_timeout=60, lifetime=6
    )
    assert any(message.startswith("READY=1") for message in messages), (messages, result["err"])
    assert result["peak"] < 48, result
