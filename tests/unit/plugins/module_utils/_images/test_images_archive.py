# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Image archives on the host: the levels a non-root user could change, and pins by image ID or sha256."""

from __future__ import annotations

import os

import pytest
from images_helpers import CONFIG, digest_of, save_tar

from ansible_collections.ttfleet.inference.plugins.module_utils._images.archive import (
    archive_writers,
    check_archive_pin,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError, parse_reference

# --- image archives: root's trees or a pin -------------------------------------------------------------------------

REF = parse_reference("reg.example:5000/tt/x:1.0")


def test_an_archive_in_a_tree_others_can_write_names_each_level(tmp_path):
    archive = tmp_path / "x.tar"
    archive.write_bytes(b"t")
    os.chmod(tmp_path, 0o777)
    with open(archive, "rb") as handle:
        found = archive_writers(handle.fileno())
    assert f"{tmp_path} (owner {'root' if os.geteuid() == 0 else f'uid {os.geteuid()}'}, mode 0777" in "; ".join(found)


def test_a_root_file_in_roots_tree_has_no_writers():
    st = os.stat("/etc/passwd")
    if st.st_uid != 0 or st.st_mode & 0o022 or os.stat("/etc").st_mode & 0o022:
        pytest.skip("/etc/passwd is not root's alone here")
    with open("/etc/passwd", "rb") as handle:
        assert archive_writers(handle.fileno()) == []


def test_an_archive_pinned_by_its_image_id_or_its_own_sha256_passes(tmp_path):
    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, [str(REF)])
    with open(archive, "rb") as handle:
        assert check_archive_pin(handle, image_id, REF, str(archive), "pin") == image_id
        whole = digest_of(archive.read_bytes())
        assert check_archive_pin(handle, whole, REF, str(archive), "pin") == image_id
        assert handle.tell() == 0


def test_a_swapped_archive_names_both_digests_and_the_pin(tmp_path):
    archive = tmp_path / "x.tar"
    pin = save_tar(archive, [str(REF)])
    save_tar(archive, [str(REF)], config=CONFIG.replace(b"amd64", b"arm64"))
    with open(archive, "rb") as handle, pytest.raises(ImageError) as caught:
        check_archive_pin(handle, pin, REF, str(archive), "archive_sha256")
    message = str(caught.value)
    assert f"the archive {archive} of {REF} is not the pinned one (archive_sha256 {pin})" in message
    assert digest_of(archive.read_bytes()) in message and digest_of(CONFIG.replace(b"amd64", b"arm64")) in message


def test_an_image_id_pin_does_not_cover_other_tags_in_the_archive(tmp_path):
    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, [str(REF), "ghcr.io/tenstorrent/other:1"])
    with (
        open(archive, "rb") as handle,
        pytest.raises(ImageError, match=r"also holds ghcr\.io/tenstorrent/other:1"),
    ):
        check_archive_pin(handle, image_id, REF, str(archive), "pin")
