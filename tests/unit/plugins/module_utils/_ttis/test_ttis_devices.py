# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""plugins/module_utils/_ttis/devices.py: the one device table, against tt-inference-server v0.20.0's own code.

``DeviceTypes`` (workflows/workflow_types.py) and ``ModelSpec._infer_env_vars`` (workflows/model_spec.py) are read from
the release subset in tests/fixtures/ttis (see its README). (Named test_ttis_devices.py: pytest imports test files by
basename.)
"""

from __future__ import annotations

import ast
import importlib.util
import os
import tarfile

import pytest
import yaml

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import (
    DEVICE_BY_BOARDS,
    DEVICES,
    FLEET_DEVICES,
    arch_of_board,
    board_chips,
    device_row,
    is_multihost,
    mesh_name,
    sdxl_cpp_devices,
    sdxl_cpp_settings,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.errors import SpecError

# tests/unit/plugins/module_utils/_ttis/<this file>: six levels below the checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))
SUBSET = os.path.join(ROOT, "tests", "fixtures", "ttis", "tt-inference-server-v0.20.0-subset.tgz")


def _upstream_text(tmp_path_factory, name):
    with tarfile.open(SUBSET) as archive:
        member = archive.getmember(f"tt-inference-server-0.20.0/workflows/{name}")
        handle = archive.extractfile(member)
        assert handle is not None
        text = handle.read().decode("utf-8")
    path = tmp_path_factory.mktemp("ttis") / name
    path.write_text(text, encoding="utf-8")
    return path, text


@pytest.fixture(scope="module")
def device_types(tmp_path_factory):
    """Upstream's DeviceTypes enum: workflow_types.py imports only enum and typing."""
    path, _text = _upstream_text(tmp_path_factory, "workflow_types.py")
    spec = importlib.util.spec_from_file_location("ttis_workflow_types", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DeviceTypes


def test_the_table_holds_exactly_upstreams_devices(device_types):
    assert sorted(DEVICES) == sorted(member.name for member in device_types)


def test_mesh_arch_and_multihost_are_upstreams(device_types):
    for member in device_types:
        row = DEVICES[member.name]
        assert row.mesh == member.to_mesh_device_str(), member.name
        expected_arch = "wormhole_b0" if member.is_wormhole() else "blackhole" if member.is_blackhole() else None
        assert row.arch_name == expected_arch, member.name
        assert row.multihost == member.is_multihost(), member.name


def test_eth_dispatch_devices_are_upstreams(tmp_path_factory):
    """The device list of the WH_ARCH_YAML branch in ModelSpec._infer_env_vars."""
    _path, text = _upstream_text(tmp_path_factory, "model_spec.py")
    functions = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)]
    function = next(node for node in functions if node.name == "_infer_env_vars")
    branch = next(
        node for node in ast.walk(function) if isinstance(node, ast.If) and "WH_ARCH_YAML" in ast.unparse(node)
    )
    listed = {element.attr for element in branch.test.comparators[0].elts}
    assert listed == {name for name, row in DEVICES.items() if row.eth_dispatch} == {"N300", "T3K", "GALAXY_T3K"}


@pytest.mark.parametrize(
    ("device", "mesh"),
    [
        ("n150", "N150"),
        ("n300", "N300"),
        ("n150x4", "N150x4"),
        ("t3k", "T3K"),
        ("galaxy", "TG"),
        ("galaxy_t3k", "T3K"),
        ("p100", "P100"),
        ("p150", "P150"),
        ("p150x4", "P150x4"),
        ("p150x8", "P150x8"),
        ("p300", "P300"),
        ("P300X2", "P300x2"),
        ("blackhole_galaxy", "BH-Galaxy"),
        ("dual_galaxy", "(8,8)"),
        ("quad_galaxy", "(8,16)"),
        ("gpu", "GPU"),
    ],
)
def test_mesh_name(device, mesh):
    assert mesh_name(device) == mesh


def test_mesh_name_prefers_the_checkout_table():
    assert mesh_name("new_box", {"NEW_BOX": "NB"}) == "NB"
    with pytest.raises(SpecError, match="Unknown device"):
        mesh_name("new_box")


def test_unknown_devices_have_no_row():
    assert device_row("p150x2") is None
    assert device_row("P300x2") is DEVICES["P300X2"]
    assert not is_multihost("p150x2")
    assert sdxl_cpp_settings("p150x2") is None


def test_boards_make_the_devices_of_upstreams_device_utils():
    # workflows/device_utils.py of tt-inference-server v0.20.0: sorted (board type, board count) pairs; n300 and p300
    # counted per card.
    assert DEVICE_BY_BOARDS == {
        (("n300", 1),): "n300",
        (("n300", 4),): "t3k",
        (("tt-galaxy-wh", 32),): "galaxy",
        (("n150", 1),): "n150",
        (("n150", 4),): "n150x4",
        (("e150", 1),): "e150",
        (("p100", 1),): "p100",
        (("p150", 1),): "p150",
        (("p150", 4),): "p150x4",
        (("p150", 8),): "p150x8",
        (("p300", 1),): "p300",
        (("p300", 2),): "p300x2",
        (("tt-galaxy-bh", 32),): "blackhole_galaxy",
    }


@pytest.mark.parametrize(
    ("board", "arch", "chips"),
    [
        ("e75", "Grayskull", 1),
        ("n150", "Wormhole", 1),
        ("n300", "Wormhole", 2),
        ("tt-galaxy-wh", "Wormhole", 1),
        ("p150", "Blackhole", 1),
        ("p300", "Blackhole", 2),
        ("tt-galaxy-bh", "Blackhole", 1),
        ("x9000", None, 1),
    ],
)
def test_boards(board, arch, chips):
    assert (arch_of_board(board), board_chips(board)) == (arch, chips)


def test_the_sdxl_cpp_server_settings():
    # run_docker_server.py of v0.20.0: (DEVICE_MESH_SHAPE, IS_GALAXY, DEVICE_IDS) per device.
    assert sdxl_cpp_devices() == [
        "blackhole_galaxy",
        "galaxy",
        "n150",
        "n300",
        "p150",
        "p150x4",
        "p150x8",
        "p300",
        "p300x2",
        "t3k",
    ]
    assert sdxl_cpp_settings("t3k") == ("2,1", False, "(0),(1),(2),(3)")
    assert sdxl_cpp_settings("GALAXY") == ("1,1", True, ",".join(f"({i})" for i in range(32)))
    assert sdxl_cpp_settings("p150x8") == ("2,1", False, "(0,1),(2,3),(4,5),(6,7)")


def test_fleet_devices_are_the_inventory_groups_of_fleet_defaults():
    """roles/fleet_defaults lists the device groups as a public default (tt_device_types) an operator may override;
    its default is this table's fleet column, in this order."""
    with open(os.path.join(ROOT, "roles", "fleet_defaults", "defaults", "main.yml"), encoding="utf-8") as handle:
        defaults = yaml.safe_load(handle)
    assert list(FLEET_DEVICES) == defaults["tt_device_types"]
    assert all(device_row(name) for name in FLEET_DEVICES)
