"""The release fetch (roles/inference_server/files/install-release.sh, source git) against a hostile git origin: an
origin that accepts and never answers, and one that drips its answer a byte a second, end at the fetch's overall
limit with a clear error and leave no stage directory behind; the URL (it may hold a token) is never printed."""

import os
import shutil
import subprocess
import time

import pytest
from conftest import ROOT, drip, http_head

SCRIPT = os.path.join(ROOT, "roles", "inference_server", "files", "install-release.sh")

pytestmark = pytest.mark.skipif(not shutil.which("git") or not shutil.which("timeout"), reason="needs git and timeout")


def fetch(tmp_path, url, limit):
    env = dict(os.environ, TTFLEET_TTIS_GIT_URL=url, TTFLEET_FETCH_TIMEOUT=str(limit), GIT_TERMINAL_PROMPT="0")
    env.pop("GIT_CONFIG_COUNT", None)
    start = time.monotonic()
    proc = subprocess.run(
        ["sh", SCRIPT, str(tmp_path / "root"), "v0.20.0", "git", "", "1", ""],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize("behaviour", ["silent", "drip"])
def test_a_stalled_git_origin_ends_at_the_fetch_timeout(tmp_path, hostile, behaviour):
    def script(conn, req, server):
        if behaviour == "silent":
            server.stop.wait(30)
        else:
            advertisement = {"Content-Type": "application/x-git-upload-pack-advertisement"}
            drip(conn, http_head(200, advertisement) + b"001e# service", every=1.0, stop=server.stop)

    server = hostile(script)
    url = f"{server.url}/tenstorrent/tt-inference-server.git?token=s3cr3t-in-url"
    proc, seconds = fetch(tmp_path, url, 5)
    assert proc.returncode != 0
    assert seconds < 5 + 12, seconds
    assert "took longer than 5 s (inference_server_fetch_timeout)" in proc.stderr, proc.stderr
    assert "s3cr3t" not in proc.stdout + proc.stderr
    assert server.requests, "git never reached the origin"
    releases = tmp_path / "root" / "releases"
    assert not any(releases.iterdir()), list(releases.iterdir())


def test_a_fetch_timeout_that_is_not_a_number_is_refused(tmp_path):
    proc, _seconds = fetch(tmp_path, "http://127.0.0.1:9/x.git", "soon")
    assert proc.returncode == 1
    assert "TTFLEET_FETCH_TIMEOUT must be a number of seconds" in proc.stderr
