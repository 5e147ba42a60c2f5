"""kernel_cache: the http store of _kernels.http_store keeps a path token out of every message (issue 13)."""

import os
import secrets
import shutil

import pytest
from unit_helpers import KEY

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError

pytestmark = [
    pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program"),
    pytest.mark.skipif(os.geteuid() != 0, reason="plants root-owned victims and hands directories to uid 1000"),
]


@pytest.fixture(autouse=True)
def _never_blocks(no_hang):
    """A FIFO opened blocking would hang the test: every test here fails after 20 s instead."""


# ---------------------------------------------------------------------------
# The http store behind the peer server's path token


TOKEN = secrets.token_hex(16)


# Ids name the shape, not the random token: parallel workers must collect the same test names.
@pytest.mark.parametrize("base", [f"http://10.0.0.5:41234/{TOKEN}/", f"http://10.0.0.5:41234/{TOKEN}"],
                         ids=["slash", "no-slash"])
def test_http_store_urls_keep_the_token_and_never_show_it(base):
    remote = HttpStore(base)
    entry = "Qwen3-32B/P300x2/tt_transformers/8c48a10/f52987a"
    assert remote._url(KEY, "manifest.json") == f"http://10.0.0.5:41234/{TOKEN}/{entry}/manifest.json"
    assert remote._url({**KEY, "vllm_commit": None}, "kernels.tar.zst").endswith("/8c48a10/none/kernels.tar.zst")
    assert remote.describe(KEY) == f"http://10.0.0.5:41234/<base path>/{entry}/"
    assert TOKEN not in remote.describe() + remote.describe(KEY, "kernels.tar.zst")
    plain = HttpStore("http://user:pw@mirror:8080")
    assert plain._url(KEY, "x") == f"http://user:pw@mirror:8080/{entry}/x"
    assert plain.describe(KEY) == f"http://mirror:8080/{entry}/"


@pytest.mark.parametrize("url", ["http://:8080/", "http://user@/", "http://user:pw@:8080/x/"])
def test_a_store_url_without_a_host_is_refused_by_name(url):
    with pytest.raises(KernelError, match="names no host") as err:
        HttpStore(url)
    assert "pw" not in str(err.value)
