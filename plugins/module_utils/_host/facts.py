# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Facts about a Tenstorrent host: boards, device type, driver, hugepages, IOMMU, Docker, memory, disk.

Private to the collection. Standard library only. Every reader takes a ``root`` prefix for
``/sys``, ``/proc`` and ``/dev`` (``/`` on a real host) or the text it parses, so that unit tests
run against a directory tree in a temporary directory.

Board types come from ``tt-smi -s``, which lists one ``device_info`` entry per chip. Wormhole chips
carry a suffix: ``L`` for a PCIe-local chip, ``R`` for a remote one (the second chip of an n300).
Blackhole chips carry none, but their names end in a variant letter (``p150a``, ``p300c``).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import re
import socket
import subprocess
from typing import TYPE_CHECKING, Any

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import nearest_existing
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import (
    DEVICE_BY_BOARDS,
    arch_of_board,
    board_chips,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Union

    # A dict read from JSON (tt-smi's snapshot) or returned to Ansible as facts.
    JSON = dict[str, Any]
    # A sort key of ``version_sort_key``: ``(0, numbers)`` for a version, ``(1, (), text)`` for anything else.
    VersionSortKey = Union[tuple[int, tuple[int, ...]], tuple[int, tuple[int, ...], str]]  # noqa: UP007 - ansible-test pylint reads `|` here as an operation

DEFAULT_VOLUME_ROOT = "/var/lib/tt-cache"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
TT_SMI_DIRS = ("/opt/tenstorrent/venv/bin", "/usr/local/bin")
HUGEPAGES_MOUNT = "/dev/hugepages-1G"
HUGEPAGES_1G_SYSFS = "sys/kernel/mm/hugepages/hugepages-1048576kB"
# tenstorrent-tools reserves this many 1 GiB pages per PCIe device.
HUGEPAGES_PER_DEVICE = 4
GIB = 1024**3

# tt-smi names Blackhole boards with a variant letter that upstream's table does not know.
_BLACKHOLE_VARIANT = re.compile(r"^(p\d{3})[a-z]$")
_DRIVER_VERSION = re.compile(r"(\d+(?:\.\d+)+(?:[-+.~][0-9A-Za-z.+~-]*)?)\s*$")
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")
_NOT_AVAILABLE = ("", "N/A", "n/a", None)


class TtSmiError(FleetError):
    """tt-smi could not be run or its output could not be read; the message says which."""


def _path(root: str | None, absolute: str) -> str:
    return os.path.join(root or "/", absolute.lstrip("/"))


def _read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path, 64)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _read_attribute(path: str) -> str | None:
    text = _read_text(path, 4096)
    return (text.strip() or None) if text is not None else None


def _available(value: Any) -> Any:
    return None if value in _NOT_AVAILABLE else value


# ---------------------------------------------------------------------------
# tt-smi


def find_tt_smi(name: str | None, path_env: str | None = None, extra_dirs: Iterable[str] = TT_SMI_DIRS) -> str | None:
    """Absolute path of the tt-smi executable, or None.

    A name with a ``/`` is used as given; a bare name is looked up in ``path_env`` (PATH) and
    then in ``extra_dirs``, where tt-installer and pip put it.
    """
    if not name:
        return None
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    dirs = [part for part in (path_env or "").split(os.pathsep) if part]
    dirs += [directory for directory in extra_dirs if directory not in dirs]
    for directory in dirs:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_tt_smi_output(text: str | None) -> JSON:
    """The snapshot dict of ``tt-smi -s`` output; text before the JSON object is ignored."""
    text = text or ""
    start = text.find("{")
    if start < 0:
        raise TtSmiError(f"tt-smi printed no JSON snapshot: {_last_line(text)}")
    try:
        data = json.loads(text[start:])
    except ValueError as exc:
        raise TtSmiError(f"tt-smi printed invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TtSmiError("tt-smi printed JSON that is not an object")
    return data


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_tt_smi(executable: str, timeout: float = 30) -> JSON:
    """Run ``tt-smi -s`` and return its snapshot; raises TtSmiError with the reason."""
    try:
        # Accepted bandit B603: a fixed argv: the tt-smi path the operator set, and -s.
        proc = subprocess.run(  # nosec B603
            [executable, "-s"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TtSmiError(
            f"{executable} -s did not answer within {timeout} s; a device may be wedged (try tt-smi -r)"
        ) from None
    except OSError as exc:
        raise TtSmiError(f"cannot run {executable}: {exc.strerror or exc}") from None
    stdout = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        detail = _last_line(proc.stderr.decode("utf-8", "replace") or stdout)
        raise TtSmiError(f"{executable} -s exited with {proc.returncode}: {detail}")
    return parse_tt_smi_output(stdout)


def normalise_board_type(board_type: object) -> tuple[str, bool]:
    """``(type, remote)`` of a tt-smi board type.

    ``"n300 R"`` -> ``("n300", True)``, ``"p150a"`` -> ``("p150", False)``.
    As upstream: lower case, first word. Beyond upstream: the Blackhole variant letter is dropped
    so that ``p150a``/``p150b``/``p150c`` count as ``p150`` (upstream's table never matches them).
    """
    words = str(board_type or "").strip().lower().split()
    if not words:
        return "", False
    base = words[0]
    match = _BLACKHOLE_VARIANT.match(base)
    if match:
        base = match.group(1)
    return base, len(words) > 1 and words[1] == "r"


def boards_from_snapshot(data: Mapping[str, Any]) -> list[JSON]:
    """One dict per ``device_info`` entry (one per chip) of a tt-smi snapshot."""
    boards: list[JSON] = []
    for index, info in enumerate(data.get("device_info") or []):
        if not isinstance(info, dict):
            continue
        board_info = info.get("board_info") or {}
        firmwares = info.get("firmwares") or {}
        raw = str(board_info.get("board_type") or "").strip()
        board_type, remote = normalise_board_type(raw)
        boards.append(
            {
                "index": index,
                "board_type": raw,
                "type": board_type,
                "arch": arch_of_board(board_type),
                "remote": remote,
                "bus_id": _available(board_info.get("bus_id")),
                "board_id": _available(board_info.get("board_id")),
                "fw_bundle_version": _available(firmwares.get("fw_bundle_version")),
            }
        )
    return boards


def chip_counts(boards: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Chips per normalised board type."""
    counts: dict[str, int] = {}
    for board in boards:
        if board["type"]:
            counts[board["type"]] = counts.get(board["type"], 0) + 1
    return counts


def board_counts(boards: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], list[str]]:
    """``(counts, problems)``: boards per type, n300 and p300 chips paired into cards as upstream does.

    A two-chip type with an odd chip count is left out of ``counts`` and explained in ``problems``.
    """
    counts: dict[str, int] = {}
    problems: list[str] = []
    for board_type, chips in sorted(chip_counts(boards).items()):
        if board_chips(board_type) == 2:
            if chips % 2:
                problems.append(
                    f"tt-smi lists {chips} {board_type} chips, an odd number, but every {board_type} card has two: "
                    "a chip is missing (not trained, not powered or wedged); reset the boards with tt-smi -r "
                    "and check the cards and cables"
                )
                continue
            counts[board_type] = chips // 2
        else:
            counts[board_type] = chips
    return counts, problems


def implied_device(boards: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """``(device, reason)``: the tt-inference-server device these boards make, or None and why not."""
    if not boards:
        return None, "no Tenstorrent boards found"
    unnamed = [board["index"] for board in boards if not board["type"]]
    if unnamed:
        return None, f"tt-smi gives no board type for device(s) {', '.join(map(str, unnamed))}"
    counts, problems = board_counts(boards)
    if problems:
        return None, "; ".join(problems)
    key = tuple(sorted(counts.items()))
    device = DEVICE_BY_BOARDS.get(key)
    if device is None:
        seen = ", ".join(f"{count} x {board_type}" for board_type, count in key)
        known = ", ".join(sorted(set(DEVICE_BY_BOARDS.values())))
        return None, f"no tt-inference-server device is made of {seen} (known devices: {known})"
    return device, None


def board_arch(boards: Iterable[Mapping[str, Any]]) -> str | None:
    """``Wormhole``, ``Blackhole`` (or ``Grayskull``) when all boards agree, ``mixed``, or None."""
    archs = {board["arch"] for board in boards if board["arch"]}
    if not archs:
        return None
    return archs.pop() if len(archs) == 1 else "mixed"


# ---------------------------------------------------------------------------
# Versions


def version_sort_key(text: object) -> VersionSortKey:
    """Numeric sort key of a dotted version (``80.17.0.0``); unparseable text sorts last."""
    numbers = re.findall(r"\d+", str(text).split("-", 1)[0])
    return (0, tuple(int(n) for n in numbers)) if numbers else (1, (), str(text))


def firmware_versions(boards: Iterable[Mapping[str, Any]]) -> list[Any]:
    """Distinct firmware bundle versions of the boards, lowest first."""
    return sorted({b["fw_bundle_version"] for b in boards if b["fw_bundle_version"]}, key=version_sort_key)


def kmd_from_driver(driver: object) -> str | None:
    """Version in tt-smi's ``host_info.Driver`` (``TT-KMD 2.4.1``, ``TTKMD 1.27.1``), or None."""
    if not isinstance(driver, str):
        return None
    match = _DRIVER_VERSION.search(driver.strip())
    return match.group(1) if match else None


def read_kmd_sysfs(root: str | None = "/") -> str | None:
    """Version of the loaded tenstorrent kernel module, or None when it is not loaded."""
    text = _read_text(_path(root, "/sys/module/tenstorrent/version"), 256)
    text = text.strip() if text else ""
    return text or None


# ---------------------------------------------------------------------------
# Device nodes, sysfs, hugepages, IOMMU, memory, disk


def device_nodes(root: str | None = "/") -> list[str]:
    """``/dev/tenstorrent/<N>`` paths (as on the host, without ``root``), in numeric order."""
    directory = _path(root, "/dev/tenstorrent")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [f"/dev/tenstorrent/{name}" for name in sorted((n for n in names if n.isdigit()), key=int)]


def sysfs_devices(root: str | None = "/") -> list[JSON]:
    """What the KMD reports per PCIe device under ``/sys/class/tenstorrent``."""
    directory = _path(root, "/sys/class/tenstorrent")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    devices: list[JSON] = []
    for name in names:
        number = name.rsplit("!", 1)[-1]
        if not number.isdigit():
            continue

        base = os.path.join(directory, name)
        devices.append(
            {
                "index": int(number),
                "card_type": _read_attribute(os.path.join(base, "tt_card_type")),
                "fw_bundle_version": _read_attribute(os.path.join(base, "tt_fw_bundle_ver")),
            }
        )
    return sorted(devices, key=lambda device: device["index"])


def parse_mounts(text: str | None) -> list[tuple[str, str, str, list[str]]]:
    """``(device, mount point, fs type, options)`` per line of ``/proc/self/mounts``."""
    mounts: list[tuple[str, str, str, list[str]]] = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        device, target, fstype, options = (_MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[:4])
        mounts.append((device, target, fstype, options.split(",")))
    return mounts


def _pagesize_option(options: Iterable[str]) -> str | None:
    for option in options:
        if option.startswith("pagesize="):
            return option.split("=", 1)[1]
    return None


def hugepages_1g(root: str | None = "/", mount_path: str = HUGEPAGES_MOUNT) -> JSON:
    """1 GiB hugepages: page counts from sysfs and the hugetlbfs mount the containers bind."""
    sysfs = _path(root, HUGEPAGES_1G_SYSFS)
    result: JSON = {
        "total": _read_int(os.path.join(sysfs, "nr_hugepages")),
        "free": _read_int(os.path.join(sysfs, "free_hugepages")),
        "mounted": False,
        "mount_path": mount_path,
        "fstype": None,
        "pagesize": None,
    }
    for _device, target, fstype, options in parse_mounts(_read_text(_path(root, "/proc/self/mounts"))):
        if target == mount_path:
            # Later lines are mounts on top of earlier ones: the last one is what a path lookup sees.
            result["fstype"] = fstype
            result["mounted"] = fstype == "hugetlbfs"
            result["pagesize"] = _pagesize_option(options) if fstype == "hugetlbfs" else None
    return result


def iommu(root: str | None = "/") -> JSON:
    """IOMMU groups present and whether the kernel runs with ``iommu=pt`` (as tenstorrent-tools sets)."""
    try:
        groups = len(os.listdir(_path(root, "/sys/kernel/iommu_groups")))
    except OSError:
        groups = 0
    cmdline = (_read_text(_path(root, "/proc/cmdline"), 65536) or "").split()
    return {"groups": groups, "enabled": groups > 0, "cmdline_pt": "iommu=pt" in cmdline}


def parse_meminfo(text: str | None) -> dict[str, int]:
    """``/proc/meminfo`` values in kB by field name."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and fields and fields[0].isdigit():
            values[name.strip()] = int(fields[0])
    return values


def memory(root: str | None = "/") -> tuple[float | None, float | None]:
    """``(total_gb, available_gb)`` in GiB (as tt-inference-server counts), None when unknown."""
    values = parse_meminfo(_read_text(_path(root, "/proc/meminfo")))

    def gib(kb: int | None) -> float | None:
        return round(kb / (1024 * 1024), 2) if kb is not None else None

    return gib(values.get("MemTotal")), gib(values.get("MemAvailable"))


def disk(volume_root: str) -> JSON:
    """Free and total space (GiB) of the filesystem that holds (or will hold) ``volume_root``."""
    path = nearest_existing(volume_root)
    result: JSON = {"volume_root": volume_root, "path": path, "free_gb": None, "total_gb": None, "error": None}
    try:
        st = os.statvfs(path)
    except OSError as exc:
        result["error"] = f"cannot stat {path}: {exc.strerror or exc}"
        return result
    result["free_gb"] = round(st.f_bavail * st.f_frsize / GIB, 2)
    result["total_gb"] = round(st.f_blocks * st.f_frsize / GIB, 2)
    return result


# ---------------------------------------------------------------------------
# Docker


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def docker_engine(socket_path: str = DEFAULT_DOCKER_SOCKET, timeout: float = 5.0) -> JSON:
    """Ask the Docker engine ``GET /version`` over its unix socket (no docker CLI needed)."""
    result: JSON = {"socket": socket_path, "reachable": False, "version": None, "api_version": None, "error": None}
    if not os.path.exists(socket_path):
        result["error"] = f"{socket_path} does not exist (Docker engine not installed or not running)"
        return result
    conn = _UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request("GET", "/version", headers={"Host": "docker"})
        response = conn.getresponse()
        body = response.read(1 << 20)
        if response.status != 200:
            result["error"] = f"GET /version on {socket_path} answered HTTP {response.status}"
            return result
        data = json.loads(body.decode("utf-8", "replace"))
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, PermissionError) or exc.errno == errno.EACCES:
            reason += " (run as root or a member of the docker group)"
        result["error"] = f"cannot talk to {socket_path}: {reason}"
        return result
    except (http.client.HTTPException, ValueError) as exc:
        result["error"] = f"unexpected answer from {socket_path}: {exc or type(exc).__name__}"
        return result
    finally:
        conn.close()
    if not isinstance(data, dict):
        result["error"] = f"unexpected answer from {socket_path}: not a JSON object"
        return result
    result["reachable"] = True
    result["version"] = data.get("Version")
    result["api_version"] = data.get("ApiVersion")
    return result


# ---------------------------------------------------------------------------
# All together


def assemble(
    snapshot: Mapping[str, Any] | None = None,
    tt_smi_error: str | None = None,
    tt_smi_path: str | None = None,
    root: str | None = "/",
    volume_root: str = DEFAULT_VOLUME_ROOT,
    declared_device: str | None = None,
    docker: JSON | None = None,
    hostname: str | None = None,
) -> JSON:
    """The ``tt`` facts dict from a tt-smi snapshot (or its error) and the host tree under ``root``."""
    snapshot = snapshot or {}
    host_info = snapshot.get("host_info") or {}
    boards = boards_from_snapshot(snapshot)
    counts, count_problems = board_counts(boards)
    device, reason = implied_device(boards)
    if not boards and tt_smi_error:
        reason = f"{reason}: {tt_smi_error}"
    nodes = device_nodes(root)
    sysfs = sysfs_devices(root)
    fw_versions = firmware_versions(boards) or sorted(
        {d["fw_bundle_version"] for d in sysfs if d["fw_bundle_version"]}, key=version_sort_key
    )
    kmd_sysfs = read_kmd_sysfs(root)
    kmd_smi = kmd_from_driver(host_info.get("Driver"))
    total_gb, available_gb = memory(root)
    declared = declared_device.lower() if declared_device else None
    local_chips = sum(1 for board in boards if not board["remote"])
    return {
        "hostname": hostname or socket.gethostname() or host_info.get("Hostname"),
        "tt_smi_path": tt_smi_path,
        "tt_smi_error": tt_smi_error,
        "tt_smi_version": (snapshot.get("host_sw_vers") or {}).get("tt_smi"),
        "boards": boards,
        "chip_counts": chip_counts(boards),
        "board_counts": counts,
        "board_count_problems": count_problems,
        "arch": board_arch(boards),
        "device_nodes": nodes,
        "pcie_devices": len(nodes) or local_chips,
        "sysfs_devices": sysfs,
        "firmware_versions": fw_versions,
        "firmware_version": fw_versions[0] if fw_versions else None,
        "kmd_version": kmd_sysfs or kmd_smi,
        "kmd_source": "sysfs" if kmd_sysfs else ("tt-smi" if kmd_smi else None),
        "kmd_loaded": kmd_sysfs is not None,
        "hugepages_1g": hugepages_1g(root),
        "iommu": iommu(root),
        "docker": docker if docker is not None else docker_engine(_path(root, DEFAULT_DOCKER_SOCKET)),
        "memory_gb": total_gb,
        "memory_available_gb": available_gb,
        "disk": disk(_path(root, volume_root) if root not in (None, "", "/") else volume_root),
        "implied_device": device,
        "implied_device_reason": reason,
        "declared_device": declared,
        "device_matches": (declared == device) if declared else None,
    }


def gather(
    tt_smi: str = "tt-smi",
    volume_root: str = DEFAULT_VOLUME_ROOT,
    declared_device: str | None = None,
    docker_socket: str = DEFAULT_DOCKER_SOCKET,
    timeout: float = 30,
    path_env: str | None = None,
    root: str | None = "/",
) -> JSON:
    """Run tt-smi, ask Docker and read the host tree; never raises for a missing tool or driver."""
    executable = find_tt_smi(tt_smi, path_env)
    snapshot = None
    error = None
    if executable is None:
        if "/" in tt_smi:
            error = f"{tt_smi} is not an executable file"
        else:
            error = f"{tt_smi} not found in PATH or {', '.join(TT_SMI_DIRS)}"
        error += "; install tt-smi (pip install tt-smi, or tt-installer)"
    else:
        try:
            snapshot = run_tt_smi(executable, timeout=timeout)
        except TtSmiError as exc:
            error = str(exc)
    return assemble(
        snapshot=snapshot,
        tt_smi_error=error,
        tt_smi_path=executable,
        root=root,
        volume_root=volume_root,
        declared_device=declared_device,
        docker=docker_engine(docker_socket, timeout=min(5.0, float(timeout))),
    )
