# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""model_weights: the names and checks of _weights.names (revisions, repo ids, listed paths, patterns, scrubbing)."""

from __future__ import annotations

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._weights.names import (
    DEFAULT_IGNORE_PATTERNS,
    WeightsError,
    check_relpath,
    check_revision,
    filter_paths,
    scrub,
)

# Shaped like an HF token, assembled at run time so no token-like string is committed.
TOKEN = "hf_" + "ttfleetTEST" + "token0123456789abcdef"


# ---------------------------------------------------------------------------
# Pure functions


@pytest.mark.parametrize(
    ("allow", "ignore", "expected"),
    [
        (None, DEFAULT_IGNORE_PATTERNS, ["config.json", "model-1.safetensors", "sub/tokenizer.json"]),
        (["*.json"], DEFAULT_IGNORE_PATTERNS, ["config.json", "sub/tokenizer.json"]),
        (["sub/"], [], ["sub/tokenizer.json"]),
        (None, [], ["config.json", "model-1.safetensors", "original/consolidated.00.pth", "sub/tokenizer.json"]),
        (None, ["*.safetensors", "original/"], ["config.json", "sub/tokenizer.json"]),
    ],
)
def test_filter_paths(allow, ignore, expected):
    paths = ["config.json", "model-1.safetensors", "original/consolidated.00.pth", "sub/tokenizer.json"]
    assert filter_paths(paths, allow, ignore) == expected


def test_floating_revision_refused_with_fix():
    assert check_revision("Qwen/Qwen3-32B", "a" * 40, False) is True
    with pytest.raises(WeightsError) as exc:
        check_revision("Qwen/Qwen3-32B", "main", False)
    msg = str(exc.value)
    assert "revision 'main' of Qwen/Qwen3-32B is a branch or tag, not a commit" in msg
    assert "https://huggingface.co/Qwen/Qwen3-32B/commits/main" in msg
    assert "allow_floating_revision: true" in msg
    with pytest.raises(WeightsError, match="abbreviated"):
        check_revision("Qwen/Qwen3-32B", "9216db5", False)
    with pytest.raises(WeightsError, match="no revision given"):
        check_revision("Qwen/Qwen3-32B", None, False)
    assert check_revision("Qwen/Qwen3-32B", "main", True) is False


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "/etc/passwd",
        "a//b",
        "a/./b",
        ".ttfleet-manifest.json",
        "x.ttfleet-part",
        "a\nb",
        "\x1b]0;t\x07x",
        "x\u202ey",
        "x" * 256,
        "/".join(["d" * 255] * 17),
    ],
)
def test_relpath_refused(bad):
    with pytest.raises(WeightsError, match="unusable file path"):
        check_relpath(bad, "the Hub")


def test_scrub_token_and_url_credentials():
    text = f"GET https://user:pw@mirror.lab/x failed with Bearer {TOKEN}"
    assert scrub(text, TOKEN) == "GET https://********@mirror.lab/x failed with Bearer ********"
    # A password holding "@" is user info up to the last "@" before the host.
    assert scrub("http://u:p@ss@s3.lab:9000/b") == "http://********@s3.lab:9000/b"


@pytest.mark.parametrize("path", [".ttfleet-manifest.json", ".ttfleet-staging", ".ttfleet-staging/state"])
def test_the_reserved_names_are_refused_saying_why(path):
    with pytest.raises(WeightsError, match=r"this collection.s own manifest or staging.*ignore_patterns"):
        check_relpath(path, "the Hub")


@pytest.mark.parametrize("path", [".ttfleet-staging.json", "sub/.ttfleet-manifest.json", "sub/.ttfleet-staging"])
def test_names_like_ours_elsewhere_are_ordinary_files(path):
    assert check_relpath(path, "the Hub") == path
