# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The weights fan-out's anchor (the digest fixed from the hosts that read the origin) and its holder server names."""

from __future__ import annotations

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ttfleet.inference.plugins.filter.weights import weights_anchors, weights_server_name
from ansible_collections.ttfleet.inference.plugins.module_utils._peer.state import state_path
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.fanout import anchors, server_name

REV = "a" * 40
GOOD, BAD = "1" * 64, "2" * 64


def _result(repo="org/M", revision=REV, digest=GOOD, **extra):
    return {"item": {"model": "M", "repo_id": repo, "revision": revision}, "revision": revision,
            "manifest_sha256": digest, "changed": False, **extra}  # fmt: skip


def test_the_hosts_that_read_the_origin_fix_one_digest_per_repository_and_revision():
    fixed = anchors(
        {
            "seed": [_result(), _result(repo="org/N", digest=BAD)],
            "done": [_result()],
            "puller": [{"item": {"repo_id": "org/M", "revision": REV}, "skipped": True, "changed": False}],
        }
    )
    assert fixed == {f"org/M@{REV}": GOOD, f"org/N@{REV}": BAD}


def test_hosts_that_disagree_are_an_error_naming_them_and_their_digests():
    with pytest.raises(ValueError) as exc:
        anchors({"h1": [_result()], "h2": [_result(digest=BAD)], "h3": [_result()]})
    msg = str(exc.value)
    assert f"org/M@{REV} disagree" in msg
    assert (
        f"h1, h3 hold files with manifest digest {GOOD}" in msg and f"h2 hold files with manifest digest {BAD}" in msg
    )
    with pytest.raises(AnsibleFilterError, match="weights_anchors: the hosts that read the origin"):
        weights_anchors({"h1": [_result()], "h2": [_result(digest=BAD)]})


@pytest.mark.parametrize(
    "result",
    [
        _result(failed=True),
        _result(digest=None),
        _result(revision=""),
        # A floating revision resolved to another commit than the entry names: it anchors nothing.
        {**_result(), "revision": "b" * 40},
        "not a result",
    ],
)
def test_results_that_fix_nothing(result):
    assert anchors({"h1": [result], "h2": None}) == {}


def test_the_filter_refuses_what_is_not_a_mapping():
    with pytest.raises(AnsibleFilterError, match="must map host names"):
        weights_anchors([_result()])


@pytest.mark.parametrize("model", ["Qwen3-32B", "Llama-3.1-8B-Instruct", "a" * 128])
def test_a_safe_model_name_is_its_own_server_name(model):
    assert server_name(model) == model


@pytest.mark.parametrize("model", ["acme/Acme-8B", "acme/acme 8b", "../x", "a" * 129, "é/x", "-lead", "/"])
def test_any_other_model_gets_a_safe_distinct_slug(model, tmp_path):
    name = server_name(model)
    assert re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", name), name
    state_path(str(tmp_path), name)  # the name rule of weights_server takes it
    assert weights_server_name(model) == name


def test_slugs_of_names_that_differ_only_in_unsafe_characters_differ():
    assert server_name("acme/Acme-8B").startswith("acme-Acme-8B-")
    assert server_name("acme/Acme-8B") != server_name("acme Acme-8B") != server_name("acme-Acme-8B")


def test_the_server_name_filter_refuses_what_is_not_a_name():
    with pytest.raises(AnsibleFilterError, match="must be a model name"):
        weights_server_name(None)
