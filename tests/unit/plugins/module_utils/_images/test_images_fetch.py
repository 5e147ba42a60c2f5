# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""container_image's logic (_images.fetch): the plan, check mode, the result and the diff."""

from __future__ import annotations

import json

import pytest
from images_helpers import CONFIG, LAYER, manifest_of, registry, save_tar

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import free_bytes, human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._images import fetch
from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth
from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine, EngineAbsent
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError, parse_reference


def test_check_mode_on_a_host_without_its_engine_yet_counts_every_image_to_fetch(tmp_path):
    # A bare host under --check: tt_host would install the engine in the same run, so the plan is "fetch it all".

    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, ["reg.example:5000/tt/x:1.0"])
    item = {"image": "reg.example:5000/tt/x:1.0", "archive": str(archive), "archive_sha256": image_id}
    params = {"images": [item], "pull": True}
    warnings = []
    engine = Engine(str(tmp_path / "none.sock"))
    plan = fetch.plan(params, engine, True, warnings.append)
    size = archive.stat().st_size
    assert [(e["source"], e["size"], e["record"], e["expected_id"]) for e in plan] == [
        ("archive", size, None, image_id)
    ]
    assert len(warnings) == 1 and "no Docker engine answers" in warnings[0] and "check mode" in warnings[0]
    # A real run still fails with the fix named.
    with pytest.raises(EngineAbsent, match="install and start it"):
        fetch.plan(params, engine, False, warnings.append)


def test_check_mode_reports_each_image_to_fetch_with_its_source_and_bytes(tmp_path, monkeypatch):
    # No engine yet; one image from its archive, one whose size the registry tells, one the registry does not have.
    archive = tmp_path / "x.tar"
    image_id = save_tar(archive, ["reg.example:5000/tt/x:1.0"])
    with registry(manifests={"1.0": manifest_of()}) as (handler, address):
        config = tmp_path / "config.json"
        config.write_text(json.dumps({"auths": {address: {"auth": encode_auth("fleet", "right")}}}))
        real = fetch.Registry
        monkeypatch.setattr(fetch, "Registry", lambda *args, **kwargs: real(*args, plain_http=True, **kwargs))
        params = {
            "images": [
                {"image": "reg.example:5000/tt/x:1.0", "archive": str(archive), "archive_sha256": image_id},
                {"image": f"{address}/tt/x:1.0", "origin": "ghcr.io/tt/x:1.0"},
                {"image": f"{address}/tt/x:9.9"},
            ],
            "pull": True,
            "docker_socket": str(tmp_path / "none.sock"),
            "docker_config": str(config),
            "certs_dir": str(tmp_path / "certs"),
            "timeout": 10,
            "stall_timeout": 10,
        }
        warnings = []
        result = fetch.fetch_images(params, True, True, warnings.append, lambda total: pytest.fail("a meter in check"))
    size = len(CONFIG) + len(LAYER)
    assert [
        (i["image"], i["origin"], i["source"], i["id"], i["digest"], i["pinned"], i["bytes"]) for i in result["images"]
    ] == [
        (
            "reg.example:5000/tt/x:1.0",
            "reg.example:5000/tt/x:1.0",
            "archive",
            None,
            None,
            "reg.example:5000/tt/x:1.0",
            archive.stat().st_size,
        ),
        (f"{address}/tt/x:1.0", "ghcr.io/tt/x:1.0", "registry", None, None, f"{address}/tt/x:1.0", size),
        (f"{address}/tt/x:9.9", f"{address}/tt/x:9.9", "registry", None, None, f"{address}/tt/x:9.9", None),
    ]
    assert result["changed"] and result["bytes"] == archive.stat().st_size + size
    assert isinstance(result["seconds"], float)
    assert result["diff"]["before"] == (
        f"reg.example:5000/tt/x:1.0: absent\n{address}/tt/x:1.0: absent\n{address}/tt/x:9.9: absent\n"
    )
    assert result["diff"]["after"] == (
        f"reg.example:5000/tt/x:1.0: to fetch from archive ({human_bytes(archive.stat().st_size)})\n"
        f"{address}/tt/x:1.0: to fetch from registry (3.0 KiB)\n"
        f"{address}/tt/x:9.9: to fetch from registry (unknown size)\n"
    )
    assert len(warnings) == 2 and "has no image tt/x:9.9" in warnings[1] and "its size is unknown" in warnings[1]
    # The stored login went to the registry it belongs to.
    assert "Basic " + encode_auth("fleet", "right") in {seen[2] for seen in handler.seen}


def test_the_result_of_present_and_fetched_images():
    ref = parse_reference("reg.example:5000/tt/x:1.0")
    digest = "sha256:" + "2" * 64
    record = {"Id": "sha256:" + "1" * 64, "RepoDigests": [f"reg.example:5000/tt/x@{digest}"]}
    present = {"item": {"image": str(ref)}, "ref": ref, "record": record, "source": "present", "size": None}
    pulled = {**present, "source": "registry", "size": 500, "fetched": 400}
    images = fetch.result_images([present, pulled], False)
    assert images[0] == {
        "image": str(ref),
        "origin": str(ref),
        "source": "present",
        "id": record["Id"],
        "digest": digest,
        "pinned": f"{ref}@{digest}",
        "bytes": 0,
    }
    assert images[1]["bytes"] == 400 and fetch.result_images([pulled], True)[0]["bytes"] == 500
    assert fetch.diff(images, False) == {
        "before": f"{ref}: present\n{ref}: absent\n",
        "after": f"{ref}: present\n{ref}: fetched from registry (400 B)\n",
    }


def test_images_that_do_not_fit_are_refused_naming_them(tmp_path):
    class Full:
        def info(self):
            return {"DockerRootDir": str(tmp_path)}

    ref = parse_reference("reg.example:5000/tt/x:1.0")
    entries = [{"ref": ref, "source": "registry", "size": free_bytes(str(tmp_path))}]
    with pytest.raises(ImageError, match=rf"in {tmp_path} .* times 2\.5\) .* {ref} \("):
        fetch.preflight({"expansion": 2.5}, Full(), entries)
    fetch.preflight({"expansion": 2.5}, Full(), [{**entries[0], "source": "present"}])
