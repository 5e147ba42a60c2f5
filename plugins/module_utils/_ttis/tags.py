# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Versions and image tags of tt-inference-server: the interface generation, the commits a CI tag names, and
``run.py --override-docker-image``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

# run.py refuses vLLM images older than this: their entrypoint (gosu, MODEL_WEIGHTS_PATH, no
# --model arguments) predates the interface change of TTIS v0.11.0.
MIN_CURRENT_INTERFACE_VERSION = (0, 11, 0)


_VERSION_PREFIX = re.compile(r"^(\d+(?:\.\d+){1,2})")
VLLM_RELEASE_REPO = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64"


# Versions


def parse_version_tuple(value: object) -> tuple[int, ...] | None:
    """Leading ``X.Y[.Z]`` of ``value`` as a 3-tuple (short forms padded), or None (``dev``, ``latest``)."""
    if not isinstance(value, str) or not value:
        return None
    match = _VERSION_PREFIX.match(value)
    if not match:
        return None
    numbers = [int(part) for part in match.group(1).split(".")]
    numbers += [0] * (3 - len(numbers))
    return tuple(numbers)


def parse_image_version(image: object) -> tuple[int, ...] | None:
    """Version prefix of a docker image tag (text after the last ``:``), or None."""
    if not isinstance(image, str) or ":" not in image:
        return None
    return parse_version_tuple(image.rsplit(":", 1)[1])


def is_legacy_interface(inference_engine: object, version: object) -> bool:
    """True for vLLM specs whose image predates the v0.11.0 interface (run.py refuses them).

    Media and forge images are not affected; an unparseable version counts as current.
    """
    if str(inference_engine).lower() != "vllm":
        return False
    parsed = parse_version_tuple(version)
    return parsed is not None and parsed < MIN_CURRENT_INTERFACE_VERSION


def check_image(value: object) -> str:
    """``value`` if it is one Docker image reference argument, else SpecError naming option image."""
    if not isinstance(value, str) or not value or value.startswith("-") or re.search(r"[\s\x00-\x1f\x7f]", value):
        raise SpecError(
            f"image {value!r} is not a Docker image reference; give repository:tag, for example "
            f"{VLLM_RELEASE_REPO}:0.20.0-de59f8a-03fa3af."
        )
    return value


_CI_IMAGE_TAG = re.compile(r"^([0-9.]+)-([0-9a-fA-F]{40})-([0-9a-fA-F]{7})-(\d+)$")


def image_commits(image: object) -> tuple[str | None, str | None]:
    """``(tt_metal_commit, vllm_commit)`` named by an image tag, as TTIS's parse_commits_from_docker_image reads them.

    Only the CI tag ``<version>-<tt-metal commit, 40 hex>-<7 hex>-<timestamp>`` names them; the third part of a
    media server image is not a vLLM commit. Any other tag gives ``(None, None)``.
    """
    if not isinstance(image, str) or ":" not in image:
        return None, None
    name, tag = image.rsplit(":", 1)
    match = _CI_IMAGE_TAG.match(tag)
    if not match:
        return None, None
    return match.group(2), None if "tt-media-inference-server" in name else match.group(3)


def override_image(spec: Mapping[str, Any], image: str | None) -> Mapping[str, Any]:
    """The spec as ``run.py --override-docker-image IMAGE`` makes it (``ModelSpec.apply_overrides``).

    The image replaces the spec's, with the commits its tag names; the version its tag starts with replaces the
    spec's (it names the host volume), while ``:dev`` or ``:latest`` keep the spec's.
    """
    if image is None:
        return spec
    check_image(image)
    spec = dict(spec)
    spec["docker_image"] = image
    spec["tt_metal_commit"], spec["vllm_commit"] = image_commits(image)
    parsed = parse_image_version(image)
    if parsed is not None:
        spec["version"] = ".".join(str(part) for part in parsed)
    return spec
