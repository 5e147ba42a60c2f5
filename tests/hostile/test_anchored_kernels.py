"""Issue 29 cases 1 and 2 for kernel caches: the holders of a fan-out round are proven by the archive's sha256 fixed
at the origin (kernel_cache ``expected_sha256``, carried by the plan), never by their own manifest or sha256 file; and
a spliced archive that fails blames the holder whose bytes were wrong, never the honest one that sent the rest.

Holders are hostile servers on 127.0.0.1 with the layout of a kernel peer's spool, serving real entries harvested
from real caches (test_kernel_store.harvest_entry): the origin's, and a second, different cache of the same key."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
from conftest import as_json, http_head, run_bounded, send
from test_kernel_store import (  # the real store entry and the holder scripts of the kernel-store suite
    KEY,
    TOKEN,
    harvest_entry,
    http_store,
    module_args,
    module_code,
    nothing_in_place,
    opts,
    ranged,
    store_script,
)

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.deploy import deploy_from_any
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import (
    ARCHIVE_NAME,
    MANIFEST_NAME,
    KernelError,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.path_store import PathStore

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    """The origin's entry: a real cache harvested into a real store."""
    files = {"kernels/a/brisc.elf": os.urandom(4096), "tensor_cache/w.tensorbin": os.urandom(70000)}
    return harvest_entry(tmp_path_factory.mktemp("entry"), files)


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    """Another archive of the same key, harvested from other files: manifest, sha256 file and archive all agree."""
    files = {"kernels/a/brisc.elf": b"\x7fELF planted by the holder" + os.urandom(4096)}
    return harvest_entry(tmp_path_factory.mktemp("forged"), files)


def whole(data):
    def archive(conn, req, srv):
        send(conn, http_head(200, length=len(data)) + data)

    return archive


def dies_after(data, cut, size):
    """Sends ``data[:cut]`` of an archive of ``size`` bytes and closes the connection."""

    def archive(conn, req, srv):
        send(conn, http_head(200, length=size) + data[:cut])
        conn.close()

    return archive


def shown(server):
    return f"{server.url}/<base path>/"


# ---------------------------------------------------------------------------
# Case 1: a holder with another archive and a manifest and sha256 file to match


@pytest.mark.broke29(1)
def test_a_holder_with_another_archive_and_a_matching_manifest_is_refused_and_named(hostile, tmp_path, entry, forged):
    assert forged["manifest"]["sha256"] != entry["manifest"]["sha256"]
    liar = hostile(store_script(forged, whole(forged[ARCHIVE_NAME])))
    honest = hostile(store_script(entry, whole(entry[ARCHIVE_NAME])))
    kept = PathStore(str(tmp_path / "spool"))
    pinned = entry["manifest"]["sha256"]
    got = deploy_from_any(
        opts(tmp_path / "volume", keep_store_path=kept.root, expected_sha256=pinned),
        [http_store(liar), http_store(honest)],
    )
    assert got["sha256"] == pinned and got["store"].startswith(shown(honest))
    # The liar is named, before a byte of its archive was asked for.
    assert len(got["store_failures"]) == 1 and got["store_failures"][0].startswith(shown(liar) + ": ")
    assert f"not {pinned}" in got["store_failures"][0] and "expected_sha256" in got["store_failures"][0]
    assert not any(req.path.endswith(ARCHIVE_NAME) for req in liar.requests)
    assert TOKEN not in json.dumps(got)
    # The copy kept for the next round is the origin's archive.
    assert pathlib.Path(got["kept"], ARCHIVE_NAME).read_bytes() == entry[ARCHIVE_NAME]


@pytest.mark.broke29(1)
def test_a_lone_holder_with_another_archive_deploys_and_keeps_nothing(hostile, tmp_path, entry, forged):
    liar = hostile(store_script(forged, whole(forged[ARCHIVE_NAME])))
    kept = PathStore(str(tmp_path / "spool"))
    pinned = entry["manifest"]["sha256"]
    with pytest.raises(KernelError, match="every store failed") as err:
        deploy_from_any(
            opts(tmp_path / "volume", keep_store_path=kept.root, expected_sha256=pinned), [http_store(liar)]
        )
    named = f"{shown(liar)}: its {MANIFEST_NAME} names the archive sha256 {forged['manifest']['sha256']}"
    assert named in str(err.value)
    nothing_in_place(tmp_path / "volume")
    assert not os.path.exists(kept.entry_dir(KEY)) or os.listdir(kept.entry_dir(KEY)) == []


@pytest.mark.broke29(1)
def test_the_module_refuses_a_store_whose_manifest_is_not_the_pinned_archive(hostile, tmp_path, entry, forged):
    liar = hostile(store_script(forged, whole(forged[ARCHIVE_NAME])))
    args = module_args(tmp_path / "v", f"{liar.url}/{TOKEN}/", expected_sha256=entry["manifest"]["sha256"])
    result = run_bounded(module_code("kernel_cache", args))
    out = as_json(result["out"])
    assert out.get("failed") and "Traceback" not in result["err"], result
    assert shown(liar) in out["msg"] and f"not {entry['manifest']['sha256']}" in out["msg"]
    assert TOKEN not in out["msg"]
    nothing_in_place(tmp_path / "v")


@pytest.mark.broke29(1)
def test_a_pin_that_is_not_a_sha256_is_refused_before_any_holder_is_asked(hostile, tmp_path, entry):
    honest = hostile(store_script(entry, whole(entry[ARCHIVE_NAME])))
    with pytest.raises(KernelError, match="expected_sha256 '' of the kernel cache of Qwen3-32B is not a sha256"):
        deploy_from_any(opts(tmp_path / "volume", expected_sha256=""), [http_store(honest)])
    assert honest.requests == []


# ---------------------------------------------------------------------------
# Case 2: holder A claims the same archive, sends wrong bytes and dies; B, honest, sends the rest


def tampered(good):
    """``good`` with one byte changed a quarter in: inside the random file data (zstd stores it raw), so nothing
    fails before the archive's end, after the splice."""
    bad = bytearray(good)
    bad[len(bad) // 4] ^= 0xFF
    return bytes(bad)


@pytest.mark.broke29(2)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_a_holder_that_sends_wrong_bytes_and_dies_is_named_and_the_honest_one_serves(hostile, tmp_path, entry, pinned):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 2
    asked = []
    # A serves B's manifest and sha256 file (so its claim to hold the same archive holds) and wrong bytes.
    liar = hostile(store_script(entry, dies_after(tampered(good), cut, len(good))))
    honest = hostile(store_script(entry, ranged(good, asked)))
    kept = PathStore(str(tmp_path / "spool"))
    extra = {"expected_sha256": entry["manifest"]["sha256"]} if pinned else {}
    got = deploy_from_any(
        opts(tmp_path / "volume", keep_store_path=kept.root, **extra), [http_store(liar), http_store(honest)]
    )
    # The rest was asked of B with Range, the splice failed, and B was asked again for the whole archive.
    assert asked == [f"bytes={cut}-", None]
    assert got["sha256"] == entry["manifest"]["sha256"] and got["store"].startswith(shown(honest))
    assert pathlib.Path(got["kept"], ARCHIVE_NAME).read_bytes() == good
    # Only A is named, and as the holder whose bytes were wrong; nothing tells anyone to remove B's entry.
    assert got["store_failures"] and all(line.startswith(shown(liar) + ": ") for line in got["store_failures"])
    assert any(f"bytes 0 to {cut} it sent differ" in line for line in got["store_failures"])
    assert "Remove the store entry" not in json.dumps(got)


@pytest.mark.broke29(2)
def test_with_a_third_holder_the_honest_second_one_is_still_not_blamed(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 2
    asked, third_asked = [], []
    liar = hostile(store_script(entry, dies_after(tampered(good), cut, len(good))))
    honest = hostile(store_script(entry, ranged(good, asked)))
    third = hostile(store_script(entry, ranged(good, third_asked)))
    got = deploy_from_any(
        opts(tmp_path / "volume", expected_sha256=entry["manifest"]["sha256"]),
        [http_store(liar), http_store(honest), http_store(third)],
    )
    assert got["store"].startswith(shown(honest)) and third_asked == []
    assert not any(line.startswith(shown(honest)) for line in got["store_failures"])


@pytest.mark.broke29(2)
def test_a_holder_whose_ranged_answer_is_wrong_is_the_one_named(hostile, tmp_path, entry):
    good = entry[ARCHIVE_NAME]
    cut = len(good) // 4
    asked = []

    def lies_in_ranges(conn, req, srv):
        # The whole archive when asked for it, a wrong rest when asked for a range: the first holder would be blamed
        # if a spliced failure were laid on the holders before.
        wanted = req.header("Range")
        asked.append(wanted)
        if not wanted:
            send(conn, http_head(200, length=len(good)) + good)
            return
        rest = tampered(good)[cut:]
        head = {"Content-Range": f"bytes {cut}-{len(good) - 1}/{len(good)}"}
        send(conn, http_head(206, head, len(rest)) + rest)

    dying = hostile(store_script(entry, dies_after(good, cut, len(good))))
    liar = hostile(store_script(entry, lies_in_ranges))
    got = deploy_from_any(
        opts(tmp_path / "volume", expected_sha256=entry["manifest"]["sha256"]), [http_store(dying), http_store(liar)]
    )
    assert asked == [f"bytes={cut}-", None] and got["sha256"] == entry["manifest"]["sha256"]
    verdicts = [line for line in got["store_failures"] if "it sent differ" in line]
    assert len(verdicts) == 1 and verdicts[0].startswith(f"{shown(liar)}: bytes {cut} to {len(good)} it sent differ")
