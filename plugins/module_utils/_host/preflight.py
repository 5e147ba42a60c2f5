# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Preflight checks of a Tenstorrent host against the models it should serve.

Private to the collection. Standard library only. Works on the ``tt`` facts of ``tt_facts`` and
on the per-model summaries of ``_plan.preflight.model_summaries`` (spec requirements, weights present).
Every finding names the host, the model, the requirement, the measured value and the fix. Version
specifiers are evaluated by ``pep440``.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._host.pep440 import check_specifier
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.devices import device_row

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    # A dict from Ansible or JSON: tt facts, a model entry, a summary, a finding.
    JSON = dict[str, Any]


CHECK_NAMES = ("device_type", "hugepages", "hugepages_pages", "docker", "disk", "ram", "firmware", "kmd")
LEVELS = ("fail", "warn", "skip")
DEFAULT_LEVELS = {name: "fail" for name in CHECK_NAMES}
# Lab and cloud kernels often reserve no 1 GiB pages although the mount exists; the containers
# still start, tt-metal then falls back, so a low count is worth a warning only.
DEFAULT_LEVELS["hugepages_pages"] = "warn"
HUGEPAGES_PER_DEVICE = 4
HUGEPAGES_MOUNT = "/dev/hugepages-1G"
DEFAULT_DISK_MARGIN_GB = 10
# tt-inference-server's VersionMode: STRICT refuses to start, SUGGESTED only warns.
SUGGESTED = "SUGGESTED"


class PreflightError(FleetError):
    """Inputs that make the preflight impossible; the message says which and how to fix them."""


# ---------------------------------------------------------------------------
# Inputs


def check_levels(checks: Mapping[str, Any] | None) -> dict[str, str]:
    """Levels of every check: the defaults overridden by ``checks``; raises PreflightError."""
    levels = dict(DEFAULT_LEVELS)
    for name, level in (checks or {}).items():
        if name not in CHECK_NAMES:
            close = difflib.get_close_matches(str(name), CHECK_NAMES, n=2)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise PreflightError(f"checks: unknown check {name!r}.{hint} Known checks: {', '.join(CHECK_NAMES)}.")
        if level not in LEVELS:
            raise PreflightError(f"checks: {name} is {level!r}; use one of {', '.join(LEVELS)}.")
        levels[name] = level
    return levels


def present_models(models: Iterable[object] | None) -> list[JSON]:
    """The entries of ``models`` with state present (the default); raises PreflightError for bad entries."""
    chosen: list[JSON] = []
    for index, entry in enumerate(models or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise PreflightError(
                f"models[{index}] must be a dict with a name (and optionally impl, engine, state), got {entry!r}."
            )
        if entry.get("state", "present") == "present":
            chosen.append(entry)
    return chosen


def unwrap_facts(facts: object) -> JSON:
    """The ``tt`` dict, given it or a whole tt_facts result."""
    if not isinstance(facts, dict):
        raise PreflightError("facts must be the result of ttfleet.inference.tt_facts (a dict).")
    if isinstance(facts.get("tt"), dict):
        return facts["tt"]
    if isinstance((facts.get("ansible_facts") or {}).get("tt"), dict):
        return facts["ansible_facts"]["tt"]
    return facts


# ---------------------------------------------------------------------------
# Checks


def _num(value: float | None) -> str:
    """``84``, ``12.3``: numbers as people read them."""
    if value is None:
        return "unknown"
    value = round(float(value), 1)
    return str(int(value)) if value == int(value) else f"{value:.1f}"


def _boards_text(facts: Mapping[str, Any]) -> str:
    counts: dict[str, int] = {}
    for board in facts.get("boards") or []:
        counts[board.get("board_type") or "?"] = counts.get(board.get("board_type") or "?", 0) + 1
    return ", ".join(f"{count} x {name}" for name, count in sorted(counts.items())) or "none"


class _Findings:
    def __init__(self, host: str, levels: Mapping[str, str]) -> None:
        self.host = host
        self.levels = levels
        self.failures: list[JSON] = []
        self.warnings: list[JSON] = []
        self.flagged: set[str] = set()

    def add(
        self,
        check: str,
        problem: str,
        fix: str,
        model: str | None = None,
        requirement: str | None = None,
        measured: str | None = None,
        downgrade: bool = False,
    ) -> None:
        level = self.levels[check]
        if level == "skip":
            return
        if downgrade:
            level = "warn"
        finding = {
            "check": check,
            "model": model,
            "requirement": requirement,
            "measured": measured,
            "fix": fix,
            "msg": f"{self.host}: {problem}. Fix: {fix}.",
        }
        (self.failures if level == "fail" else self.warnings).append(finding)
        self.flagged.add(check)


def required_boards(summaries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The boards the models ask for (a package's or entry's ``boards``, ``{type: count}``), the most of each type."""
    wanted: dict[str, int] = {}
    for summary in summaries:
        boards = summary.get("boards") or {}
        if not isinstance(boards, dict):
            raise PreflightError(
                f"tt_models entry {summary.get('name')}: boards {boards!r} must be a mapping of board type to count, "
                "for example {p150: 2}."
            )
        for board_type, count in boards.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise PreflightError(
                    f"tt_models entry {summary.get('name')}: boards {board_type} = {count!r} must be a positive count."
                )
            kind = str(board_type).lower()
            wanted[kind] = max(wanted.get(kind, 0), count)
    return wanted


def _board_counts(facts: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for board in facts.get("boards") or []:
        if board.get("remote"):
            continue
        kind = str(board.get("type") or board.get("board_type") or "?").lower()
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _check_declared_boards(out: _Findings, facts: Mapping[str, Any], declared: str, wanted: Mapping[str, int]) -> None:
    """A device tt-inference-server does not know: the boards the models' specs ask for, exactly."""
    counts = _board_counts(facts)
    text = ", ".join(f"{count} x {kind}" for kind, count in sorted(wanted.items()))
    if counts != dict(wanted):
        found = ", ".join(f"{count} x {kind}" for kind, count in sorted(counts.items())) or "none"
        out.add(
            "device_type",
            f"declared device {declared} needs the boards its models' specs ask for ({text}), but tt-smi lists {found}",
            f"install and link the boards the package describes ({text}), or serve these models on a host that has "
            "them",
            requirement=text,
            measured=found,
        )


def _check_device_type(
    out: _Findings, facts: Mapping[str, Any], declared: str | None, wanted: Mapping[str, int] | None = None
) -> None:
    implied = facts.get("implied_device")
    requirement = f"device {declared}" if declared else "a known device"
    if declared and wanted and device_row(declared) is None and facts.get("boards"):
        _check_declared_boards(out, facts, declared, wanted)
        return
    if not facts.get("boards"):
        error = facts.get("tt_smi_error") or "tt-smi lists no devices"
        nodes = facts.get("device_nodes") or []
        out.add(
            "device_type",
            f"no Tenstorrent boards found (tt-smi: {error}; {len(nodes)} /dev/tenstorrent nodes)"
            + (f", but the host is declared as {declared}" if declared else ""),
            "install tenstorrent-dkms (the KMD) and tt-smi (tt-installer), check that the cards show up in "
            "lspci and /dev/tenstorrent, then rerun",
            requirement=requirement,
            measured="no boards",
        )
    elif implied is None:
        out.add(
            "device_type",
            f"the boards ({_boards_text(facts)}) make no known device: {facts.get('implied_device_reason')}",
            "make every board visible to tt-smi -s (reset with tt-smi -r, reseat cards and cables)"
            + (f", or declare a device that matches the hardware instead of {declared}" if declared else ""),
            requirement=requirement,
            measured=_boards_text(facts),
        )
    elif declared and declared.lower() != implied:
        out.add(
            "device_type",
            f"declared device {declared} but the boards ({_boards_text(facts)}) make a {implied}",
            f"declare this host as {implied} (inventory group or device variable), or check that tt-smi -s "
            f"lists every board of a {declared}",
            requirement=requirement,
            measured=implied,
        )


def _check_hugepages(out: _Findings, facts: Mapping[str, Any]) -> None:
    pages = facts.get("hugepages_1g") or {}
    mount_path = pages.get("mount_path") or HUGEPAGES_MOUNT
    fix = (
        "install tenstorrent-tools (tenstorrent-hugepages.service and dev-hugepages\\x2d1G.mount) and reboot, "
        "or run: systemctl start 'dev-hugepages\\x2d1G.mount'"
    )
    if not pages.get("mounted"):
        found = f"a {pages['fstype']} mount" if pages.get("fstype") else "nothing mounted"
        out.add(
            "hugepages",
            f"no hugetlbfs at {mount_path} ({found}); the inference containers bind it",
            fix,
            requirement=f"hugetlbfs mounted at {mount_path}",
            measured=pages.get("fstype") or "not mounted",
        )
    elif pages.get("pagesize") not in (None, "1G", "1024M"):
        out.add(
            "hugepages",
            f"{mount_path} is a hugetlbfs with pagesize={pages['pagesize']}, not 1G",
            fix,
            requirement="pagesize=1G",
            measured=f"pagesize={pages['pagesize']}",
        )


def _check_hugepages_pages(out: _Findings, facts: Mapping[str, Any]) -> None:
    pages = facts.get("hugepages_1g") or {}
    devices = max(1, int(facts.get("pcie_devices") or 0))
    wanted = HUGEPAGES_PER_DEVICE * devices
    total = pages.get("total")
    requirement = f"{wanted} x 1 GiB hugepages ({HUGEPAGES_PER_DEVICE} per PCIe device x {devices})"
    if total is None:
        out.add(
            "hugepages_pages",
            "the kernel offers no 1 GiB hugepages (no /sys/kernel/mm/hugepages/hugepages-1048576kB)",
            "use a CPU and kernel with 1 GiB page support (pdpe1gb) and add hugepagesz=1G to the kernel command line",
            requirement=requirement,
            measured="not supported",
        )
    elif total < wanted:
        out.add(
            "hugepages_pages",
            f"{total} x 1 GiB hugepages reserved ({pages.get('free')} free), {wanted} wanted "
            f"({HUGEPAGES_PER_DEVICE} per PCIe device x {devices})",
            "restart tenstorrent-hugepages.service or reboot; when memory is too fragmented at runtime add "
            f"hugepagesz=1G hugepages={wanted} to the kernel command line",
            requirement=requirement,
            measured=f"{total} reserved, {pages.get('free')} free",
        )


def _check_docker(out: _Findings, facts: Mapping[str, Any]) -> None:
    docker = facts.get("docker") or {}
    if not docker.get("reachable"):
        out.add(
            "docker",
            f"Docker engine not reachable: {docker.get('error') or 'no answer'}",
            "install Docker and start it (systemctl enable --now docker), and run as root or a docker group member",
            requirement="Docker engine answering on " + (docker.get("socket") or "/var/run/docker.sock"),
            measured="unreachable",
        )


def _check_disk(
    out: _Findings, facts: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]], margin: float
) -> None:
    if not summaries:
        return
    space = facts.get("disk") or {}
    where = space.get("volume_root") or space.get("path") or "the volume root"
    counted = [m for m in summaries if m["counted_disk_gb"]]
    needed = sum(m["counted_disk_gb"] for m in counted) + margin
    free = space.get("free_gb")
    if free is not None and needed <= free:
        return
    if len(counted) == 1:
        parts = f"min_disk_gb {_num(counted[0]['counted_disk_gb'])}"
    else:
        parts = " + ".join(f"min_disk_gb {_num(m['counted_disk_gb'])} for {m['name']}" for m in counted)
    basis = f"{parts} + margin {_num(margin)}" if parts else f"margin {_num(margin)}, all weights present"
    measured = f"{_num(free)} GB free" if free is not None else f"free space unknown ({space.get('error')})"
    subject = counted[0]["name"] if len(counted) == 1 else "the models"
    out.add(
        "disk",
        f"{subject} need{'s' if len(counted) == 1 else ''} {_num(needed)} GB free on {where} ({basis}), {measured}",
        "free space, point the volume root at a bigger filesystem, or pre-seed the weights",
        model=counted[0]["name"] if len(counted) == 1 else None,
        requirement=f"{_num(needed)} GB free on {where}",
        measured=measured,
    )


def _check_ram(out: _Findings, facts: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]]) -> None:
    # As run.py: the RAM floor is for fetching and converting weights, so models whose weights are
    # already on the host (in the expected volume or one to alias) need none.
    needing = [m for m in summaries if m["min_ram_gb"] and not m["weights_present"]]
    if not needing:
        return
    needed = sum(m["min_ram_gb"] for m in needing)
    have = facts.get("memory_gb")
    if have is not None and needed <= have:
        return
    if len(needing) == 1:
        parts = _num(needing[0]["min_ram_gb"])
    else:
        parts = " + ".join(f"{_num(m['min_ram_gb'])} for {m['name']}" for m in needing)
    subject = needing[0]["name"] if len(needing) == 1 else "the models"
    out.add(
        "ram",
        f"{subject} need{'s' if len(needing) == 1 else ''} {_num(needed)} GB RAM (min_ram_gb {parts}), "
        f"the host has {_num(have)} GB",
        "serve fewer or smaller models on this host, or add memory",
        model=needing[0]["name"] if len(needing) == 1 else None,
        requirement=f"{_num(needed)} GB RAM",
        measured=f"{_num(have)} GB",
    )


def _requirement(summary: Mapping[str, Any], key: str) -> tuple[Any, str]:
    requirement = (summary.get("system_requirements") or {}).get(key) or {}
    return requirement.get("specifier"), str(requirement.get("mode") or "STRICT").upper()


def _check_firmware(out: _Findings, facts: Mapping[str, Any], summaries: Iterable[Mapping[str, Any]]) -> None:
    versions = list(facts.get("firmware_versions") or [])
    if len(versions) > 1:
        out.add(
            "firmware",
            f"the boards run different firmware bundles ({', '.join(versions)}); tt-inference-server requires "
            "one bundle on every device",
            "flash every board with the same bundle (tt-flash) and reboot",
            requirement="one firmware bundle",
            measured=", ".join(versions),
        )
    for summary in summaries:
        specifier, mode = _requirement(summary, "firmware")
        if not specifier:
            continue
        bad: list[str] = []
        for version in versions:
            ok, reason = check_specifier(version, specifier)
            if not ok:
                # check_specifier gives a reason whenever the version fails.
                bad.append(cast(str, reason))
        if versions and not bad:
            continue
        measured = ", ".join(versions) if versions else "unknown"
        if versions:
            found = f"the boards run {measured} ({'; '.join(bad)})"
        else:
            found = f"no board reports a firmware version ({len(facts.get('boards') or [])} boards found)"
        out.add(
            "firmware",
            f"{summary['name']} needs firmware bundle {specifier} ({mode} in its spec), {found}",
            f"flash a firmware bundle that satisfies {specifier} with tt-flash and reboot, or pin a release "
            "whose spec accepts this firmware",
            model=summary["name"],
            requirement=specifier,
            measured=measured,
            downgrade=mode == SUGGESTED,
        )


def _check_kmd(out: _Findings, facts: Mapping[str, Any], summaries: Iterable[Mapping[str, Any]]) -> None:
    version = facts.get("kmd_version")
    for summary in summaries:
        specifier, mode = _requirement(summary, "kmd")
        if not specifier:
            continue
        if version:
            ok, reason = check_specifier(version, specifier)
            if ok:
                continue
        else:
            reason = "the tenstorrent kernel module is not loaded"
        measured = version or "none"
        out.add(
            "kmd",
            f"{summary['name']} needs KMD {specifier} ({mode} in its spec), the host runs {measured} ({reason})",
            f"install a tenstorrent-dkms that satisfies {specifier} and reboot (or reload the tenstorrent module)",
            model=summary["name"],
            requirement=specifier,
            measured=measured,
            downgrade=mode == SUGGESTED,
        )


def evaluate(
    facts: Mapping[str, Any],
    summaries: Sequence[Mapping[str, Any]],
    levels: Mapping[str, str] | None = None,
    host: str | None = None,
    declared_device: str | None = None,
    disk_margin_gb: float = DEFAULT_DISK_MARGIN_GB,
) -> JSON:
    """Run every check; returns ``{failures, warnings, passed, skipped}``.

    A check passes when it ran and found nothing; a SUGGESTED spec requirement that is not met
    is a warning whatever the check's level.
    """
    levels = levels or dict(DEFAULT_LEVELS)
    host = host or facts.get("hostname") or "this host"
    declared = declared_device or facts.get("declared_device")
    out = _Findings(host, levels)
    _check_device_type(out, facts, declared, required_boards(summaries))
    _check_hugepages(out, facts)
    _check_hugepages_pages(out, facts)
    _check_docker(out, facts)
    _check_disk(out, facts, summaries, disk_margin_gb)
    _check_ram(out, facts, summaries)
    _check_firmware(out, facts, summaries)
    _check_kmd(out, facts, summaries)
    return {
        "failures": out.failures,
        "warnings": out.warnings,
        "passed": [name for name in CHECK_NAMES if levels[name] != "skip" and name not in out.flagged],
        "skipped": [name for name in CHECK_NAMES if levels[name] == "skip"],
    }
