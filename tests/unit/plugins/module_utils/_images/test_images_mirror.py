# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""image_mirror's logic (_images.mirror): credentials per registry, the copy between two registries."""

from __future__ import annotations

import json

import pytest
from images_helpers import CONFIG, LAYER, digest_of, manifest_of, registry

from ansible_collections.ttfleet.inference.plugins.module_utils._host.progress import Progress
from ansible_collections.ttfleet.inference.plugins.module_utils._images import mirror
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError


def test_image_mirror_binds_the_old_options_to_one_registry():

    params = {
        "registry_credentials": [],
        "source_registry": None,
        "source_username": "fleet",
        "source_password": "pw",
        "target_username": None,
        "target_password": None,
    }
    with pytest.raises(ImageError, match="never sent to every origin: give both with source_registry"):
        mirror.logins_of(params, {"site.example:5000"})
    params["source_registry"] = "ghcr.io"
    assert set(mirror.logins_of(params, {"site.example:5000"})) == {"ghcr.io"}
    params.update(target_username="push", target_password="pp")
    with pytest.raises(ImageError, match=r"the targets name a\.example:5000, b\.example:5000"):
        mirror.logins_of(params, {"a.example:5000", "b.example:5000"})
    assert mirror.logins_of(params, {"a.example:5000"})["a.example:5000"].auth == ("push", "pp")


def _params(source, target, tmp_path, **changes):
    params = {
        "images": [{"source": f"{source}/tt/x:1.0", "target": f"{target}/tt/x:1.0"}],
        "registry_credentials": [
            {"registry": source, "username": "reader", "password": "source-pw", "ca_cert": None},
            {"registry": target, "username": "pusher", "password": "target-pw", "ca_cert": None},
        ],
        "source_registry": None,
        "source_username": None,
        "source_password": None,
        "target_username": None,
        "target_password": None,
        "target_ca_cert": None,
        "upstream": {},
        "plain_http": [source, target],
        "certs_dir": str(tmp_path / "certs"),
        "timeout": 10,
        "status_file": str(tmp_path / "status.json"),
    }
    params.update(changes)
    return params


def test_a_copy_is_planned_in_check_mode_done_once_and_then_present(tmp_path):
    meters = []

    def meter(total):
        meters.append(Progress(total, str(tmp_path / "status.json")))
        return meters[-1]

    blobs = {digest_of(CONFIG): CONFIG, digest_of(LAYER): LAYER}
    with (
        registry(user="reader", password="source-pw", manifests={"1.0": manifest_of()}, blobs=blobs) as (origin, src),
        registry(user="pusher", password="target-pw") as (site, dst),
    ):
        params = _params(src, dst, tmp_path)
        target, size, digest = f"{dst}/tt/x:1.0", len(CONFIG) + len(LAYER), digest_of(manifest_of())
        planned = mirror.mirror_images(params, True, True, meter)
        assert planned["changed"] and not meters and site.manifests == {} and site.blobs == {}
        assert planned["images"] == [
            {
                "source": f"{src}/tt/x:1.0",
                "target": target,
                "digest": digest,
                "copied_bytes": size,
                "image_bytes": size,
                "blobs_copied": 2,
            }
        ]
        assert planned["origin_bytes"] == size
        assert planned["diff"] == {"before": f"{target}: absent\n", "after": f"{target}: {digest} (copy 3.0 KiB)\n"}

        copied = mirror.mirror_images(params, False, False, meter)
        assert copied["changed"] and copied["images"] == planned["images"] and "diff" not in copied
        assert site.manifests == {"1.0": manifest_of()} and site.blobs == blobs
        status = json.loads((tmp_path / "status.json").read_text())
        assert (status["state"], status["done_bytes"], status["total_bytes"]) == ("done", size, size)

        for check_mode in (True, False):
            again = mirror.mirror_images(params, check_mode, True, meter)
            assert not again["changed"] and again["origin_bytes"] == 0
            assert (again["images"][0]["copied_bytes"], again["images"][0]["blobs_copied"]) == (0, 0)
            assert again["diff"] == {"before": f"{target}: present\n", "after": f"{target}: {digest}\n"}
    # Each registry saw its own login only.
    assert {seen[2] for seen in origin.seen} <= {"", "Basic " + encode_auth("reader", "source-pw")}
    assert {seen[2] for seen in site.seen} <= {"", "Basic " + encode_auth("pusher", "target-pw")}


def test_a_target_without_a_tag_is_refused_before_any_request(tmp_path):
    params = _params("a.example:5000", "b.example:5000", tmp_path)
    params["images"] = [{"source": "a.example:5000/tt/x:1.0", "target": "b.example:5000/tt/x@sha256:" + "a" * 64}]
    with pytest.raises(ImageError, match="give the site registry's reference with a tag"):
        mirror.mirror_images(params, True, True, lambda total: None)
