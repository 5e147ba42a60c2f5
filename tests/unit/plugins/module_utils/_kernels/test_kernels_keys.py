"""kernel_cache: keys and paths of _kernels.keys."""

import shutil

import pytest
from unit_helpers import KEY

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    KernelError,
    cache_path,
    check_key,
    entry_parts,
)

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


def test_key_fields_are_checked():
    assert check_key({**KEY, "vllm_commit": ""})["vllm_commit"] is None
    assert check_key({**KEY, "mesh": "(8,8)"})["mesh"] == "(8,8)"
    with pytest.raises(KernelError, match="tt_metal_commit is required"):
        check_key({**KEY, "tt_metal_commit": None})
    with pytest.raises(KernelError, match=r"impl_id '\.\./x' is not usable"):
        check_key({**KEY, "impl_id": "../x"})


def test_cache_path_follows_the_tt_cache_path_rule(tmp_path):
    assert cache_path("/v", KEY) == "/v/tt_metal_cache/cache_Qwen3-32B/P300x2"
    assert entry_parts({**KEY, "vllm_commit": None})[-1] == "none"
