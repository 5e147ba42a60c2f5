# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The devices and boards of tt-inference-server (TTIS): the one table, and the lookups every module makes in it.

A device is what ``run.py --tt-device`` takes (lower case) and what a catalog is keyed by (upper case). Its columns
come from TTIS v0.20.0: ``DeviceTypes.to_mesh_device_str()``, ``is_wormhole()``, ``is_blackhole()`` and
``is_multihost()`` (``workflows/utils.py``), the Ethernet-dispatch devices of ``ModelSpec._infer_env_vars``
(``workflows/model_spec.py``), the boards ``workflows/device_utils.py`` infers a device from, and the settings
``workflows/run_docker_server.py`` gives the SDXL C++ server per device. Pure, standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Optional

    # (DEVICE_MESH_SHAPE, IS_GALAXY, DEVICE_IDS) of the SDXL C++ server, or None where run.py does not start it.
    CppSettings = Optional[tuple[str, bool, str]]  # noqa: UP045 - ansible-test pylint reads `|` here as an operation


class Device(NamedTuple):
    """One row of DEVICES."""

    # The leaf directory of the tensor cache (and MESH_DEVICE).
    mesh: str
    # ARCH_NAME that ModelSpec gives the device's specs (is_wormhole / is_blackhole), None for neither.
    arch_name: str | None = None
    # WH_ARCH_YAML is the Ethernet-dispatch one (N300-class devices).
    eth_dispatch: bool = False
    # run.py starts worker containers over ssh plus a controller, not one container.
    multihost: bool = False
    # (board type, boards) that tt-smi shows on a host of this device; None: never inferred from boards.
    boards: tuple[str, int] | None = None
    # The SDXL C++ server's settings on this device.
    sdxl_cpp: CppSettings = None
    # A fleet host can be this device: an inventory group of that name (fleet_defaults tt_device_types).
    fleet: bool = False


class Board(NamedTuple):
    """One row of BOARDS: a board type as tt-smi names it (lower case, no variant letter)."""

    arch: str
    # Chips tt-smi lists per card: one device_info entry each.
    chips: int = 1


_WH = "wormhole_b0"
_BH = "blackhole"
_THIRTY_TWO = ",".join(f"({index})" for index in range(32))
_FOUR_PAIRS = "(0,1),(2,3),(4,5),(6,7)"
_BH_GALAXY_CPP = ("1,1", False, _THIRTY_TWO)

# Keyed by the catalog's (upper-case) device name: the members of DeviceTypes. Columns in order: mesh, arch_name,
# eth_dispatch; the fleet devices in the order of fleet_defaults' tt_device_types.
DEVICES: dict[str, Device] = {
    "CPU": Device("CPU"),
    "E150": Device("E150", boards=("e150", 1)),
    "N150": Device("N150", _WH, boards=("n150", 1), sdxl_cpp=("1,1", False, "(0)"), fleet=True),
    "N300": Device("N300", _WH, True, boards=("n300", 1), sdxl_cpp=("2,1", False, "(0)"), fleet=True),
    "N150X4": Device("N150x4", _WH, boards=("n150", 4), fleet=True),
    "T3K": Device("T3K", _WH, True, boards=("n300", 4), sdxl_cpp=("2,1", False, "(0),(1),(2),(3)"), fleet=True),
    "GALAXY": Device("TG", _WH, boards=("tt-galaxy-wh", 32), sdxl_cpp=("1,1", True, _THIRTY_TWO), fleet=True),
    "GALAXY_T3K": Device("T3K", _WH, True, fleet=True),
    "P100": Device("P100", _BH, boards=("p100", 1), fleet=True),
    "P150": Device("P150", _BH, boards=("p150", 1), sdxl_cpp=("1,1", False, "(0)"), fleet=True),
    "P150X4": Device("P150x4", _BH, boards=("p150", 4), sdxl_cpp=("2,1", False, "(0,1),(2,3)"), fleet=True),
    "P150X8": Device("P150x8", _BH, boards=("p150", 8), sdxl_cpp=("2,1", False, _FOUR_PAIRS), fleet=True),
    "P300": Device("P300", _BH, boards=("p300", 1), sdxl_cpp=("2,1", False, "(0,1)"), fleet=True),
    "P300X2": Device("P300x2", _BH, boards=("p300", 2), sdxl_cpp=("2,1", False, "(0,1),(2,3)"), fleet=True),
    "BLACKHOLE_GALAXY": Device("BH-Galaxy", _BH, boards=("tt-galaxy-bh", 32), sdxl_cpp=_BH_GALAXY_CPP, fleet=True),
    "DUAL_GALAXY": Device("(8,8)", multihost=True, fleet=True),
    "QUAD_GALAXY": Device("(8,16)", multihost=True, fleet=True),
    "SUPER_CLUSTER": Device("Super-Cluster", _BH, multihost=True),
    "GPU": Device("GPU"),
}

BOARDS: dict[str, Board] = {
    "e150": Board("Grayskull"),
    "e75": Board("Grayskull"),
    "n150": Board("Wormhole"),
    "n300": Board("Wormhole", chips=2),
    "tt-galaxy-wh": Board("Wormhole"),
    "p100": Board("Blackhole"),
    "p150": Board("Blackhole"),
    "p300": Board("Blackhole", chips=2),
    "tt-galaxy-bh": Board("Blackhole"),
}

# Lookups derived from the tables above, in the shapes their callers need.
# workflows/device_utils.py: sorted (board type, board count) pairs to the device run.py infers.
DEVICE_BY_BOARDS: dict[tuple[tuple[str, int], ...], str] = {
    (device.boards,): name.lower() for name, device in DEVICES.items() if device.boards
}
FLEET_DEVICES = tuple(name.lower() for name, device in DEVICES.items() if device.fleet)


def device_row(device: object) -> Device | None:
    """The row of a device named in any case, or None for a device TTIS does not know."""
    return DEVICES.get(str(device).upper())


def mesh_name(device: object, device_mesh: Mapping[str, str] | None = None) -> str:
    """Mesh directory name of a TTIS device (``galaxy`` -> ``TG``, ``p300x2`` -> ``P300x2``).

    ``device_mesh`` is a catalog's own table (the checkout's code, a runtime spec's MESH_DEVICE); it wins.
    """
    key = str(device).upper()
    if device_mesh and key in device_mesh:
        return device_mesh[key]
    if key in DEVICES:
        return DEVICES[key].mesh
    raise SpecError(
        f"Unknown device {device!r}: no mesh name known. "
        f"Known devices: {', '.join(sorted(d.lower() for d in DEVICES))}."
    )


def is_multihost(device: object) -> bool:
    row = device_row(device)
    return bool(row and row.multihost)


def sdxl_cpp_settings(device: object) -> CppSettings:
    row = device_row(device)
    return row.sdxl_cpp if row else None


def sdxl_cpp_devices() -> list[str]:
    """Lower-case devices on which run.py starts the SDXL C++ server."""
    return sorted(name.lower() for name, device in DEVICES.items() if device.sdxl_cpp)


def arch_of_board(board_type: str) -> str | None:
    row = BOARDS.get(board_type)
    return row.arch if row else None


def board_chips(board_type: str) -> int:
    row = BOARDS.get(board_type)
    return row.chips if row else 1
