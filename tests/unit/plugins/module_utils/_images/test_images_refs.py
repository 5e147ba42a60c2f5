# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Image references and site registry mirrors, over every image of the real spec exports and the run.py v0.20.0
recorded commands (a mirror changes the argv's image and nothing else), digests of a repository and pins.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import (
    ImageError,
    check_pin,
    map_image,
    parse_reference,
    repo_digest,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import container as container_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import select as ttis_select

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
SPECS = os.path.join(FIXTURES, "specs")
RUNPY = os.path.join(FIXTURES, "runpy", "runpy-v0.20.0-docker-examples.json")
MIRROR = {"ghcr.io/tenstorrent": "registry.site.example:5000/tenstorrent"}


def _spec_images():
    found = set()
    for name in sorted(os.listdir(SPECS)):
        if name.startswith("release_model_spec-") and name.endswith(".json.gz"):
            catalog = ttis_catalog.load_spec_file(os.path.join(SPECS, name))
            for spec in ttis_catalog.iter_specs(catalog):
                if spec.get("docker_image"):
                    found.add(spec["docker_image"])
    return sorted(found)


SPEC_IMAGES = _spec_images()


def test_the_exports_name_images():
    assert len(SPEC_IMAGES) > 20
    assert all(image.startswith("ghcr.io/tenstorrent/") for image in SPEC_IMAGES)


@pytest.mark.parametrize("image", SPEC_IMAGES)
def test_every_spec_image_parses_and_maps_by_its_prefix_only(image):
    ref = parse_reference(image)
    assert ref.registry == "ghcr.io"
    assert str(ref) == image
    mapped, prefix = map_image(image, MIRROR)
    assert prefix == "ghcr.io/tenstorrent"
    assert mapped == "registry.site.example:5000/tenstorrent" + image[len("ghcr.io/tenstorrent") :]
    assert parse_reference(mapped).tag == ref.tag


@pytest.mark.parametrize(
    ("text", "registry", "path", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", None, None),
        ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("index.docker.io/x/y:1", "docker.io", "x/y", "1", None),
        ("localhost/a", "localhost", "a", None, None),
        ("localhost:5000/a/b:t", "localhost:5000", "a/b", "t", None),
        ("img-cache:5000/tenstorrent/x:1.0-rc", "img-cache:5000", "tenstorrent/x", "1.0-rc", None),
        ("ghcr.io/a/b@sha256:" + "a" * 64, "ghcr.io", "a/b", None, "sha256:" + "a" * 64),
        ("ghcr.io/a/b:t@sha256:" + "b" * 64, "ghcr.io", "a/b", "t", "sha256:" + "b" * 64),
    ],
)
def test_docker_reference_rules(text, registry, path, tag, digest):
    ref = parse_reference(text)
    assert (ref.registry, ref.path, ref.tag, ref.digest) == (registry, path, tag, digest)


@pytest.mark.parametrize(
    "text",
    ["", " ghcr.io/a", "ghcr.io/A/b", "ghcr.io/a/b:", "ghcr.io/a/b@sha256:12", "ghcr.io/a//b", "-x", "a b", None, 5],
)
def test_bad_references_are_refused_by_name(text):
    with pytest.raises(ImageError, match="image"):
        parse_reference(text)


def test_mapping_matches_whole_components_and_the_longest_prefix():
    mirrors = {"ghcr.io": "m.example:5000/ghcr", "ghcr.io/tenstorrent": "m.example:5000/tt"}
    assert map_image("ghcr.io/tenstorrent/x:1", mirrors) == ("m.example:5000/tt/x:1", "ghcr.io/tenstorrent")
    assert map_image("ghcr.io/tenstorrentx/y:1", mirrors) == (
        "m.example:5000/ghcr/tenstorrentx/y:1",
        "ghcr.io",
    )
    assert map_image("quay.io/a/b:1", mirrors) == ("quay.io/a/b:1", None)
    assert map_image("ghcr.io/tenstorrent/x:1", {}) == ("ghcr.io/tenstorrent/x:1", None)
    assert map_image("ghcr.io/tenstorrent/x:1", None) == ("ghcr.io/tenstorrent/x:1", None)
    assert map_image("ubuntu:22.04", {"docker.io": "m.example/hub"}) == (
        "m.example/hub/library/ubuntu:22.04",
        "docker.io",
    )
    digest = "sha256:" + "c" * 64
    assert map_image(f"ghcr.io/tenstorrent/x@{digest}", mirrors)[0] == f"m.example:5000/tt/x@{digest}"


@pytest.mark.parametrize(
    ("mirrors", "message"),
    [
        ({"https://ghcr.io/tenstorrent": "m.example/t"}, "without a scheme"),
        ({"ghcr.io/tenstorrent": "http://m.example/t"}, "without a scheme"),
        ({"tenstorrent": "m.example/t"}, "registry host"),
        ({"ghcr.io/tenstorrent": "mirror/t"}, "registry host"),
        ({"ghcr.io/Tenstorrent": "m.example/t"}, "repository path"),
        (["ghcr.io"], "mapping"),
    ],
)
def test_bad_mirrors_name_the_key_and_the_fix(mirrors, message):
    with pytest.raises(ImageError, match=message):
        map_image("ghcr.io/tenstorrent/x:1", mirrors)


def test_pinned_keeps_the_tag():
    ref = parse_reference("m.example:5000/tt/x:1")
    assert ref.pinned("sha256:" + "d" * 64) == "m.example:5000/tt/x:1@sha256:" + "d" * 64


# --- container_command: only the image changes -------------------------------------------------------------------


with open(RUNPY, encoding="utf-8") as _handle:
    RECORDED = json.load(_handle)["cases"]


@pytest.fixture(scope="module")
def v20():
    return ttis_catalog.load_spec_file(os.path.join(SPECS, "release_model_spec-v0.20.0.json.gz"))


@pytest.mark.parametrize("case", RECORDED, ids=[f"{c['model']}-{c['tt_device']}" for c in RECORDED])
def test_a_mirror_changes_the_image_of_the_argv_and_nothing_else(v20, case):
    spec = ttis_select.select_spec(v20, case["model"], case["tt_device"])
    plain = container_utils.container_command(spec, v20, volume_root="/srv/tt")
    mapped = container_utils.container_command(
        spec, v20, volume_root="/srv/tt", image_map=lambda image, what: map_image(image, MIRROR, what)
    )
    index = plain["argv"].index(plain["image"])
    assert mapped["argv"][:index] == plain["argv"][:index]
    assert mapped["argv"][index + 1 :] == plain["argv"][index + 1 :]
    assert mapped["argv"][index] == mapped["image"] == plain["image"].replace("ghcr.io/", "registry.site.example:5000/")
    assert mapped["image_origin"] == plain["image"] == plain["image_origin"]
    assert (mapped["image_mirror"], plain["image_mirror"]) == ("ghcr.io/tenstorrent", None)


def test_a_bad_mirror_is_an_image_error_naming_the_model(v20):
    spec = ttis_select.select_spec(v20, "Llama-3.2-1B-Instruct", "n150")
    mirrors = {"https://ghcr.io": "m.example/x"}

    def mapper(image, what):
        return map_image(image, mirrors, what)

    with pytest.raises(ImageError, match=r"tt_registry_mirrors key 'https://ghcr\.io'.*without a scheme"):
        container_utils.container_command(spec, v20, image_map=mapper)


def test_repo_digest_is_the_one_of_the_repository():
    ref = parse_reference("reg.example:5000/tt/x:1.0")
    record = {"RepoDigests": ["ghcr.io/tt/x@sha256:" + "1" * 64, "reg.example:5000/tt/x@sha256:" + "2" * 64]}
    assert repo_digest(record, ref) == "sha256:" + "2" * 64
    assert repo_digest({"RepoDigests": []}, ref) is None
    assert repo_digest(None, ref) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a" * 64, "sha256:" + "a" * 64), ("sha256:" + "B" * 64, "sha256:" + "b" * 64), ("sha256:abc", None), (3, None)],
)
def test_pins_take_hex_with_or_without_the_prefix(text, expected):
    if expected is None:
        with pytest.raises(ImageError, match="is not a sha256"):
            check_pin(text, "archive_sha256")
    else:
        assert check_pin(text, "archive_sha256") == expected
