"""Kernel-cache deploys (plugins/module_utils/_kernels/, the kernel_cache module) from hostile kernel stores on
127.0.0.1: a peer's http store and an S3 store that send more than the manifest's archive_bytes, drip, stall, redirect,
or do not speak HTTP; and the warm-up health check of a harvest."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import time

import pytest
from conftest import SLACK, as_json, baseline_rss_mib, dir_bytes, drip, endless, http_head, long_head, run_bounded, send

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy, deploy_from_any
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.harvest import check_health, harvest
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    MANIFEST_NAME,
    SHA_NAME,
    KernelError,
    cache_parent,
    cache_path,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.s3_store import S3Store
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_JSON_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.s3.client import S3Client

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")

KEY = {
    "model_name": "Qwen3-32B",
    "mesh": "P300x2",
    "impl_id": "tt_transformers",
    "tt_metal_commit": "8c48a10",
    "vllm_commit": "f52987a",
}
TOKEN = "5f" * 16  # a peer's path token
OLD = 1_000_000_000


def opts(volume, **extra):
    base = dict(KEY, volume=str(volume), host="lab", owner=os.getuid(), group=os.getgid(), required=True)
    base.update(extra)
    return base


def harvest_entry(base, files):
    """A real store entry (manifest, sha, archive) harvested under ``base`` from a cache of ``files`` (name: bytes)."""
    root = base / "src" / "tt_metal_cache" / f"cache_{KEY['model_name']}" / KEY["mesh"]
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (OLD, OLD))
    os.utime(root, (OLD, OLD))
    store = PathStore(str(base / "store"))
    harvest(opts(base / "src", warmed=True, quiet_seconds=0), store)
    where = store.entry_dir(KEY)
    entry = {name: pathlib.Path(where, name).read_bytes() for name in (MANIFEST_NAME, SHA_NAME, ARCHIVE_NAME)}
    entry["manifest"] = json.loads(entry[MANIFEST_NAME])
    return entry


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    """A real store entry (manifest, sha, archive) harvested from a real cache."""
    files = {"kernels/a/brisc.elf": os.urandom(4096), "tensor_cache/w.tensorbin": os.urandom(70000)}
    return harvest_entry(tmp_path_factory.mktemp("entry"), files)


def store_script(entry, archive):
    """A store (http or S3, path-style) serving the entry's small files and handing the archive to ``archive``."""

    def script(conn, req, srv):
        if req is None:
            return
        path = req.path.split("?", 1)[0]
        for name in (SHA_NAME, MANIFEST_NAME):
            if path.endswith("/" + name):
                data = entry[name]
                send(conn, http_head(200, {"ETag": '"x"'}, len(data)) + (b"" if req.method == "HEAD" else data))
                return
        if path.endswith("/" + ARCHIVE_NAME):
            archive(conn, req, srv)
        else:
            send(conn, http_head(404, length=0))

    return script


def http_store(server, **kwargs):
    return HttpStore(f"{server.url}/{TOKEN}/", **kwargs)


def s3_store(server, **kwargs):
    return S3Store(S3Client(server.url, "AK", "SK", **kwargs), "kernels", "caches")


STORES = {"http": http_store, "s3": s3_store}


def nothing_in_place(volume):
    """No cache, no staging directory, no marker, no byte left in the volume."""
    assert not os.path.exists(cache_path(str(volume), KEY))
    parent = cache_parent(str(volume), KEY)
    assert not os.path.isdir(parent) or os.listdir(parent) == []
    assert dir_bytes(str(volume)) == 0


# ---------------------------------------------------------------------------
# Bytes: exactly archive_bytes, never one more


@pytest.mark.parametrize("kind", sorted(STORES))
def test_an_archive_running_past_archive_bytes_is_refused_before_unpacking_more(hostile, tmp_path, entry, kind):
    def archive(conn, req, srv):
        send(conn, http_head(200) + entry[ARCHIVE_NAME])
        endless(conn, stop=srv.stop)

    server = hostile(store_script(entry, archive))
    start = time.monotonic()
    with pytest.raises(KernelError, match=f"runs past the {entry['manifest']['archive_bytes']} bytes") as err:
        deploy(opts(tmp_path / "volume"), STORES[kind](server))
    assert time.monotonic() - start < 10
    assert "nothing was put in place" in str(err.value) and TOKEN not in str(err.value)
    nothing_in_place(tmp_path / "volume")


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_declared_archive_length_other_than_archive_bytes_is_refused_before_reading(hostile, tmp_path, entry, kind):
    def archive(conn, req, srv):
        send(conn, http_head(200, length=1 << 40))
        endless(conn, stop=srv.stop)

    server = hostile(store_script(entry, archive))
    with pytest.raises(KernelError, match="1099511627776 bytes"):
        deploy(opts(tmp_path / "volume"), STORES[kind](server))
    nothing_in_place(tmp_path / "volume")


def test_the_manifest_sha256_decides_whatever_the_etag_says(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF

    def archive(conn, req, srv):
        etag = hashlib.md5(good).hexdigest()
        send(conn, http_head(200, {"ETag": f'"{etag}"'}, len(bad)) + bytes(bad))

    server = hostile(store_script(entry, archive))
    with pytest.raises(KernelError, match=r"(does not match its manifest|not a readable tar\.zst|zstd)"):
        deploy(opts(tmp_path / "volume"), s3_store(server))
    nothing_in_place(tmp_path / "volume")


# ---------------------------------------------------------------------------
# The holders of a fan-out round (deploy_from_any): one that dies mid-archive hands over to the next


def test_a_holder_that_dies_mid_archive_hands_over_to_the_next_and_keeps_only_a_verified_copy(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]

    def half(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good[: len(good) // 2])
        conn.close()

    def whole(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good)

    dying, serving = hostile(store_script(entry, half)), hostile(store_script(entry, whole))
    kept = PathStore(str(tmp_path / "spool"))
    got = deploy_from_any(
        opts(tmp_path / "volume", keep_store_path=kept.root), [http_store(dying), http_store(serving)]
    )
    assert got["changed"] and got["sha256"] == entry["manifest"]["sha256"]
    assert len(got["store_failures"]) == 1 and got["store_failures"][0].startswith(f"{dying.url}/<base path>/: ")
    assert TOKEN not in json.dumps(got)
    assert pathlib.Path(got["kept"], ARCHIVE_NAME).read_bytes() == good
    assert sorted(os.listdir(got["kept"])) == sorted([ARCHIVE_NAME, SHA_NAME, MANIFEST_NAME])
    # In place: the cache and its marker, no staging directory of the failed try.
    assert sorted(os.listdir(cache_parent(str(tmp_path / "volume"), KEY))) == [".ttfleet-kernels-P300x2.json", "P300x2"]


def test_when_every_holder_fails_the_error_names_each_and_nothing_is_kept(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]

    def half(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good[: len(good) // 2])
        conn.close()

    first, second = hostile(store_script(entry, half)), hostile(store_script(entry, half))
    kept = PathStore(str(tmp_path / "spool"))
    with pytest.raises(KernelError, match="every store failed for the kernel cache of Qwen3-32B \\(2 asked\\)") as err:
        deploy_from_any(opts(tmp_path / "volume", keep_store_path=kept.root), [http_store(first), http_store(second)])
    assert f"{first.url}/<base path>/" in str(err.value) and f"{second.url}/<base path>/" in str(err.value)
    assert TOKEN not in str(err.value)
    nothing_in_place(tmp_path / "volume")
    assert os.listdir(kept.entry_dir(KEY)) == []


def ranged(good, asked):
    """An archive handler that honours ``Range: bytes=N-`` (as weights_server does) and records what it was asked."""

    def archive(conn, req, srv):
        wanted = req.header("Range")
        asked.append(wanted)
        start = int(wanted[len("bytes=") : -1]) if wanted else 0
        if not start:
            send(conn, http_head(200, length=len(good)) + good)
            return
        head = {"Content-Range": f"bytes {start}-{len(good) - 1}/{len(good)}"}
        send(conn, http_head(206, head, len(good) - start) + good[start:])

    return archive


def test_the_next_holder_is_asked_only_for_the_bytes_the_dead_one_did_not_send(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 3
    asked = []

    def dies(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good[:cut])
        conn.close()

    dying, serving = hostile(store_script(entry, dies)), hostile(store_script(entry, ranged(good, asked)))
    kept = PathStore(str(tmp_path / "spool"))
    got = deploy_from_any(
        opts(tmp_path / "volume", keep_store_path=kept.root), [http_store(dying), http_store(serving)]
    )
    assert asked == [f"bytes={cut}-"]
    assert got["changed"] and got["sha256"] == entry["manifest"]["sha256"]
    assert got["store"].startswith(f"{serving.url}/<base path>/")
    assert len(got["store_failures"]) == 1 and f"at byte {cut} of {len(good)}" in got["store_failures"][0]
    assert TOKEN not in json.dumps(got)
    # The kept copy is the archive whole, spliced from both holders and verified.
    assert pathlib.Path(got["kept"], ARCHIVE_NAME).read_bytes() == good


def test_a_holder_of_another_archive_never_completes_a_resumed_transfer(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 2
    other_asked, asked = [], []

    def dies(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good[:cut])
        conn.close()

    other = dict(entry, **{SHA_NAME: ("ab" * 32 + "  kernels.tar.zst\n").encode()})
    dying = hostile(store_script(entry, dies))
    stranger = hostile(store_script(other, ranged(good, other_asked)))
    serving = hostile(store_script(entry, ranged(good, asked)))
    got = deploy_from_any(opts(tmp_path / "volume"), [http_store(dying), http_store(stranger), http_store(serving)])
    assert other_asked == [] and asked == [f"bytes={cut}-"]
    assert got["sha256"] == entry["manifest"]["sha256"]
    assert "holds another archive (sha256 " + "ab" * 32 in got["store_failures"][1]


def test_a_range_answered_with_the_wrong_part_is_refused(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 2

    def dies(conn, req, srv):
        send(conn, http_head(200, length=len(good)) + good[:cut])
        conn.close()

    def wrong_part(conn, req, srv):
        head = {"Content-Range": f"bytes 0-{len(good) - cut - 1}/{len(good)}"}
        send(conn, http_head(206, head, len(good) - cut) + good[: len(good) - cut])

    dying, liar = hostile(store_script(entry, dies)), hostile(store_script(entry, wrong_part))
    with pytest.raises(KernelError, match="every store failed") as err:
        deploy_from_any(opts(tmp_path / "volume"), [http_store(dying), http_store(liar)])
    assert f"answered the range from byte {cut} with Content-Range bytes 0-" in str(err.value)
    nothing_in_place(tmp_path / "volume")


# ---------------------------------------------------------------------------
# Time: the stall limit (the timeout option) and an overall limit on every request


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_dripped_archive_stops_at_the_deadline(hostile, tmp_path, entry, kind):
    def archive(conn, req, srv):
        send(conn, http_head(200, length=len(entry[ARCHIVE_NAME])))
        drip(conn, entry[ARCHIVE_NAME], stop=srv.stop)

    server = hostile(store_script(entry, archive))
    start = time.monotonic()
    with pytest.raises(KernelError, match="did not finish within its 3 s limit"):
        deploy(opts(tmp_path / "volume"), STORES[kind](server, timeout=2, total=3))
    assert time.monotonic() - start < 3 + SLACK
    nothing_in_place(tmp_path / "volume")


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_manifest_whose_headers_drip_stops_at_the_deadline(hostile, tmp_path, entry, kind):
    server = hostile(lambda conn, req, srv: drip(conn, long_head(200, length=10), stop=srv.stop))
    start = time.monotonic()
    with pytest.raises(KernelError, match="did not finish within its 3 s limit"):
        deploy(opts(tmp_path / "volume"), STORES[kind](server, timeout=2, total=3))
    assert time.monotonic() - start < 3 + SLACK


def module_code(name, args):
    """Python code that runs the collection's module ``name`` with ``args``, as Ansible would on a host."""
    return (
        "import contextlib, json\n"
        "try:\n"
        "    from ansible.module_utils.testing import patch_module_args\n"
        "except ImportError:\n"
        "    from ansible.module_utils import basic\n"
        "    @contextlib.contextmanager\n"
        "    def patch_module_args(args):\n"
        "        basic._ANSIBLE_ARGS = json.dumps({'ANSIBLE_MODULE_ARGS': args}).encode()\n"
        "        yield\n"
        f"from ansible_collections.ttfleet.inference.plugins.modules import {name}\n"
        f"with patch_module_args(json.loads({json.dumps(json.dumps(args))})):\n"
        f"    {name}.main()\n"
    )


def module_args(volume, store_url, **extra):
    args = dict(KEY, state="deployed", volume=str(volume), store="http", store_url=store_url)
    args.update(owner=os.getuid(), group=os.getgid(), host="lab", required=True, **extra)
    return args


def test_a_silent_store_fails_the_module_at_its_timeout_option(hostile, tmp_path):
    server = hostile(lambda conn, req, srv: srv.stop.wait(30))
    result = run_bounded(module_code("kernel_cache", module_args(tmp_path / "v", f"{server.url}/{TOKEN}/", timeout=1)))
    out = as_json(result["out"])
    assert out.get("failed") and "stalled" in out["msg"] and "Traceback" not in result["err"]
    # The 1 s stall limit, not the server's 30 s of silence.
    assert result["seconds"] < 1 + SLACK and TOKEN not in out["msg"]


# ---------------------------------------------------------------------------
# Memory: a manifest is capped


def test_a_256_mib_manifest_is_refused_with_little_memory(hostile):
    def script(conn, req, srv):
        send(conn, http_head(200) + b'{"kind": "')
        endless(conn, chunk=b"x" * 65536, stop=srv.stop, limit=256 << 20)

    server = hostile(script)
    baseline = baseline_rss_mib()
    code = (
        "from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError\n"
        "from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.http_store import HttpStore\n"
        f"key = {KEY!r}\n"
        "try:\n"
        f"    HttpStore({server.url + '/' + TOKEN + '/'!r}).read_manifest(key)\n"
        "except KernelError as exc:\n"
        "    print('refused:', exc)\n"
    )
    result = run_bounded(code)
    assert f"passed the {MAX_JSON_BYTES}-byte cap" in result["out"], result["err"][-2000:]
    assert result["peak_rss_mib"] - baseline < 96, result
    assert len(server.requests) == 1


# ---------------------------------------------------------------------------
# The token stays with the store: no redirect is followed


def test_a_redirect_to_the_catcher_is_not_followed(hostile, catcher, tmp_path):
    server = hostile(lambda conn, req, srv: send(conn, http_head(302, {"Location": f"{catcher.url}/{TOKEN}/x"}, 0)))
    store = HttpStore(f"http://peer:pw@127.0.0.1:{server.port}/{TOKEN}/")
    with pytest.raises(KernelError, match=r"answered HTTP 302, a redirect to http://127\.0\.0\.1:\d+") as err:
        deploy(opts(tmp_path / "volume"), store)
    assert "not followed" in str(err.value) and TOKEN not in str(err.value)
    time.sleep(0.2)
    assert catcher.requests == []
    # The basic credentials of the URL went to the store, and only there.
    assert server.requests[0].header("authorization") == "Basic cGVlcjpwdw=="
    assert server.requests[0].path.startswith(f"/{TOKEN}/")


def test_garbage_instead_of_http_names_the_store_and_not_its_token(hostile, tmp_path):
    server = hostile(lambda conn, req, srv: send(conn, b"SSH-2.0-OpenSSH_9.2\r\n\x1b]0;owned\x07\r\n"))
    result = run_bounded(module_code("kernel_cache", module_args(tmp_path / "v", f"{server.url}/{TOKEN}/", timeout=5)))
    out = as_json(result["out"])
    assert out.get("failed") and "Traceback" not in result["err"]
    assert f"{server.url}/<base path>/" in out["msg"] and "broke the HTTP protocol" in out["msg"]
    # (Only the message is checked: the invocation Ansible echoes at -vvv holds store_url as given.)
    assert TOKEN not in out["msg"] and TOKEN not in result["err"] and "\x1b" not in out["msg"]


# ---------------------------------------------------------------------------
# The warm-up health check of a harvest


def test_health_check_protocol_errors_are_reasons_not_crashes(hostile):
    garbage = hostile(lambda conn, req, srv: send(conn, b"not http\r\n\r\n"))
    assert "broke the HTTP protocol" in check_health(garbage.url + "/health", timeout=2)
    short = hostile(lambda conn, req, srv: send(conn, http_head(503, length=0)))
    assert check_health(short.url + "/health", timeout=2).endswith("answered HTTP 503")


def test_health_check_dripped_headers_stop_at_its_deadline(hostile):
    server = hostile(lambda conn, req, srv: drip(conn, long_head(200, length=0), stop=srv.stop))
    start = time.monotonic()
    why = check_health(server.url + "/health", timeout=2, total=3)
    assert why and "3 s limit" in why and time.monotonic() - start < 3 + SLACK


def test_health_check_credentials_stay_with_their_origin(hostile, catcher):
    server = hostile(lambda conn, req, srv: send(conn, http_head(302, {"Location": catcher.url + "/health"}, 0)))
    check_health(f"http://ops:s3cret@127.0.0.1:{server.port}/health", timeout=2)
    assert server.requests[0].header("authorization") == "Basic b3BzOnMzY3JldA=="
    assert catcher.requests and catcher.requests[0].header("authorization") is None
