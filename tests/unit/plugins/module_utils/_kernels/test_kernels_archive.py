"""kernel_cache: the tar.zst archives of _kernels.archive, with the real zstd program."""

import io
import shutil
import subprocess
import tarfile

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import opened_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.archive import unpack
from ansible_collections.ttfleet.inference.plugins.module_utils._kernels.keys import KernelError

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


def test_unsafe_members_are_refused(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    packed = subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True).stdout
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(KernelError, match=r"unsafe member name '\.\./escape'"), opened_dir(str(staging)) as fd:
        unpack(io.BytesIO(packed), fd, shutil.which("zstd"), 100)
    assert not (tmp_path / "escape").exists()
