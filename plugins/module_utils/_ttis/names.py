# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The names tt-inference-server (TTIS) derives from a spec, and the collection's own beside them: one rule each.

- the host volume ``volume_id_<impl_id>-<model_name>-v<version>`` (``run.py --host-volume``) and the Docker named
  volume ``volume_id_<impl_id>-<model_name>`` (no host volume), as ``SetupConfig`` of ``workflows/setup_host.py``
  names them (TTIS v0.11.0 and later), and the parser of both;
- the layout under a volume (``cache_root`` in the container): ``weights/<model_name>`` and
  ``tt_metal_cache/cache_<model_name>/<mesh>`` (``TT_CACHE_PATH``);
- the stable container name ``tt-<model_name>-<device>[-<port>]`` that stands in for run.py's random one;
- the name a directory gets when it is moved aside (``<name>.ttfleet-aside-<UTC stamp>``);
- where the serve role keeps an instance (``/etc/ttfleet/serve``, ``/var/lib/ttfleet/serve``) and its unit.

Volume reuse across upgrades depends on exactly these rules. Pure, standard library only.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]

CONTAINER_HOME = "/home/container_app_user"
CONTAINER_CACHE_ROOT = CONTAINER_HOME + "/cache_root"
VOLUME_PREFIX = "volume_id_"
ASIDE_INFIX = ".ttfleet-aside-"
# run.py's --service-port default; the container name carries any other port.
DEFAULT_PORT = 8000
# An instance's configuration and env file (root only), and its non-secret state that fleet_status reads.
SERVE_CONFIG_DIR = "/etc/ttfleet/serve"
SERVE_STATE_DIR = "/var/lib/ttfleet/serve"
# The summary of the last disk_prune run (the metrics read ttfleet_reclaimable_bytes from it).
PRUNE_REPORT = "/var/lib/ttfleet/prune/report.json"
# The tensor caches of a volume: ``tt_metal_cache/cache_<model_name>/<mesh>``.
TENSOR_CACHE_DIR = "tt_metal_cache"
TENSOR_CACHE_PREFIX = "cache_"

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?\Z")
_NAME_OK = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*\Z")
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]+")
_MAX_NAME = 128


# ---------------------------------------------------------------------------------------------
# Volumes


def volume_name(impl_id: str, model_name: str, version: str | int | float) -> str:
    """Host volume directory name used with ``--host-volume``."""
    return f"{named_volume(impl_id, model_name)}-v{version}"


def named_volume(impl_id: str, model_name: str) -> str:
    """Docker named volume used when no host volume is given (version independent)."""
    return f"{VOLUME_PREFIX}{impl_id}-{model_name}"


def version_key(text: object) -> tuple[int, int, int, int] | None:
    """Sort key for a model version pin (``0.17.0``), or None for anything else (a build label).

    A pre-release sorts below its release.
    """
    if not isinstance(text, str):
        return None
    match = _VERSION_RE.match(text)
    if not match:
        return None
    major, minor, patch, pre, _build = match.groups()
    return (int(major), int(minor), int(patch), 0 if pre else 1)


def split_suffix(suffix: str) -> tuple[str | None, str | None]:
    """Classify what follows ``-v`` in a volume name: ``(version, label)``."""
    if version_key(suffix) is not None:
        return suffix, None
    return None, suffix or None


def parse_volume_name(name: str) -> JSON:
    """Split ``volume_id_<impl_id>-<model_name>-v<version|label>``.

    impl_ids never contain a hyphen, so the first hyphen ends the impl_id.
    Model names may contain hyphens, dots and even ``-v`` (``Mistral-7B-Instruct-v0.3``),
    so the version or build label is what follows the last ``-v``. Returns a dict
    with impl_id, model_name, version, label (None where absent) and ``parsed``
    (False when the name does not have that structure). Use ``match_volume_name``
    when the model name is known: it is exact where this is a best guess.
    A directory that ``volume_alias`` renamed aside is parsed by its original
    name, which ``moved_aside_from`` holds (None for every other entry).
    """
    base, infix, _stamp = name.partition(ASIDE_INFIX)
    result: JSON = {
        "impl_id": None,
        "model_name": None,
        "version": None,
        "label": None,
        "parsed": False,
        "moved_aside_from": base if infix else None,
    }
    if not base.startswith(VOLUME_PREFIX):
        return result
    rest = base[len(VOLUME_PREFIX) :]
    impl_id, sep, tail = rest.partition("-")
    if not impl_id or not sep or not tail:
        return result
    model_name, sep, suffix = tail.rpartition("-v")
    if not sep:
        # Docker named volumes carry no version: volume_id_<impl_id>-<model_name>.
        model_name, suffix = tail, ""
    if not model_name or model_name in (".", "..") or (sep and not suffix):
        return result
    if not sep:
        result.update(impl_id=impl_id, model_name=model_name, parsed=True)
        return result
    version, label = split_suffix(suffix)
    result.update(impl_id=impl_id, model_name=model_name, version=version, label=label, parsed=True)
    return result


def match_volume_name(name: str, impl_id: str, model_name: str) -> tuple[str | None, str | None] | None:
    """Return ``(version, label)`` if ``name`` is a host volume of that impl and model, else None.

    Directories renamed aside by ``volume_alias`` never match: they were replaced on purpose.
    """
    prefix = volume_name(impl_id, model_name, "")
    if not name.startswith(prefix) or len(name) == len(prefix) or ASIDE_INFIX in name:
        return None
    return split_suffix(name[len(prefix) :])


def moved_aside_name(name: str, now: float | None = None) -> str:
    """``<name>.ttfleet-aside-<UTC stamp of now>``: where a directory replaced on purpose is moved, beside itself."""
    return f"{name}{ASIDE_INFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"


# ---------------------------------------------------------------------------------------------
# Under a volume (cache_root)


def weights_subdir(model_name: str) -> str:
    """Weights directory relative to the volume (cache_root)."""
    return f"weights/{model_name}"


def tensor_cache_parent(model_name: str) -> str:
    """``tt_metal_cache/cache_<model_name>``, relative to the volume: the tensor caches of every mesh."""
    return f"{TENSOR_CACHE_DIR}/{TENSOR_CACHE_PREFIX}{model_name}"


def aside_stamp(name: str) -> str | None:
    """The UTC stamp of a name that ``moved_aside_name`` made (``20261130T041500Z``), else None."""
    _base, infix, stamp = name.partition(ASIDE_INFIX)
    return stamp if infix else None


def tt_metal_cache_subdir(model_name: str, mesh: str) -> str:
    """Tensor cache directory relative to the volume (cache_root)."""
    return f"{tensor_cache_parent(model_name)}/{mesh}"


def container_path(subdir: str) -> str:
    """A directory of the volume as the container sees it."""
    return f"{CONTAINER_CACHE_ROOT}/{subdir}"


def container_tt_cache_path(model_name: str, mesh: str) -> str:
    """TT_CACHE_PATH inside the container."""
    return container_path(tt_metal_cache_subdir(model_name, mesh))


# ---------------------------------------------------------------------------------------------
# Containers


def sanitise_name(value: object) -> str:
    """A Docker container name made from ``value``: runs of other characters become ``-``.

    The result also names the env file, so it never holds ``/`` or starts with ``.`` or ``-``.
    """
    text = _NAME_BAD.sub("-", str(value))
    text = re.sub(r"\.{2,}", ".", text)
    text = re.sub(r"-{2,}", "-", text).strip("-_.")[:_MAX_NAME].rstrip("-_.")
    if not _NAME_OK.match(text):
        raise SpecError(
            f"name {value!r} has no usable characters for a container name; use letters, digits, '_', '.' and '-'."
        )
    return text


def container_name(model_name: str, device: str, port: int | str = DEFAULT_PORT) -> str:
    """Stable container name ``tt-<model_name>-<device>[-<port>]`` (the port only when not 8000)."""
    suffix = f"-{port}" if int(port) != DEFAULT_PORT else ""
    return sanitise_name(f"tt-{model_name}-{device}{suffix}".lower())


def serve_unit(instance: str) -> str:
    """The systemd unit of a serving instance: one instance of the serve role's template unit."""
    return f"tt-serve@{instance}.service"
