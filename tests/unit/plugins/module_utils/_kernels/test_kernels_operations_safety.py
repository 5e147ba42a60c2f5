"""kernel_cache against a hostile cache tree (issue 13): links, FIFOs and planted names where the container UID
can write. Run as root on real directories; each case checks that a root-only victim is left as it was.

The unprivileged attacks themselves (setpriv as uid 1000 against the module) live in the attacker suite; here the
planted names are made by root in the places and with the owners uid 1000 would have.
"""

import io
import json
import os
import secrets
import shutil
import stat
import subprocess
import tarfile

import pytest
from conftest import VICTIM_SECRET
from http_servers import serve_directory
from unit_helpers import KEY, OLD

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels import deploy as deploy_module
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.archive import pack, unpack
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.harvest import harvest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    KernelError,
    cache_path,
    marker_path,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.local import inspect
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import scan_cache

pytestmark = [
    pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program"),
    pytest.mark.skipif(os.geteuid() != 0, reason="plants root-owned victims and hands directories to uid 1000"),
]


USER = 1000


@pytest.fixture(autouse=True)
def _never_blocks(no_hang):
    """A FIFO opened blocking would hang the test: every test here fails after 20 s instead."""


def pathlib_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def warm_cache(volume):
    """A warmed-up cache in the real layout, everything below the volume handed to the container UID."""
    root = cache_path(str(volume), KEY)
    files = {"kernels/a/brisc.elf": os.urandom(4096), "tensor_cache/w.tensorbin": os.urandom(20000)}
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    give(os.path.join(str(volume), "tt_metal_cache"))
    age(root)
    return root, files


def give(top, uid=USER):
    """chown -hR uid:uid top (what a volume of the container UID looks like)."""
    os.lchown(top, uid, uid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def age(top):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (OLD, OLD), follow_symlinks=False)
    os.utime(top, (OLD, OLD))


def opts(volume, **extra):
    base = dict(KEY, volume=str(volume), host="lab", quiet_seconds=60, owner=USER, group=USER)
    base.update(extra)
    return base


def user_volume(path):
    """A volume as the container UID owns it today (before the ownership migration): untrusted all the way."""
    path.mkdir()
    os.chown(path, USER, USER)
    return path


@pytest.fixture
def store(tmp_path):
    """A path store holding the key, harvested from a volume of its own."""
    src = user_volume(tmp_path / "src")
    warm_cache(src)
    store = PathStore(str(tmp_path / "store"))
    harvest(opts(src, warmed=True), store)
    return store


def tree(root):
    out = {}
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = pathlib_bytes(os.path.join(dirpath, name))
    return out


# ---------------------------------------------------------------------------
# Broke 1: the marker


def test_links_at_the_old_predictable_marker_temp_names_are_never_used(tmp_path, victim, store):
    vol = user_volume(tmp_path / "vol")
    warm_cache(vol)
    parent = os.path.dirname(cache_path(str(vol), KEY))
    # What uid 1000 planted against the old code: every pid's temp name linked to the victim.
    for pid in {os.getpid(), *range(1, 200)}:
        os.symlink(victim["file"], os.path.join(parent, f".ttfleet-tmp-.ttfleet-kernels-P300x2.json.{pid}"))
    done = harvest(opts(vol, warmed=True, force=True), store)
    assert done["changed"]
    marker = os.path.join(parent, ".ttfleet-kernels-P300x2.json")
    st = os.lstat(marker)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) == (USER, USER) and stat.S_IMODE(st.st_mode) == 0o644
    assert json.loads(pathlib_bytes(marker))["key"] == KEY
    # The planted links are still links, untouched; no temporary file of ours is left.
    left = sorted(n for n in os.listdir(parent) if n.startswith(".ttfleet-tmp-"))
    assert len(left) == len({os.getpid(), *range(1, 200)})
    assert all(os.path.islink(os.path.join(parent, n)) for n in left)


@pytest.mark.parametrize("action", ["harvest", "deploy", "inspect"])
def test_a_link_at_the_marker_is_refused(tmp_path, victim, store, action):
    vol = user_volume(tmp_path / "vol")
    warm_cache(vol)
    marker = marker_path(str(vol), KEY)
    os.symlink(victim["file"], marker)
    os.lchown(marker, USER, USER)
    with pytest.raises(KernelError, match=r"\.ttfleet-kernels-P300x2\.json is a symbolic link; it is not followed"):
        if action == "harvest":
            harvest(opts(vol, warmed=True, force=True), store)
        elif action == "deploy":
            deploy(opts(vol, force=True), store)
        else:
            inspect(opts(vol))
    assert os.path.islink(marker)


# ---------------------------------------------------------------------------
# Broke 6: FIFOs


@pytest.mark.parametrize("action", ["harvest", "deploy", "inspect"])
def test_a_fifo_marker_fails_at_once_naming_it(tmp_path, store, action):
    vol = user_volume(tmp_path / "vol")
    warm_cache(vol)
    marker = marker_path(str(vol), KEY)
    os.mkfifo(marker)
    with pytest.raises(KernelError) as info:
        if action == "harvest":
            harvest(opts(vol, warmed=True, force=True), store)
        elif action == "deploy":
            deploy(opts(vol), store)
        else:
            inspect(opts(vol))
    assert f"{marker} is a fifo, not a regular file" in str(info.value)
    assert "remove it" in str(info.value)


@pytest.mark.parametrize("name", ["manifest.json", "kernels.tar.zst.sha256", "kernels.tar.zst"])
def test_a_fifo_in_a_path_store_entry_fails_at_once_naming_it(tmp_path, store, name):
    path = os.path.join(store.entry_dir(KEY), name)
    os.unlink(path)
    os.mkfifo(path)
    with pytest.raises(KernelError) as info:
        deploy(opts(tmp_path / "b"), store)
    assert f"{path} is a fifo, not a regular file" in str(info.value)
    assert "harvest again" in str(info.value)
    assert not os.path.exists(cache_path(str(tmp_path / "b"), KEY))


def test_a_link_in_a_path_store_entry_is_not_followed(tmp_path, store, victim):
    path = os.path.join(store.entry_dir(KEY), "manifest.json")
    os.unlink(path)
    os.symlink(victim["file"], path)
    with pytest.raises(KernelError, match=r"manifest\.json is a symbolic link; it is not followed"):
        deploy(opts(tmp_path / "b"), store)


# ---------------------------------------------------------------------------
# The parent chain: tt_metal_cache and cache_<model>


def test_deploy_refuses_a_link_at_cache_model_to_a_root_dir(tmp_path, victim, store):
    vol = user_volume(tmp_path / "vol")
    tmc = vol / "tt_metal_cache"
    tmc.mkdir()
    os.chown(tmc, USER, USER)
    os.symlink(victim["dir"], tmc / "cache_Qwen3-32B")
    os.lchown(tmc / "cache_Qwen3-32B", USER, USER)
    for action in (deploy, inspect):
        with pytest.raises(KernelError) as info:
            action(opts(vol, force=True), store) if action is deploy else action(opts(vol))
        assert f"{tmc}/cache_Qwen3-32B is a symbolic link in a directory that a non-root user can write" in str(
            info.value
        )
        assert f"Fix: make {tmc}/cache_Qwen3-32B a real directory" in str(info.value)
    assert os.path.islink(tmc / "cache_Qwen3-32B")


def test_deploy_refuses_a_link_at_tt_metal_cache(tmp_path, victim, store):
    vol = user_volume(tmp_path / "vol")
    os.symlink(victim["dir"], vol / "tt_metal_cache")
    os.lchown(vol / "tt_metal_cache", USER, USER)
    with pytest.raises(KernelError, match=r"tt_metal_cache is a symbolic link in a directory that a non-root user"):
        deploy(opts(vol, force=True), store)
    assert os.path.islink(vol / "tt_metal_cache")


def test_harvest_refuses_a_cache_reached_through_a_link(tmp_path, store, victim):
    # A complete cache laid out in a directory of root's, and uid 1000 linking tt_metal_cache to it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    warm_cache(elsewhere)
    vol = user_volume(tmp_path / "vol")
    os.symlink(elsewhere / "tt_metal_cache", vol / "tt_metal_cache")
    os.lchown(vol / "tt_metal_cache", USER, USER)
    other = PathStore(str(tmp_path / "other-store"))
    with pytest.raises(KernelError, match="tt_metal_cache is a symbolic link"):
        harvest(opts(vol, warmed=True), other)
    assert not os.path.exists(other.root)


def test_a_link_at_the_cache_itself_is_refused(tmp_path, store, victim):
    vol = user_volume(tmp_path / "vol")
    parent = os.path.dirname(cache_path(str(vol), KEY))
    os.makedirs(parent)
    give(os.path.join(vol, "tt_metal_cache"))
    os.symlink(victim["dir"], os.path.join(parent, "P300x2"))
    with pytest.raises(KernelError, match=r"exists but is not a directory; move it away .*it is a symlink"):
        deploy(opts(vol, force=True), store)
    with pytest.raises(KernelError, match=r"exists but is not a directory; move it away .*it is a symlink"):
        harvest(opts(vol, warmed=True, force=True), store)


def test_a_root_owned_volume_root_may_alias_the_volume(tmp_path, store):
    """The volume itself may be a link in a root-only directory (a volume alias): that one is followed."""
    root = tmp_path / "volumes"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    real = user_volume(root / "volume_id_real")
    os.symlink("volume_id_real", root / "alias")
    got = deploy(opts(root / "alias"), store)
    assert got["changed"] and os.path.isdir(cache_path(str(real), KEY))


# ---------------------------------------------------------------------------
# Harvest reads only the cache's own regular files


def test_a_link_inside_the_cache_is_never_packed(tmp_path, victim):
    vol = user_volume(tmp_path / "vol")
    root, _files = warm_cache(vol)
    os.symlink(victim["file"], os.path.join(root, "kernels", "leak.bin"))
    os.lchown(os.path.join(root, "kernels", "leak.bin"), USER, USER)
    age(root)
    store = PathStore(str(tmp_path / "store"))
    with pytest.raises(KernelError, match=r"neither files nor directories: kernels/leak\.bin"):
        harvest(opts(vol, warmed=True), store)
    assert not os.path.exists(store.entry_dir(KEY))


def test_a_file_swapped_for_a_link_while_packing_is_refused(tmp_path, victim):
    vol = user_volume(tmp_path / "vol")
    root, _files = warm_cache(vol)
    out = tmp_path / "out.tar.zst"
    with opened_dir(root) as fd:
        scan = scan_cache(fd)
        # The race uid 1000 runs: between the scan and the pack, a scanned file becomes a link to the victim.
        target = os.path.join(root, "tensor_cache", "w.tensorbin")
        os.unlink(target)
        os.symlink(victim["file"], target)
        out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with pytest.raises(KernelError, match=r"w\.tensorbin is a symbolic link; it is not followed"):
                pack(fd, scan, out_fd, shutil.which("zstd"), 1, where=root)
        finally:
            os.close(out_fd)
    assert VICTIM_SECRET not in pathlib_bytes(out)


def test_a_fifo_swapped_in_while_packing_is_refused_at_once(tmp_path):
    vol = user_volume(tmp_path / "vol")
    root, _files = warm_cache(vol)
    with opened_dir(root) as fd:
        scan = scan_cache(fd)
        target = os.path.join(root, "kernels", "a", "brisc.elf")
        os.unlink(target)
        os.mkfifo(target)
        out_fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with pytest.raises(KernelError, match=r"brisc\.elf is a fifo, not a regular file"):
                pack(fd, scan, out_fd, shutil.which("zstd"), 1, where=root)
        finally:
            os.close(out_fd)


def test_a_hard_link_to_a_file_of_another_owner_is_not_packed(tmp_path, victim):
    vol = user_volume(tmp_path / "vol")
    root, _files = warm_cache(vol)
    # Where fs.protected_hardlinks is off, uid 1000 can link a root-only file into its cache.
    os.link(victim["file"], os.path.join(root, "kernels", "hard.bin"))
    age(root)
    store = PathStore(str(tmp_path / "store"))
    with pytest.raises(KernelError, match=r"hard\.bin is a hard link to a file owned by uid 0"):
        harvest(opts(vol, warmed=True), store)
    os.unlink(os.path.join(root, "kernels", "hard.bin"))
    assert not os.path.exists(os.path.join(store.entry_dir(KEY), "manifest.json"))


# ---------------------------------------------------------------------------
# Deploy: staging, leftovers, ownership


def test_deploy_gives_the_cache_to_the_container_uid_not_the_volume(tmp_path, store):
    vol = tmp_path / "fresh"
    got = deploy(opts(vol), store)
    assert got["changed"]
    assert os.stat(vol).st_uid == 0
    parent = os.path.dirname(cache_path(str(vol), KEY))
    for path in (os.path.join(vol, "tt_metal_cache"), parent, marker_path(str(vol), KEY)):
        assert os.stat(path).st_uid == USER, path
    for dirpath, dirnames, filenames in os.walk(cache_path(str(vol), KEY)):
        for name in [*dirnames, *filenames, ""]:
            st = os.lstat(os.path.join(dirpath, name))
            assert (st.st_uid, st.st_gid) == (USER, USER)
            assert stat.S_IMODE(st.st_mode) in (0o644, 0o755)
    assert sorted(os.listdir(parent)) == [".ttfleet-kernels-P300x2.json", "P300x2"]


def test_leftover_staging_links_are_removed_not_followed(tmp_path, store, victim):
    vol = user_volume(tmp_path / "vol")
    parent = os.path.dirname(cache_path(str(vol), KEY))
    os.makedirs(parent)
    give(os.path.join(vol, "tt_metal_cache"))
    for name in (".ttfleet-tmp-P300x2-1-2", ".ttfleet-tmp-P300x2-dir"):
        os.symlink(victim["dir"], os.path.join(parent, name))
    os.makedirs(os.path.join(parent, ".ttfleet-tmp-P300x2-tree", "sub"))
    os.symlink(victim["file"], os.path.join(parent, ".ttfleet-tmp-P300x2-tree", "sub", "f"))
    assert deploy(opts(vol), store)["changed"]
    assert sorted(os.listdir(parent)) == [".ttfleet-kernels-P300x2.json", "P300x2"]


def test_a_staging_directory_swapped_while_unpacking_is_not_put_in_place(tmp_path, store, monkeypatch):
    vol = user_volume(tmp_path / "vol")
    parent = os.path.dirname(cache_path(str(vol), KEY))
    real_unpack = unpack

    def racing_unpack(source, staging_fd, *args, **kwargs):
        got = real_unpack(source, staging_fd, *args, **kwargs)
        # uid 1000 owns the parent: it renames the staging directory away and puts its own in its place.
        (name,) = [n for n in os.listdir(parent) if n.startswith(".ttfleet-tmp-P300x2-")]
        os.rename(os.path.join(parent, name), os.path.join(parent, "moved"))
        os.mkdir(os.path.join(parent, name))
        return got

    monkeypatch.setattr(deploy_module, "unpack", racing_unpack)
    with pytest.raises(KernelError, match="was replaced while the cache was unpacked into it"):
        deploy(opts(vol), store)
    assert not os.path.exists(cache_path(str(vol), KEY))


def test_unpack_creates_nothing_through_a_planted_link(tmp_path, victim):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name in ("d/", "d/f"):
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"new"))
    packed = subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True).stdout
    staging = tmp_path / "staging"
    staging.mkdir()
    # A link where the archive's directory goes: makedirs must refuse it, not write into the victim directory.
    os.symlink(victim["dir"], staging / "d")
    with pytest.raises(SafeFileError, match="is a symlink, not a directory"), opened_dir(str(staging)) as fd:
        unpack(io.BytesIO(packed), fd, shutil.which("zstd"), 100, owner=(USER, USER))


# ---------------------------------------------------------------------------
# The http store behind the peer server's path token


TOKEN = secrets.token_hex(16)


def test_deploy_from_a_store_under_a_path_token(tmp_path):
    src = user_volume(tmp_path / "src")
    _root, files = warm_cache(src)
    served = tmp_path / "served"
    store = PathStore(str(served / TOKEN))
    harvest(opts(src, warmed=True), store)
    with serve_directory(served) as server:
        port = server.server_address[1]
        got = deploy(opts(tmp_path / "b", required=True), HttpStore(f"http://127.0.0.1:{port}/{TOKEN}/"))
        assert got["changed"] and tree(cache_path(str(tmp_path / "b"), KEY)) == files
        assert TOKEN not in json.dumps(got)
        marker = json.loads(pathlib_bytes(marker_path(str(tmp_path / "b"), KEY)))
        assert marker["source"].startswith(f"store http://127.0.0.1:{port}/<base path>/Qwen3-32B/")
        assert TOKEN not in json.dumps(marker)
        # Without the token the store holds nothing.
        missing = deploy(opts(tmp_path / "c"), HttpStore(f"http://127.0.0.1:{port}/"))
        assert missing["missing"] and not missing["changed"]
        with pytest.raises(KernelError) as info:
            deploy(opts(tmp_path / "d", required=True), HttpStore(f"http://127.0.0.1:{port}/{'0' * 32}/"))
        assert "0" * 32 not in str(info.value)
