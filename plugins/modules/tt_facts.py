#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: tt_facts
short_description: Gather facts about the Tenstorrent boards, driver, hugepages, Docker, memory and disk of a host
version_added: 0.1.0
description:
  - Runs C(tt-smi -s) and reports every chip it lists with its board type, PCIe bus id, board id and firmware bundle,
    the chip and board counts, the architecture and the tt-inference-server device these boards make
    (RV(tt.implied_device)), by the rule of tt-inference-server's C(workflows/device_utils.py).
  - Also reports the C(/dev/tenstorrent/<N>) nodes, the kernel driver (KMD) version (from
    C(/sys/module/tenstorrent/version), else from tt-smi), 1 GiB hugepages and the hugetlbfs mount at
    C(/dev/hugepages-1G), IOMMU groups and C(iommu=pt), the Docker engine (asked over its unix socket, no docker CLI
    needed), the memory and the free space of the filesystem that holds O(volume_root).
  - A missing or failing tt-smi, a host without the driver and an unreachable Docker engine are reported in the facts,
    never as a module failure, so that M(ttfleet.inference.tt_preflight) can say what to fix.
  - The facts are returned as RV(tt) and set as C(ansible_facts.tt).
  - Read-only; never changes anything.
extends_documentation_fragment:
  - ttfleet.inference.attributes
  - ttfleet.inference.attributes.info_module
options:
  volume_root:
    description:
      - Directory that holds (or will hold) the tt-inference-server volumes. RV(tt.disk) describes the filesystem of
        this directory or, when it does not exist yet, of its nearest existing parent.
    type: path
    default: /var/lib/tt-cache
  tt_smi:
    description:
      - The tt-smi program. A path is used as given; a bare name is looked up in E(PATH), then in
        C(/opt/tenstorrent/venv/bin) and C(/usr/local/bin), where tt-installer and pip put it.
    type: str
    default: tt-smi
  tt_smi_timeout:
    description:
      - Seconds to wait for C(tt-smi -s). A wedged device can make it hang; it is then reported in
        RV(tt.tt_smi_error).
    type: int
    default: 30
  declared_device:
    description:
      - The tt-inference-server device this host is supposed to be (for example V(p300x2)). When set,
        RV(tt.device_matches) tells whether the boards make that device.
    type: str
  docker_socket:
    description:
      - Unix socket of the Docker engine.
    type: path
    default: /var/run/docker.sock
  packages:
    version_added: 0.3.0
    description:
      - Debian packages to report in RV(tt.installed.packages), read from dpkg's status file.
    type: list
    elements: str
    default: []
  services:
    version_added: 0.3.0
    description:
      - systemd units to report in RV(tt.installed.services) (C(systemctl show)).
    type: list
    elements: str
    default: []
  venv:
    version_added: 0.3.0
    description:
      - A virtual environment whose Python distributions O(distributions) are reported in
        RV(tt.installed.distributions), read from their C(.dist-info) metadata; nothing in the venv runs.
    type: path
  distributions:
    version_added: 0.3.0
    description:
      - Python distributions to look for in O(venv).
    type: list
    elements: str
    default: []
  release_dir:
    version_added: 0.3.0
    description:
      - A path whose existence and link target are reported in RV(tt.installed.release_dir), such as the spec
        directory of the current tt-inference-server release.
    type: path
notes:
  - How boards make a device follows tt-inference-server v0.20.0 (C(BOARD_TYPE_COUNT_TO_DEVICE)). tt-smi lists one entry
    per chip. Wormhole board types end in C(L) (local) or C(R) (remote); an n300 card shows as two chips (C(n300 L),
    C(n300 R)) and a Blackhole p300 card too (two C(p300c)), so n300 and p300 chips are paired into cards and an odd
    count is reported as a problem. Blackhole variant letters are dropped (C(p150a), C(p150b), C(p150c) are all
    V(p150)), which upstream's table misses.
  - Sizes are in GiB (1024^3 bytes), as tt-inference-server counts C(min_disk_gb) and C(min_ram_gb).
  - Ansible's own mount facts skip hugetlbfs; this module reads C(/proc/self/mounts) itself.
seealso:
  - module: ttfleet.inference.tt_preflight
  - name: tt-smi
    description: Tenstorrent System Management Interface, whose snapshot (C(tt-smi -s)) this module reads.
    link: https://github.com/tenstorrent/tt-smi
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
---
- name: Gather Tenstorrent facts
  ttfleet.inference.tt_facts:
    declared_device: p300x2
    volume_root: /opt/tt-cache

- name: Show what the boards make
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.tt.hostname }} is a {{ ansible_facts.tt.implied_device | default('?', true) }}
      with firmware {{ ansible_facts.tt.firmware_version }} and KMD {{ ansible_facts.tt.kmd_version }}

- name: Use tt-smi from a virtual environment
  ttfleet.inference.tt_facts:
    tt_smi: /opt/tt-smi/bin/tt-smi
  register: __tt_facts
"""

RETURN = r"""
tt:
  description: Everything gathered. Also set as C(ansible_facts.tt).
  returned: always
  type: dict
  contains:
    hostname:
      description: Host name.
      type: str
      sample: lab-p300x2-1
    tt_smi_path:
      description: The tt-smi program that was run, V(null) when none was found.
      type: str
      sample: /opt/tenstorrent/venv/bin/tt-smi
    tt_smi_error:
      description:
        - Why tt-smi gave no snapshot (not found, exit status and last message, timeout, bad JSON), else V(null).
      type: str
      sample: "/usr/local/bin/tt-smi -s exited with 1: No Tenstorrent driver detected!"
    tt_smi_version:
      description: Version of tt-smi from its snapshot.
      type: str
      sample: 3.0.39
    boards:
      description: One entry per chip listed by C(tt-smi -s), in its order.
      type: list
      elements: dict
      contains:
        index:
          description: Position in the tt-smi list.
          type: int
        board_type:
          description: Board type as tt-smi prints it.
          type: str
          sample: n300 R
        type:
          description: Normalised board type (lower case, no C(L)/C(R) suffix, no Blackhole variant letter).
          type: str
          sample: n300
        arch:
          description: Chip architecture of the board type, V(null) when unknown.
          type: str
          sample: Wormhole
        remote:
          description: Whether the chip is reached through another chip (C(R) suffix), not over PCIe.
          type: bool
        bus_id:
          description: PCIe bus id, V(null) for remote chips.
          type: str
          sample: "0000:01:00.0"
        board_id:
          description: Board id.
          type: str
        fw_bundle_version:
          description: Firmware bundle version.
          type: str
          sample: 80.17.0.0
    chip_counts:
      description: Chips per normalised board type.
      type: dict
      sample: {n300: 8}
    board_counts:
      description: Boards per normalised board type, n300 and p300 chips paired into cards.
      type: dict
      sample: {n300: 4}
    board_count_problems:
      description: Why a board type was left out of RV(tt.board_counts) (an odd n300 or p300 chip count).
      type: list
      elements: str
    arch:
      description: V(Wormhole), V(Blackhole) or V(Grayskull) when all boards agree, V(mixed), or V(null) without boards.
      type: str
    device_nodes:
      description: The C(/dev/tenstorrent/<N>) nodes, in numeric order.
      type: list
      elements: str
      sample: [/dev/tenstorrent/0, /dev/tenstorrent/1]
    pcie_devices:
      description: Number of PCIe devices, from the device nodes, else from the local chips tt-smi lists.
      type: int
    sysfs_devices:
      description: What the driver reports per device under C(/sys/class/tenstorrent) (C(index), C(card_type),
        C(fw_bundle_version)).
      type: list
      elements: dict
    firmware_versions:
      description: Distinct firmware bundle versions of the boards, lowest first (from sysfs when tt-smi gave none).
      type: list
      elements: str
    firmware_version:
      description: The lowest of RV(tt.firmware_versions), V(null) when unknown.
      type: str
      sample: 19.6.0.0
    installed:
      description:
        - What O(packages), O(services), O(venv) with O(distributions) and O(release_dir) asked for; only with one of
          them. ttfleet.inference.tt_host skips its installation when it says nothing is missing.
      returned: when one of O(packages), O(services), O(distributions), O(release_dir) is set
      type: dict
      contains:
        packages:
          description: Package name to installed version, V(null) when not installed.
          type: dict
          sample: {docker.io: 20.10.24+dfsg1-1+deb12u1, python3-venv: null}
        services:
          description: Unit to its C(active) (ActiveState) and C(enabled) (UnitFileState), V(null) when unknown.
          type: dict
          sample: {docker.service: {active: active, enabled: enabled}}
        distributions:
          description: Distribution name to the version installed in O(venv), V(null) when not installed.
          type: dict
          sample: {tt-smi: 3.0.39, tt-flash: null}
        release_dir:
          description: O(release_dir) with C(exists) (a dangling link counts) and C(link_target), the real path a link
            resolves to.
          type: dict
          sample: {path: /opt/tt-inference-server/current, exists: true,
                   link_target: /opt/tt-inference-server/releases/v0.20.0}
    kmd_version:
      description: Version of the tenstorrent kernel driver, V(null) when unknown.
      type: str
      sample: 2.4.1
    kmd_source:
      description: Where RV(tt.kmd_version) comes from.
      type: str
      choices: [sysfs, tt-smi]
    kmd_loaded:
      description: Whether C(/sys/module/tenstorrent/version) exists, that is the driver is loaded.
      type: bool
    hugepages_1g:
      description: 1 GiB hugepages. C(total) and C(free) are page counts (V(null) when the kernel has no 1 GiB pages),
        C(mounted) tells whether a hugetlbfs is mounted at C(mount_path), C(fstype) is what is mounted there and
        C(pagesize) its C(pagesize=) option.
      type: dict
      sample: {total: 16, free: 16, mounted: true, mount_path: /dev/hugepages-1G, fstype: hugetlbfs, pagesize: 1G}
    iommu:
      description: C(groups) (number of IOMMU groups), C(enabled) (any group) and C(cmdline_pt) (C(iommu=pt) on the
        kernel command line).
      type: dict
      sample: {groups: 42, enabled: true, cmdline_pt: true}
    docker:
      description: The Docker engine, asked C(GET /version) on O(docker_socket). C(reachable), C(version),
        C(api_version), C(error) (why it is not reachable) and C(socket).
      type: dict
      sample: {reachable: true, version: 20.10.24, api_version: "1.41", error: null, socket: /var/run/docker.sock}
    memory_gb:
      description: Total memory in GiB (C(MemTotal)).
      type: float
    memory_available_gb:
      description: Available memory in GiB (C(MemAvailable)).
      type: float
    disk:
      description: The filesystem of O(volume_root). C(volume_root), C(path) (the directory measured, O(volume_root)
        or its nearest existing parent), C(free_gb) and C(total_gb) in GiB, C(error).
      type: dict
      sample: {volume_root: /var/lib/tt-cache, path: /var/lib, free_gb: 812.4, total_gb: 1831.8, error: null}
    implied_device:
      description: The tt-inference-server device the boards make (V(n150), V(n300), V(t3k), V(galaxy), V(p150),
        V(p150x4), V(p150x8), V(p300), V(p300x2), V(blackhole_galaxy), ...), V(null) when none.
      type: str
      sample: p300x2
    implied_device_reason:
      description: Why RV(tt.implied_device) is V(null), else V(null).
      type: str
    declared_device:
      description: O(declared_device) in lower case.
      type: str
    device_matches:
      description: Whether RV(tt.implied_device) equals O(declared_device); V(null) when O(declared_device) is not set.
      type: bool
ansible_facts:
  description: Facts set on the host.
  returned: always
  type: dict
  contains:
    tt:
      description: The same dict as RV(tt).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._host.collect import OPTIONS, CollectError, collect


def main() -> None:
    module = AnsibleModule(argument_spec=OPTIONS, supports_check_mode=True)
    try:
        facts = collect(module.params)
    except CollectError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, tt=facts, ansible_facts={"tt": facts})


if __name__ == "__main__":
    main()
