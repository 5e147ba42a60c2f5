# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_host/facts.py and the tt_facts module: tt-smi snapshots, device mapping and the host tree readers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

import pytest
from conftest import patch_module_args
from http_servers import UnixHTTPServer, canned, serving

from ansible_collections.ttfleet.inference.plugins.module_utils._host import facts
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import DEVICE_BY_BOARDS
from ansible_collections.ttfleet.inference.plugins.modules import tt_facts as tt_facts_module

TT_SMI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures", "tt_smi")

# Lab device type -> (boards the device is made of, PCIe devices, arch, firmware bundle).
LAB = {
    "n150": ({"n150": 1}, 1, "Wormhole", "80.17.0.0"),
    "n300": ({"n300": 1}, 1, "Wormhole", "80.17.0.0"),
    "t3k": ({"n300": 4}, 4, "Wormhole", "80.17.0.0"),
    "galaxy": ({"tt-galaxy-wh": 32}, 32, "Wormhole", "80.17.0.0"),
    "p150": ({"p150": 1}, 1, "Blackhole", "19.6.0.0"),
    "p150x4": ({"p150": 4}, 4, "Blackhole", "19.6.0.0"),
    "p150x8": ({"p150": 8}, 8, "Blackhole", "19.6.0.0"),
    "p300": ({"p300": 1}, 2, "Blackhole", "19.6.0.0"),
    "p300x2": ({"p300": 2}, 4, "Blackhole", "19.6.0.0"),
}


def load_snapshot(name):
    with open(os.path.join(TT_SMI_DIR, name + ".json"), encoding="utf-8") as handle:
        return json.load(handle)


def snapshot_of(*board_types, driver="TT-KMD 2.4.1", fw="19.6.0.0"):
    """A snapshot in tt-smi's shape with the given chip board types."""
    return {
        "host_info": {"Hostname": "h", "Driver": driver},
        "device_info": [
            {
                "board_info": {
                    "bus_id": "N/A" if board.endswith(" R") else f"0000:{i + 1:02x}:00.0",
                    "board_type": board,
                    "board_id": f"01{i:014x}",
                },
                "firmwares": {"fw_bundle_version": fw},
            }
            for i, board in enumerate(board_types)
        ],
    }


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def assemble(snapshot, root, **kwargs):
    kwargs.setdefault("docker", {"reachable": False})
    kwargs.setdefault("hostname", "test-host")
    return facts.assemble(snapshot=snapshot, root=str(root), **kwargs)


# ---------------------------------------------------------------------------
# Board types and devices


@pytest.mark.parametrize("device", sorted(LAB))
def test_every_lab_snapshot_implies_its_device(device, tmp_path):
    counts, pcie, arch, fw = LAB[device]
    result = assemble(load_snapshot(device), tmp_path, declared_device=device.upper())
    assert result["implied_device"] == device
    assert result["implied_device_reason"] is None
    assert result["board_counts"] == counts
    assert result["pcie_devices"] == pcie
    assert result["arch"] == arch
    assert result["firmware_versions"] == [fw]
    assert result["firmware_version"] == fw
    assert result["kmd_version"] == "2.6.0"
    assert result["kmd_source"] == "tt-smi"
    assert result["declared_device"] == device
    assert result["device_matches"] is True
    assert result["tt_smi_version"] == "3.0.39"


def test_snapshot_boards_keep_bus_and_board_ids():
    boards = facts.boards_from_snapshot(load_snapshot("n300"))
    assert [(b["board_type"], b["type"], b["remote"], b["bus_id"]) for b in boards] == [
        ("n300 L", "n300", False, "0000:01:00.0"),
        ("n300 R", "n300", True, None),
    ]
    assert boards[0]["board_id"] == "0100010000000000"
    assert boards[0]["arch"] == "Wormhole"
    assert boards[1]["fw_bundle_version"] == "80.17.0.0"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("n150 L", ("n150", False)),
        ("n300 L", ("n300", False)),
        ("n300 R", ("n300", True)),
        ("  N300   r ", ("n300", True)),
        ("tt-galaxy-wh L", ("tt-galaxy-wh", False)),
        ("tt-galaxy-bh", ("tt-galaxy-bh", False)),
        ("p150a", ("p150", False)),
        ("p150b", ("p150", False)),
        ("p150c", ("p150", False)),
        ("p100a", ("p100", False)),
        ("p300a", ("p300", False)),
        ("p300b", ("p300", False)),
        ("P300C", ("p300", False)),
        ("p150", ("p150", False)),
        ("e150", ("e150", False)),
        ("", ("", False)),
        (None, ("", False)),
    ],
)
def test_normalise_board_type(raw, expected):
    assert facts.normalise_board_type(raw) == expected


@pytest.mark.parametrize(
    ("boards", "device"),
    [
        (["p150a"], "p150"),
        (["p150b"] * 4, "p150x4"),
        (["p150c"] * 8, "p150x8"),
        (["p100a"], "p100"),
        (["p300a", "p300a"], "p300"),
        (["p300b"] * 4, "p300x2"),
        (["tt-galaxy-bh"] * 32, "blackhole_galaxy"),
        (["tt-galaxy-wh L"] * 32, "galaxy"),
        (["n150 L"] * 4, "n150x4"),
        (["n300 L", "n300 R"] * 4, "t3k"),
        (["n300 R", "n300 L"], "n300"),
    ],
)
def test_implied_device_with_blackhole_variants(boards, device):
    assert facts.implied_device(facts.boards_from_snapshot(snapshot_of(*boards))) == (device, None)


def test_upstream_table_alone_misses_blackhole_variants():
    # Upstream keys are bare names; only the normalisation makes "p150a" match.
    assert (("p150a", 1),) not in DEVICE_BY_BOARDS
    assert DEVICE_BY_BOARDS[(("p150", 1),)] == "p150"


@pytest.mark.parametrize(
    ("boards", "needle"),
    [
        (["n300 L", "n300 R", "n300 L"], "3 n300 chips, an odd number"),
        (["n300 R"], "1 n300 chips, an odd number"),
        (["p300c"] * 3, "3 p300 chips, an odd number"),
        (["n150 L", "n150 L"], "no tt-inference-server device is made of 2 x n150"),
        (["n150 L", "p150a"], "1 x n150, 1 x p150"),
        (["p150a"] * 2, "2 x p150"),
        (["wormhole-x9"], "1 x wormhole-x9"),
    ],
)
def test_implied_device_unknown_gives_reason(boards, needle):
    device, reason = facts.implied_device(facts.boards_from_snapshot(snapshot_of(*boards)))
    assert device is None
    assert needle in reason


def test_odd_chip_count_from_real_shaped_snapshot(tmp_path):
    result = assemble(load_snapshot("t3k-odd-chips-old-kmd"), tmp_path, declared_device="t3k")
    assert result["chip_counts"] == {"n300": 7}
    assert result["board_counts"] == {}
    assert "odd number" in result["board_count_problems"][0]
    assert result["implied_device"] is None
    assert "tt-smi -r" in result["implied_device_reason"]
    assert result["device_matches"] is False
    assert result["kmd_version"] == "1.27.1"
    assert result["pcie_devices"] == 4


def test_no_boards_gives_reason():
    assert facts.implied_device([]) == (None, "no Tenstorrent boards found")


def test_missing_board_type_gives_reason():
    snap = snapshot_of("n150 L")
    snap["device_info"][0]["board_info"]["board_type"] = ""
    device, reason = facts.implied_device(facts.boards_from_snapshot(snap))
    assert device is None
    assert "no board type for device(s) 0" in reason


def test_arch_mixed_and_firmware_sorted_numerically():
    snap = snapshot_of("n150 L", "p150a", fw="80.9.0.0")
    snap["device_info"][1]["firmwares"]["fw_bundle_version"] = "80.17.0.0"
    boards = facts.boards_from_snapshot(snap)
    assert facts.board_arch(boards) == "mixed"
    assert facts.firmware_versions(boards) == ["80.9.0.0", "80.17.0.0"]


# ---------------------------------------------------------------------------
# KMD


@pytest.mark.parametrize(
    ("driver", "version"),
    [
        ("TT-KMD 2.4.1", "2.4.1"),
        ("TTKMD 1.27.1", "1.27.1"),
        ("TT-KMD 2.5.0-rc1", "2.5.0-rc1"),
        ("TT-KMD", None),
        ("", None),
        (None, None),
        ("No driver", None),
    ],
)
def test_kmd_from_driver_string(driver, version):
    assert facts.kmd_from_driver(driver) == version


def test_kmd_prefers_sysfs(tmp_path):
    write(str(tmp_path / "sys/module/tenstorrent/version"), "2.5.0\n")
    result = assemble(snapshot_of("n150 L", driver="TTKMD 1.27.1"), tmp_path)
    assert (result["kmd_version"], result["kmd_source"], result["kmd_loaded"]) == ("2.5.0", "sysfs", True)


def test_kmd_from_tt_smi_without_sysfs(tmp_path):
    result = assemble(snapshot_of("n150 L", driver="TTKMD 1.27.1"), tmp_path)
    assert (result["kmd_version"], result["kmd_source"], result["kmd_loaded"]) == ("1.27.1", "tt-smi", False)


def test_kmd_unknown(tmp_path):
    result = assemble(None, tmp_path, tt_smi_error="tt-smi not found")
    assert (result["kmd_version"], result["kmd_source"]) == (None, None)


# ---------------------------------------------------------------------------
# Host tree


def test_device_nodes_numeric_order(tmp_path):
    for name in ("0", "10", "2", "1", "control"):
        write(str(tmp_path / "dev/tenstorrent" / name), "")
    assert facts.device_nodes(str(tmp_path)) == [
        "/dev/tenstorrent/0",
        "/dev/tenstorrent/1",
        "/dev/tenstorrent/2",
        "/dev/tenstorrent/10",
    ]
    assert facts.device_nodes(str(tmp_path / "nowhere")) == []


def test_pcie_devices_from_nodes_first(tmp_path):
    for name in ("0", "1"):
        write(str(tmp_path / "dev/tenstorrent" / name), "")
    result = assemble(snapshot_of("n300 L", "n300 R", "n300 L", "n300 R", "n300 L", "n300 R"), tmp_path)
    assert result["pcie_devices"] == 2
    assert result["device_nodes"] == ["/dev/tenstorrent/0", "/dev/tenstorrent/1"]


def test_sysfs_devices_and_firmware_fallback(tmp_path):
    base = tmp_path / "sys/class/tenstorrent"
    write(str(base / "tenstorrent!1/tt_card_type"), "p150\n")
    write(str(base / "tenstorrent!1/tt_fw_bundle_ver"), "19.6.0.0\n")
    write(str(base / "tenstorrent!0/tt_card_type"), "p150\n")
    write(str(base / "tenstorrent!0/tt_fw_bundle_ver"), "19.4.0.0\n")
    assert facts.sysfs_devices(str(tmp_path)) == [
        {"index": 0, "card_type": "p150", "fw_bundle_version": "19.4.0.0"},
        {"index": 1, "card_type": "p150", "fw_bundle_version": "19.6.0.0"},
    ]
    result = assemble(None, tmp_path, tt_smi_error="timeout")
    assert result["firmware_versions"] == ["19.4.0.0", "19.6.0.0"]
    assert result["firmware_version"] == "19.4.0.0"


MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0
hugetlbfs /dev/hugepages-1G hugetlbfs rw,relatime,mode=1770,pagesize=1024M 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
"""


def test_hugepages_mounted_with_pages(tmp_path):
    sysfs = tmp_path / "sys/kernel/mm/hugepages/hugepages-1048576kB"
    write(str(sysfs / "nr_hugepages"), "16\n")
    write(str(sysfs / "free_hugepages"), "12\n")
    write(str(tmp_path / "proc/self/mounts"), MOUNTS)
    assert facts.hugepages_1g(str(tmp_path)) == {
        "total": 16,
        "free": 12,
        "mounted": True,
        "mount_path": "/dev/hugepages-1G",
        "fstype": "hugetlbfs",
        "pagesize": "1024M",
    }


def test_hugepages_absent(tmp_path):
    write(str(tmp_path / "proc/self/mounts"), "tmpfs /dev/hugepages-1G tmpfs rw 0 0\n")
    result = facts.hugepages_1g(str(tmp_path))
    assert result["total"] is None and result["free"] is None
    assert result["mounted"] is False
    assert result["fstype"] == "tmpfs"


def test_hugepages_last_mount_wins(tmp_path):
    write(
        str(tmp_path / "proc/self/mounts"),
        "tmpfs /dev/hugepages-1G tmpfs rw 0 0\nnone /dev/hugepages-1G hugetlbfs rw,pagesize=1G 0 0\n",
    )
    assert facts.hugepages_1g(str(tmp_path))["mounted"] is True


def test_parse_mounts_unescapes():
    assert ("tmpfs", "/mnt/with space", "tmpfs", ["rw"]) in facts.parse_mounts(MOUNTS)


def test_iommu(tmp_path):
    assert facts.iommu(str(tmp_path)) == {"groups": 0, "enabled": False, "cmdline_pt": False}
    for group in ("0", "1", "2"):
        os.makedirs(str(tmp_path / "sys/kernel/iommu_groups" / group))
    write(str(tmp_path / "proc/cmdline"), "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt quiet\n")
    assert facts.iommu(str(tmp_path)) == {"groups": 3, "enabled": True, "cmdline_pt": True}


def test_iommu_pt_must_be_a_whole_token(tmp_path):
    write(str(tmp_path / "proc/cmdline"), "intel_iommu=on amd_iommu=pt\n")
    assert facts.iommu(str(tmp_path))["cmdline_pt"] is False


def test_meminfo(tmp_path):
    write(
        str(tmp_path / "proc/meminfo"),
        "MemTotal:       263856348 kB\nMemFree:         1000 kB\nMemAvailable:   131928174 kB\nHugePages_Total: 16\n",
    )
    with open(str(tmp_path / "proc/meminfo"), encoding="utf-8") as handle:
        assert facts.parse_meminfo(handle.read())["HugePages_Total"] == 16
    assert facts.memory(str(tmp_path)) == (251.63, 125.82)
    assert facts.memory(str(tmp_path / "nowhere")) == (None, None)


def test_disk_uses_nearest_existing_parent(tmp_path):
    result = facts.disk(str(tmp_path / "not" / "yet"))
    assert result["path"] == str(tmp_path)
    assert result["volume_root"] == str(tmp_path / "not" / "yet")
    st = os.statvfs(str(tmp_path))
    assert result["free_gb"] == round(st.f_bavail * st.f_frsize / 1024**3, 2)
    assert 0 < result["free_gb"] <= result["total_gb"]


# ---------------------------------------------------------------------------
# Docker


def test_docker_socket_absent(tmp_path):
    result = facts.docker_engine(str(tmp_path / "docker.sock"))
    assert result["reachable"] is False
    assert "does not exist" in result["error"]


_VERSION = b'{"Version": "28.2.2", "ApiVersion": "1.50", "Os": "linux"}'


@pytest.fixture()
def docker_server():
    # AF_UNIX paths are limited to ~108 bytes: pytest's tmp_path can be longer.
    directory = tempfile.mkdtemp(prefix="ttd", dir="/tmp")
    path = os.path.join(directory, "docker.sock")
    with contextlib.ExitStack() as servers:

        def start(status=200, body=None):
            handler = canned(status, body or _VERSION, {"Content-Type": "application/json"})
            servers.enter_context(serving(UnixHTTPServer(path, handler)))
            return path, handler

        yield start
    shutil.rmtree(directory)


def test_docker_engine_answers_version(docker_server):
    path, handler = docker_server()
    result = facts.docker_engine(path, timeout=5)
    assert result == {"socket": path, "reachable": True, "version": "28.2.2", "api_version": "1.50", "error": None}
    assert handler.seen[-1] == "/version"


def test_docker_engine_http_error(docker_server):
    path, _handler = docker_server(status=500, body=b'{"message": "boom"}')
    result = facts.docker_engine(path, timeout=5)
    assert result["reachable"] is False
    assert "HTTP 500" in result["error"]


def test_docker_engine_bad_json(docker_server):
    path, _handler = docker_server(body=b"not json")
    result = facts.docker_engine(path, timeout=5)
    assert result["reachable"] is False
    assert "unexpected answer" in result["error"]


def test_docker_socket_nobody_listens(tmp_path):
    directory = tempfile.mkdtemp(prefix="ttd", dir="/tmp")
    try:
        path = os.path.join(directory, "docker.sock")
        server = UnixHTTPServer(path, canned())
        server.server_close()  # the socket file stays, nobody accepts
        result = facts.docker_engine(path, timeout=2)
    finally:
        shutil.rmtree(directory)
    assert result["reachable"] is False
    assert result["error"].startswith(f"cannot talk to {path}")


# ---------------------------------------------------------------------------
# tt-smi runs


def make_tool(directory, name, script):
    path = os.path.join(str(directory), name)
    write(path, "#!/bin/sh\n" + script)
    os.chmod(path, 0o755)
    return path


def test_find_tt_smi_path_then_extra_dirs(tmp_path):
    first = tmp_path / "bin1"
    extra = tmp_path / "venv"
    tool = make_tool(extra, "tt-smi", "exit 0\n")
    assert facts.find_tt_smi("tt-smi", str(first), extra_dirs=(str(extra),)) == tool
    in_path = make_tool(first, "tt-smi", "exit 0\n")
    assert facts.find_tt_smi("tt-smi", str(first), extra_dirs=(str(extra),)) == in_path
    assert facts.find_tt_smi(tool) == tool
    assert facts.find_tt_smi(str(tmp_path / "missing")) is None
    assert facts.find_tt_smi("tt-smi", "", extra_dirs=()) is None


def test_find_tt_smi_skips_non_executables(tmp_path):
    write(str(tmp_path / "tt-smi"), "")
    assert facts.find_tt_smi("tt-smi", str(tmp_path), extra_dirs=()) is None


def test_run_tt_smi_reads_snapshot_after_noise(tmp_path):
    fixture = os.path.join(TT_SMI_DIR, "p300x2.json")
    tool = make_tool(tmp_path, "tt-smi", f'echo "Gathering information..."\ncat "{fixture}"\n')
    data = facts.run_tt_smi(tool)
    assert len(data["device_info"]) == 4


def test_run_tt_smi_without_driver(tmp_path):
    tool = make_tool(tmp_path, "tt-smi", 'echo "No Tenstorrent driver detected!" >&2\nexit 1\n')
    with pytest.raises(facts.TtSmiError, match="exited with 1: No Tenstorrent driver detected!"):
        facts.run_tt_smi(tool)


def test_run_tt_smi_timeout(tmp_path):
    tool = make_tool(tmp_path, "tt-smi", "exec sleep 5\n")
    with pytest.raises(facts.TtSmiError, match="did not answer within 1 s"):
        facts.run_tt_smi(tool, timeout=1)


@pytest.mark.parametrize(("text", "needle"), [("", "no JSON"), ("{broken", "invalid JSON"), ("[]", "no JSON")])
def test_parse_tt_smi_output_errors(text, needle):
    with pytest.raises(facts.TtSmiError, match=needle):
        facts.parse_tt_smi_output(text)


def test_gather_end_to_end(tmp_path, docker_server):
    socket_path, _handler = docker_server()
    fixture = os.path.join(TT_SMI_DIR, "p300x2.json")
    bindir = tmp_path / "bin"
    make_tool(bindir, "tt-smi", f'cat "{fixture}"\n')
    root = tmp_path / "root"
    for n in range(4):
        write(str(root / "dev/tenstorrent" / str(n)), "")
    write(str(root / "proc/self/mounts"), MOUNTS)
    write(str(root / "proc/meminfo"), "MemTotal: 268435456 kB\nMemAvailable: 134217728 kB\n")
    result = facts.gather(
        volume_root="/var/lib/tt-cache",
        declared_device="p300x2",
        docker_socket=socket_path,
        path_env=str(bindir),
        root=str(root),
    )
    assert result["tt_smi_error"] is None
    assert result["tt_smi_path"] == str(bindir / "tt-smi")
    assert result["implied_device"] == "p300x2"
    assert result["device_matches"] is True
    assert result["pcie_devices"] == 4
    assert result["hugepages_1g"]["mounted"] is True
    assert result["docker"]["reachable"] is True
    assert result["memory_gb"] == 256.0
    assert result["disk"]["path"] == str(root)


def test_gather_without_tt_smi_does_not_raise(tmp_path):
    result = facts.gather(
        tt_smi="tt-smi-absent",
        docker_socket=str(tmp_path / "docker.sock"),
        path_env=str(tmp_path),
        root=str(tmp_path),
    )
    assert result["boards"] == []
    assert result["tt_smi_path"] is None
    assert "tt-smi-absent not found" in result["tt_smi_error"]
    assert result["implied_device"] is None
    assert result["implied_device_reason"].startswith("no Tenstorrent boards found: tt-smi-absent not found")
    assert result["docker"]["reachable"] is False


def test_module_returns_facts_without_failing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    args = {
        "tt_smi": "tt-smi-absent",
        "volume_root": str(tmp_path / "cache"),
        "declared_device": "N150",
        "docker_socket": str(tmp_path / "docker.sock"),
        "_ansible_check_mode": True,
    }
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        tt_facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0
    assert result["changed"] is False
    assert result["ansible_facts"]["tt"] == result["tt"]
    assert result["tt"]["declared_device"] == "n150"
    assert result["tt"]["device_matches"] is False
    assert result["tt"]["disk"]["path"] == str(tmp_path)
    assert "not found" in result["tt"]["tt_smi_error"]


def test_module_rejects_relative_volume_root(capsys):
    with patch_module_args({"volume_root": "relative/dir"}), pytest.raises(SystemExit) as exc:
        tt_facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1
    assert "absolute" in result["msg"]


def test_module_reports_what_is_installed_only_when_asked(tmp_path, capsys):
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "tt_smi-3.0.39.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Name: tt-smi\nVersion: 3.0.39\n")
    base = {"volume_root": str(tmp_path), "tt_smi": str(tmp_path / "no-tt-smi")}
    with patch_module_args(base), pytest.raises(SystemExit):
        tt_facts_module.main()
    assert "installed" not in json.loads(capsys.readouterr().out)["tt"]
    args = dict(base, venv=str(tmp_path / "venv"), distributions=["tt-smi", "tt-flash"],
                release_dir=str(tmp_path / "current"))  # fmt: skip
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        tt_facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 0
    assert result["tt"]["installed"]["distributions"] == {"tt-smi": "3.0.39", "tt-flash": None}
    assert result["tt"]["installed"]["release_dir"] == {
        "path": str(tmp_path / "current"), "exists": False, "link_target": None,
    }  # fmt: skip
    assert result["tt"]["installed"]["packages"] == {}


def test_module_rejects_distributions_without_a_venv(capsys):
    with patch_module_args({"distributions": ["tt-smi"]}), pytest.raises(SystemExit) as exc:
        tt_facts_module.main()
    result = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1
    assert "distributions needs venv" in result["msg"]
