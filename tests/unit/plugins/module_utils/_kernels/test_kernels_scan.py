"""kernel_cache: scanning a cache and its completeness (_kernels.scan) on real files."""

import os
import shutil

import pytest
from unit_helpers import OLD, warm_cache

from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.scan import completeness_problems, scan_cache

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


@pytest.mark.parametrize(
    "name,expected",
    [("x.tmp", "in-progress"), ("y.lock", "in-progress"), (".ttfleet-tmp-1", "in-progress"), ("z.bin", None)],
)
def test_temporary_files_make_a_cache_incomplete(tmp_path, name, expected):
    root, _files = warm_cache(tmp_path / "vol")
    with open(os.path.join(root, "kernels", name), "wb") as handle:
        handle.write(b"x")
    os.utime(os.path.join(root, "kernels", name), (OLD, OLD))
    problems = completeness_problems(scan_cache(root), root)
    assert (expected in " ".join(problems)) if expected else problems == []


def test_empty_recent_and_special_caches_are_incomplete(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no data" in completeness_problems(scan_cache(str(empty)), "e")[0]
    root, _files = warm_cache(tmp_path / "vol")
    os.symlink("/etc/passwd", os.path.join(root, "link"))
    assert any("neither files nor directories: link" in p for p in completeness_problems(scan_cache(root), "r"))
    os.unlink(os.path.join(root, "link"))
    fresh = os.path.join(root, "kernels", "new.elf")
    with open(fresh, "wb") as handle:
        handle.write(b"new")
    assert any("quiet_seconds=120" in p for p in completeness_problems(scan_cache(root), "r", 120))
    assert completeness_problems(scan_cache(str(tmp_path / "nope")), "n") == ["n does not exist"]
