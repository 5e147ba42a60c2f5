#!/usr/bin/env python
"""Simulated Tenstorrent lab hosts: systemd containers that look like n150 ... p300x2 machines.

Lab only, never used by roles or plugins. Each host is a Debian 12 container with systemd as PID 1,
`/dev/tenstorrent/<N>` character devices matching its device type's PCIe chip count, a hugetlbfs
mount at /dev/hugepages-1G, and a `tt-smi -s` stand-in that prints a snapshot shaped like the real
one. `up` writes inventories/lab/hosts.yml with one group per device type. Every host runs sshd and has the admin
user operators log in as (`ttadmin`: key login, sudo without a password, README "Hosts and access"); the inventory
reaches the hosts over SSH with `become` (or through `docker exec` as root with --connection docker).

    tests/lab/lab.py up [--hosts n150,n300,p300x2] [--connection ssh|docker]
                                                     start (or reuse) hosts, write the inventory
    tests/lab/lab.py down                            remove every lab host and the inventory
    tests/lab/lab.py status                          list lab hosts
    tests/lab/lab.py provision NAME=DEVICE ...       add the stand-ins to running containers
    tests/lab/lab.py admin NAME ... --inventory FILE --known-hosts FILE
                                                     give running containers the admin user and write what the
                                                     controller needs to reach them over SSH (molecule's prepare)
    tests/lab/lab.py fault NAME --device D [--boards D2] [--firmware V] [--kmd V] [--no-hugepages] [--reset]
    tests/lab/lab.py serve-image --tag IMAGE [--tag IMAGE ...] [--copy NAME:PATH ...]
                                                     build the lab inference image of each name (upstream's
                                                     start-up code of its release, tests/lab/upstream_image),
                                                     `docker save` them (cached) and copy the tarball into
                                                     running hosts; prints the tarball's path
"""
import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")
LABEL = "ttfleet.lab"
NETWORK = "ttfleet-lab"
IMAGE_SCRIPT = os.path.join(ROOT, "tests", "lab", "build-image.sh")
TTIS_REPO_SCRIPT = os.path.join(ROOT, "tests", "lab", "ttis_repo.py")
TTIS_LAB = os.path.join(ROOT, ".cache", "ttis-lab")
SERVE_IMAGE_CACHE = os.path.join(ROOT, ".cache", "serve-image")
# /var/lib/docker of each host's own Docker engine, on the machine's filesystem: inside the container's
# overlay the engine could only use vfs (a full image copy per container start).
HOST_DOCKER_DIRS = os.path.join(ROOT, ".cache", "lab-docker")
# Where each lab host finds its tt-inference-server mirror and a PyPI-free wheelhouse
# (inventories/lab/group_vars/all.yml points the inference_server role there).
HOST_LAB_DIR = "/var/lib/ttfleet-lab"

# The admin user operators reach their hosts as (README, "Hosts and access"): an unprivileged login with an SSH key,
# root through sudo without a password. Not uid 1000: that is the QuietBox's first user `tt` (QB2_SCRIPT), who owns the
# factory volume, and the user the forge images run as.
ADMIN_USER = "ttadmin"
ADMIN_UID = 1500
# The lab's key, made once per checkout on the controller (never committed: .cache is ignored), and the known_hosts of
# the lab inventory: each host's own ed25519 host key, read from the host as it is provisioned.
SSH_DIR = os.path.join(ROOT, ".cache", "lab-ssh")
SSH_KEY = os.path.join(SSH_DIR, "id_ed25519")
LAB_KNOWN_HOSTS = os.path.join(SSH_DIR, "known_hosts")
CONNECTIONS = ("ssh", "docker")

# TTIS device name -> what the hardware looks like: PCIe chips (= /dev/tenstorrent nodes) and the
# tt-smi `device_info` entries. tt-smi suffixes every Wormhole chip " L" (PCIe) or " R" (remote: an
# n300's second chip), Blackhole chips get none, and a p300 card shows as two chips.
DEVICES = {
    "n150": {"pcie": 1, "boards": [("n150 L", 1)], "arch": "Wormhole"},
    "n300": {"pcie": 1, "boards": [("n300 L", 1), ("n300 R", 1)], "arch": "Wormhole"},
    "t3k": {"pcie": 4, "boards": [("n300 L", 4), ("n300 R", 4)], "arch": "Wormhole"},
    "galaxy": {"pcie": 32, "boards": [("tt-galaxy-wh L", 32)], "arch": "Wormhole"},
    "p150": {"pcie": 1, "boards": [("p150a", 1)], "arch": "Blackhole"},
    "p150x4": {"pcie": 4, "boards": [("p150a", 4)], "arch": "Blackhole"},
    "p150x8": {"pcie": 8, "boards": [("p150a", 8)], "arch": "Blackhole"},
    "p300": {"pcie": 2, "boards": [("p300c", 2)], "arch": "Blackhole"},
    "p300x2": {"pcie": 4, "boards": [("p300c", 4)], "arch": "Blackhole"},
}
DEFAULT_HOSTS = "n150,p150x4,p300x2"
FW_BUNDLE = {"Wormhole": "80.17.0.0", "Blackhole": "19.6.0.0"}
KMD_VERSION = "2.6.0"
TT_MAJOR = 240  # any free char major: the lab has no driver, only the nodes matter


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def docker(*args, check=True, capture=True, stdin=None):
    proc = subprocess.run(
        ["docker", *args], check=False, text=True, input=stdin,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
    )
    if check and proc.returncode != 0:
        raise SystemExit(f"docker {' '.join(args)} failed: {(proc.stderr or '').strip()}")
    return proc


def snapshot(device, hostname):
    spec = DEVICES[device]
    boards = []
    bus = 0
    for board_type, count in spec["boards"]:
        for _chip in range(count):
            remote = board_type.endswith(" R")
            boards.append({
                "smbus_telem": {"BOARD_ID": f"0x10001{bus:011x}"},
                "board_info": {
                    "bus_id": "N/A" if remote else f"0000:{bus + 1:02x}:00.0",
                    "board_type": board_type,
                    "board_id": f"010001{bus:010x}",
                    "coords": "N/A",
                    "dram_status": True,
                    "dram_speed": "12G" if spec["arch"] == "Wormhole" else "16G",
                    "pcie_speed": "N/A" if remote else (4 if spec["arch"] == "Wormhole" else 5),
                    "pcie_width": "N/A" if remote else "16",
                },
                "telemetry": {"voltage": "0.80", "current": " 23.0", "power": " 18.0",
                              "aiclk": " 500", "asic_temperature": "42.3", "heartbeat": "51234"},
                "firmwares": {"fw_bundle_version": FW_BUNDLE[spec["arch"]], "tt_flash_version": "3.1.0.0",
                              "cm_fw": "2.33.0.0", "cm_fw_date": "2025-05-09", "eth_fw": "7.0.0",
                              "bm_bl_fw": "129.2.0.0", "bm_app_fw": "5.12.0.0"},
                "limits": {"vdd_min": "0.70", "vdd_max": "0.95", "tdp_limit": " 85",
                           "tdc_limit": "160", "asic_fmax": "1000"},
            })
            bus += 1
    return {
        "time": "",
        "host_info": {
            "OS": "Linux", "Distro": "Debian GNU/Linux 12 (bookworm)", "Kernel": os.uname().release,
            "Hostname": hostname, "Platform": "x86_64", "Python": "3.11.2",
            "Memory": "24.00 GB", "Driver": f"TT-KMD {KMD_VERSION}",
        },
        "host_sw_vers": {"tt_smi": "3.0.39", "pyluwen": "0.7.16"},
        "device_info": boards,
    }


# A QuietBox 2 leaves the factory with Qwen3-32B under a build label, not the name TTIS expects
# (62 GB of weights and ~30 GB of kernels on real hosts; a few bytes per file here).
QB2_VOLUME = "/home/tt/data/tt-cache/volume_id_tt_transformers-Qwen3-32B-vqb2_launch"
QB2_SCRIPT = f"""set -e
id tt >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash tt
if [ ! -d {QB2_VOLUME} ]; then
  mkdir -p {QB2_VOLUME}/weights/Qwen3-32B {QB2_VOLUME}/tt_metal_cache/cache_Qwen3-32B/P300x2
  cd {QB2_VOLUME}/weights/Qwen3-32B
  for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors config.json tokenizer.json \\
           tokenizer_config.json generation_config.json; do echo "factory $f" > $f; done
  echo "factory kernels" > {QB2_VOLUME}/tt_metal_cache/cache_Qwen3-32B/P300x2/kernels.bin
  chown -R 1000:1000 /home/tt/data
fi
"""


# What the KMD (device nodes) and tenstorrent-tools (the hugepages mount unit) give a real host at every
# boot, so that a restarted lab host comes back like a rebooted machine.
DEVICES_UNIT = """[Unit]
Description=ttfleet lab stand-in for the Tenstorrent KMD: /dev/tenstorrent nodes
DefaultDependencies=no
Before=docker.service sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh /etc/ttfleet-lab/devices.sh

[Install]
WantedBy=sysinit.target
"""
HUGEPAGES_UNIT = """[Unit]
Description=1G huge pages (ttfleet lab copy of tenstorrent-tools' unit)
DefaultDependencies=no
Before=sysinit.target

[Mount]
What=hugetlbfs
Where=/dev/hugepages-1G
Type=hugetlbfs
Options=pagesize=1G,mode=1770

[Install]
WantedBy=sysinit.target
"""


def provision_script(device):
    pcie = DEVICES[device]["pcie"]
    return f"""set -e
mkdir -p /etc/ttfleet-lab
cat > /etc/ttfleet-lab/devices.sh <<'SH'
mkdir -p /dev/tenstorrent /dev/hugepages-1G
for n in $(seq 0 {pcie - 1}); do [ -e /dev/tenstorrent/$n ] || mknod -m 0666 /dev/tenstorrent/$n c {TT_MAJOR} $n; done
SH
sh /etc/ttfleet-lab/devices.sh
cat > /etc/systemd/system/ttfleet-lab-devices.service <<'UNIT'
{DEVICES_UNIT}UNIT
cat > '/etc/systemd/system/dev-hugepages\\x2d1G.mount' <<'UNIT'
{HUGEPAGES_UNIT}UNIT
systemctl daemon-reload
systemctl enable -q ttfleet-lab-devices.service 'dev-hugepages\\x2d1G.mount'
findmnt /dev/hugepages-1G >/dev/null || mount -t hugetlbfs -o pagesize=1G,mode=1770 hugetlbfs /dev/hugepages-1G
echo {device} > /etc/ttfleet-lab/device
"""


def wait_for_systemd(name, limit=120):
    """Wait for the host's systemd to finish booting, at most ``limit`` seconds in all. Each `is-system-running --wait`
    is bounded too: it blocks for as long as a job hangs (a host past the machine's inotify limit never finished)."""
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        proc = docker("exec", name, "timeout", str(max(1, int(left))), "systemctl", "is-system-running", "--wait",
                      check=False)
        if proc.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(1)
    raise SystemExit(f"{name}: systemd did not come up within {limit} s (a machine with many systemd containers may "
                     "need a higher fs.inotify.max_user_instances: sysctl -w fs.inotify.max_user_instances=1024)")


def lab_containers():
    fmt = '{{.Names}}\t{{.State}}\t{{.Image}}\t{{.Label "ttfleet.lab.device"}}'
    proc = docker("ps", "-a", "--filter", f"label={LABEL}", "--format", fmt)
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line.strip()]
    return {name: {"state": state, "image": image, "device": device} for name, state, image, device in rows}


def ensure_image(*flavour):
    """The lab image's tag (build-image.sh builds it when missing); ``"--standin"`` for the stand-in image's base."""
    proc = subprocess.run([IMAGE_SCRIPT, *flavour], check=True, text=True, stdout=subprocess.PIPE)
    return proc.stdout.strip().splitlines()[-1]


def host_docker_dir(name):
    return os.path.join(HOST_DOCKER_DIRS, name)


def start_host(name, device, image, sysctls=()):
    """Start the systemd container of a lab host. ``sysctls``: ``("net.ipv4.tcp_wmem=4096 16384 65536", ...)``, the
    namespaced settings of its network, given at creation (a running container's /proc/sys is read-only)."""
    shutil.rmtree(host_docker_dir(name), ignore_errors=True)
    os.makedirs(host_docker_dir(name))
    docker(
        "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK,
        "--label", LABEL, "--label", f"ttfleet.lab.device={device}",
        *[arg for setting in sysctls for arg in ("--sysctl", setting)],
        "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt", "seccomp=unconfined", "--cgroupns=host",
        "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", f"{host_docker_dir(name)}:/var/lib/docker",
        "--tmpfs", "/run", "--tmpfs", "/run/lock",
        "--tmpfs", "/tmp", "--stop-signal", "SIGRTMIN+3", image, "/lib/systemd/systemd",
    )


def trust_host_cas(name):
    """Give the host's extra CA certificates (and pip's cert setting) to the container.

    Where the machine reaches PyPI and Debian's mirror through a TLS-inspecting proxy, lab hosts
    need the same trust anchors as the machine itself to install anything.
    """
    extra = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    for cert in extra:
        docker("cp", cert, f"{name}:/usr/local/share/ca-certificates/{os.path.basename(cert)}")
    if extra:
        docker("exec", name, "update-ca-certificates", "--fresh")
    if os.path.isfile("/etc/pip.conf"):
        docker("cp", "/etc/pip.conf", f"{name}:/etc/pip.conf")


def write_snapshot(name, data):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(data, handle, indent=2)
    try:
        docker("cp", handle.name, f"{name}:/etc/ttfleet-lab/tt-smi-snapshot.json")
    finally:
        os.unlink(handle.name)


def publish_ttis_mirror(name):
    """A bare mirror of the lab's tt-inference-server repository on the host, as a site mirror would be."""
    docker("exec", name, "mkdir", "-p", HOST_LAB_DIR)
    docker("cp", os.path.join(TTIS_LAB, "tt-inference-server.bundle"), f"{name}:{HOST_LAB_DIR}/")
    docker("cp", os.path.join(TTIS_LAB, "wheels"), f"{name}:{HOST_LAB_DIR}/")
    docker("exec", name, "sh", "-c",
           f"rm -rf {HOST_LAB_DIR}/tt-inference-server.git && "
           f"git clone -q --mirror {HOST_LAB_DIR}/tt-inference-server.bundle {HOST_LAB_DIR}/tt-inference-server.git")


def warm_apt_archive(name):
    """Copy the lab's warm APT archive (tests/lab/build-image.sh: .cache/lab-debs/<recipe hash>) into the host.

    The archive is the one of the host's own Debian release (a Debian 13 host gets trixie's .debs).
    """
    codename = docker("exec", name, "sh", "-c", ". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    recipe = ensure_image("--suite", codename).rsplit("-", 1)[-1]
    debs = os.path.join(ROOT, ".cache", "lab-debs", recipe)
    if os.path.isdir(debs):
        docker("cp", f"{debs}/.", f"{name}:/var/cache/apt/archives/")


def provision(name, device):
    wait_for_systemd(name)
    trust_host_cas(name)
    warm_apt_archive(name)
    docker("exec", "-i", name, "sh", "-s", stdin=provision_script(device))
    write_snapshot(name, snapshot(device, name))
    publish_ttis_mirror(name)
    if device == "p300x2":
        docker("exec", "-i", name, "sh", "-s", stdin=QB2_SCRIPT)


def ssh_key():
    """The path of the lab's admin key (ed25519, 0600, no passphrase), made on first use under .cache/lab-ssh."""
    with cache_lock("lab-ssh"):
        if not os.path.exists(SSH_KEY):
            os.makedirs(SSH_DIR, mode=0o700, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="key.", dir=SSH_DIR)
            try:
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ttfleet-lab-admin",
                                "-f", os.path.join(tmp, "key")], check=True, stdout=subprocess.DEVNULL)
                # The public half first: a private key never exists without it.
                os.replace(os.path.join(tmp, "key.pub"), SSH_KEY + ".pub")
                os.replace(os.path.join(tmp, "key"), SSH_KEY)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return SSH_KEY


def admin_script(public_key):
    """The admin user with the key in authorized_keys and sudo as the README asks of operators' hosts: NOPASSWD, and no
    `requiretty` (with it sudo refuses Ansible's pipelined modules, which run without a terminal: molecule fleet's
    verify shows both)."""
    sudoers = f"{ADMIN_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
    home = f"/home/{ADMIN_USER}"
    return f"""set -e
id {ADMIN_USER} >/dev/null 2>&1 || useradd -m -u {ADMIN_UID} -s /bin/bash {ADMIN_USER}
install -d -m 0700 -o {ADMIN_USER} -g {ADMIN_USER} {home}/.ssh
printf '%s\\n' '{public_key}' > {home}/.ssh/authorized_keys.new
chown {ADMIN_USER}:{ADMIN_USER} {home}/.ssh/authorized_keys.new
chmod 0600 {home}/.ssh/authorized_keys.new
mv {home}/.ssh/authorized_keys.new {home}/.ssh/authorized_keys
printf '{sudoers}' > /etc/sudoers.d/ttfleet-lab-admin.new
chmod 0440 /etc/sudoers.d/ttfleet-lab-admin.new
visudo -cqf /etc/sudoers.d/ttfleet-lab-admin.new
mv /etc/sudoers.d/ttfleet-lab-admin.new /etc/sudoers.d/ttfleet-lab-admin
"""


def host_address(name):
    """The container's address on its (first) Docker network: what the controller's ssh connects to."""
    text = docker("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name).stdout
    addresses = text.split()
    if not addresses:
        raise SystemExit(f"{name}: the container has no address on a Docker network")
    return addresses[0]


def add_admin(name):
    """Give a running lab host the admin user; returns its known_hosts line (address and its own host key)."""
    with open(ssh_key() + ".pub", encoding="utf-8") as handle:
        public_key = handle.read().strip()
    docker("exec", "-i", name, "sh", "-s", stdin=admin_script(public_key))
    # sshd makes the host's own key as it starts (tests/lab/build-image.sh); systemd may still be starting it.
    for _attempt in range(30):
        proc = docker("exec", name, "sh", "-c", "systemctl is-active -q ssh && cat /etc/ssh/ssh_host_ed25519_key.pub",
                      check=False)
        if proc.returncode == 0 and proc.stdout.startswith("ssh-ed25519 "):
            key_type, key = proc.stdout.split()[:2]
            return f"{host_address(name)} {key_type} {key}"
        time.sleep(1)
    journal = docker("exec", name, "journalctl", "-u", "ssh", "-n", "20", "--no-pager", check=False).stdout
    raise SystemExit(f"{name}: sshd did not start within 30 s: {journal.strip()[-1500:]}")


def ssh_vars(known_hosts):
    """The connection variables of a lab host over SSH, as an operator's inventory sets them (README): the admin user,
    `become`, and host keys checked against ``known_hosts`` (written by the lab set-up, never learnt on first use)."""
    return {
        "ansible_connection": "ssh",
        "ansible_user": ADMIN_USER,
        "ansible_become": True,
        "ansible_ssh_private_key_file": ssh_key(),
        "ansible_host_key_checking": True,
        "ansible_ssh_common_args": (f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
                                    "-o IdentitiesOnly=yes"),
    }


def write_known_hosts(path, lines):
    """Write ``lines`` (one per host) to ``path``, replacing the entries of the same addresses (addresses are reused
    by new containers, with new keys)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with cache_lock("lab-ssh"):
        fresh = {line.split()[0] for line in lines}
        kept = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                kept = [line.rstrip("\n") for line in handle if line.split() and line.split()[0] not in fresh]
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{line}\n" for line in kept + list(lines)))
        os.replace(tmp, path)


def write_inventory(hosts, connection="ssh", addresses=None):
    """inventories/lab/hosts.yml: one group per device type under the group ``ttfleet_lab``, whose vars say how the
    controller reaches the hosts (``ssh``: ``addresses`` by name; ``docker``: `docker exec` as root)."""
    groups = {}
    for name, device in sorted(hosts.items()):
        groups.setdefault(device, []).append(name)
    if connection != "ssh":
        # The docker connection names the container by ansible_host (by default the inventory name).
        addresses = None
    conn = ssh_vars(LAB_KNOWN_HOSTS) if connection == "ssh" else {"ansible_connection": "community.docker.docker"}
    lines = [
        "---",
        "# Written by tests/lab/lab.py for the simulated lab; do not edit (rerun `make lab`).",
        "all:",
        "  children:",
        "    ttfleet_lab:",
        "      vars:",
    ]
    lines += [f"        {key}: {json.dumps(value)}" for key, value in conn.items()]
    lines += ["      children:"]
    for device in DEVICES:
        if device not in groups:
            continue
        lines += [f"        {device}:", "          hosts:"]
        for name in groups[device]:
            address = (addresses or {}).get(name)
            lines += [f"            {name}:" + (f" {{ansible_host: {address}}}" if address else "")]
    os.makedirs(os.path.dirname(INVENTORY), exist_ok=True)
    tmp = INVENTORY + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, INVENTORY)


def parse_hosts(text):
    wanted = []
    counts = {}
    for item in [part.strip() for part in text.split(",") if part.strip()]:
        if item not in DEVICES:
            raise SystemExit(f"unknown lab device type {item!r}; choose from {', '.join(DEVICES)}")
        counts[item] = counts.get(item, 0) + 1
        wanted.append((f"lab-{item}-{counts[item]}", item))
    if not wanted:
        raise SystemExit("--hosts is empty; give device types such as n150,p300x2")
    return wanted


def cmd_up(args):
    wanted = parse_hosts(args.hosts)
    image = ensure_image()
    if docker("network", "inspect", NETWORK, check=False).returncode != 0:
        docker("network", "create", "--label", LABEL, NETWORK)
    existing = lab_containers()
    for name in existing:
        if name not in dict(wanted):
            log(f"removing {name} (not in --hosts)")
            docker("rm", "-f", name)
            shutil.rmtree(host_docker_dir(name), ignore_errors=True)
    for name, device in wanted:
        info = existing.get(name)
        if info and (info["device"], info["state"], info["image"]) == (device, "running", image):
            log(f"{name}: running, reused")
        else:
            if info:
                docker("rm", "-f", name)
            log(f"{name}: starting ({device})")
            start_host(name, device, image)
    ensure_ttis_repo()
    known = {}
    for name, device in wanted:
        provision(name, device)
        known[name] = add_admin(name)
    if args.connection == "ssh":
        write_known_hosts(LAB_KNOWN_HOSTS, list(known.values()))
    write_inventory(dict(wanted), args.connection, {name: line.split()[0] for name, line in known.items()})
    log(f"{len(wanted)} lab hosts up; inventory {os.path.relpath(INVENTORY, ROOT)}")


def cmd_down(_args):
    for name in lab_containers():
        log(f"removing {name}")
        docker("rm", "-f", name)
        shutil.rmtree(host_docker_dir(name), ignore_errors=True)
    if docker("network", "inspect", NETWORK, check=False).returncode == 0:
        docker("network", "rm", NETWORK)
    if os.path.exists(INVENTORY):
        os.unlink(INVENTORY)
    log("lab is down")


def ensure_ttis_repo():
    subprocess.run([sys.executable, TTIS_REPO_SCRIPT], check=True, stdout=subprocess.DEVNULL)


def cmd_provision(args):
    """Give already running containers (molecule's platforms) the lab's hardware stand-ins."""
    ensure_ttis_repo()
    for item in args.containers:
        name, _sep, device = item.partition("=")
        if device not in DEVICES:
            raise SystemExit(f"{item!r}: expected NAME=DEVICE with DEVICE one of {', '.join(DEVICES)}")
        provision(name, device)
        log(f"{name}: provisioned as {device}")


def cmd_admin(args):
    """Give running containers (molecule's platforms) the admin user; write each one's ``ansible_host`` into the
    YAML inventory ``--inventory`` and its host key into ``--known-hosts``. An inventory file of its own beside
    molecule's: molecule removes and rewrites the inventory's host_vars before every step, never other files."""
    lines = {}
    for name in args.containers:
        lines[name] = add_admin(name)
        log(f"{name}: admin user {ADMIN_USER}, ssh {lines[name].split()[0]}")
    write_known_hosts(args.known_hosts, list(lines.values()))
    hosts = {name: {"ansible_host": line.split()[0]} for name, line in lines.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.inventory)), exist_ok=True)
    with open(args.inventory, "w", encoding="utf-8") as handle:
        handle.write("---\n# Written by tests/lab/lab.py admin: the address ssh reaches each host on.\n")
        handle.write(json.dumps({"all": {"hosts": hosts}}, indent=2, sort_keys=True) + "\n")


def cmd_fault(args):
    """Make a host report faults: other boards, old firmware, no hugepages mount; --reset undoes them."""
    device = args.device
    if device not in DEVICES:
        raise SystemExit(f"--device must be the host's real device type, one of {', '.join(DEVICES)}")
    if args.reset:
        ensure_ttis_repo()
        provision(args.name, device)
        log(f"{args.name}: faults cleared")
        return
    data = snapshot(args.boards or device, args.name)
    if args.firmware:
        for board in data["device_info"]:
            board["firmwares"]["fw_bundle_version"] = args.firmware
    if args.kmd:
        data["host_info"]["Driver"] = f"TT-KMD {args.kmd}"
    write_snapshot(args.name, data)
    if args.no_hugepages:
        docker("exec", args.name, "sh", "-c", "! findmnt /dev/hugepages-1G >/dev/null || umount /dev/hugepages-1G")
    log(f"{args.name}: faults set (boards {args.boards or device}, firmware {args.firmware or 'as shipped'}, "
        f"kmd {args.kmd or 'as shipped'}, hugepages {'unmounted' if args.no_hugepages else 'mounted'})")


@contextlib.contextmanager
def cache_lock(name):
    """Hold .cache/<name>.lock: molecule scenarios run side by side (tests/run-tests.sh) and share the caches."""
    os.makedirs(os.path.join(ROOT, ".cache"), exist_ok=True)
    with open(os.path.join(ROOT, ".cache", f"{name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The lab's inference images (docs/development.md, "The lab's inference images"): per upstream release, its own
# start-up code from tests/fixtures/ttis/entrypoints with LAB STAND-INs (tests/lab/upstream_image/stubs) for what needs
# a Tenstorrent device or vLLM.
UPSTREAM_IMAGE_DIR = os.path.join(ROOT, "tests", "lab", "upstream_image")
UPSTREAM_STUBS = os.path.join(UPSTREAM_IMAGE_DIR, "stubs")
ENTRYPOINT_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "ttis", "entrypoints")
UPSTREAM_BUILD_REPO = "ttfleet-lab/tt-serve-upstream"
# The kind by the repository's last path component, whatever the registry or path before it:
# ghcr.io/tenstorrent/tt-inference-server/vllm-..., ghcr.io/tenstorrent/tt-media-inference-server,
# ghcr.io/tenstorrent/tt-shield/tt-media-inference-server-forge, a site mirror's name.
VLLM_IMAGE_PREFIX = "vllm-tt-metal-src-"
MEDIA_IMAGES = {"tt-media-inference-server": "media", "tt-media-inference-server-forge": "forge"}
FORGE_OLDEST = (0, 13, 0)  # Dockerfile.forge's layout (venv-worker, run_uvicorn.sh --skip-venv) since v0.13.0
# The real PyPI packages of the vLLM images (with their dependency closure), copied from the controller's .venv.
VLLM_IMAGE_PACKAGES = ("huggingface_hub", "requests", "PyJWT", "Jinja2")
MEDIA_IMAGE_PACKAGES = ("PyJWT",)
VLLM_STUBS = ("vllm", "transformers", "torch", "numpy", "PIL", "lab_standin.py")
MEDIA_STUBS = ("lab_standin.py",)
SITE_PACKAGES = "python_env/lib/python3.11/site-packages"
_CLOSURE_SCRIPT = r"""
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
env = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
seen, todo = {}, list(sys.argv[1:])
while todo:
    dist = md.distribution(todo.pop())
    key = dist.metadata["Name"].lower().replace("_", "-")
    if key in seen:
        continue
    root = str(dist.locate_file(""))
    files = sorted(str(f) for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f))
    seen[key] = {"version": dist.version, "root": root, "files": files}
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(req.name)
print(json.dumps({"python": list(sys.version_info[:2]), "dists": seen}))
"""


def version_tuple(text):
    """(X, Y, Z) of "X.Y.Z..." (an image tag's leading version), None when it does not start with one."""
    parts = text.split("-", 1)[0].split(".")
    if len(parts) < 3 or not all(part.isdigit() for part in parts[:3]):
        return None
    return tuple(int(part) for part in parts[:3])


def fixture_releases():
    """{(X, Y, Z): tag} of the entrypoint archives in tests/fixtures/ttis/entrypoints."""
    releases = {}
    for path in glob.glob(os.path.join(ENTRYPOINT_FIXTURES, "tt-inference-server-v*-entrypoint.tgz")):
        tag = os.path.basename(path)[len("tt-inference-server-"):-len("-entrypoint.tgz")]
        releases[version_tuple(tag[1:])] = tag
    if not releases:
        raise SystemExit(f"no tt-inference-server-v*-entrypoint.tgz in {ENTRYPOINT_FIXTURES}: restore the fixtures "
                         "(git checkout tests/fixtures/ttis/entrypoints)")
    return releases


def image_kind(image):
    """(kind, upstream tag) of the lab image that stands in for ``image``: vllm, media or forge, and the fixture
    release at or below the image tag's version (the newest for an image that is not tt-inference-server's)."""
    releases = fixture_releases()
    name, _sep, tag = image.rpartition(":")
    if "/" in tag or not name:
        name, tag = image, ""
    repository = name.rsplit("/", 1)[-1]
    kind = "vllm" if repository.startswith(VLLM_IMAGE_PREFIX) else MEDIA_IMAGES.get(repository)
    if kind is None:
        return "vllm", releases[max(releases)]
    version = version_tuple(tag)
    if version is None:
        raise SystemExit(f"{image}: the tag {tag!r} does not start with a release version X.Y.Z; the lab builds "
                         "tt-inference-server images per release (tag such as 0.14.0-80180b9)")
    usable = [release for release in releases if release <= version]
    oldest = releases[min(releases)]
    if kind == "forge" and version >= FORGE_OLDEST:
        usable = [release for release in usable if release >= FORGE_OLDEST]
    elif kind == "forge":
        raise SystemExit(f"{image}: forge images before v0.13.0 (Dockerfile.forge without venv-worker and --skip-venv) "
                         "have no lab image; use a forge image of 0.13.0 or later")
    if not usable:
        raise SystemExit(f"{image}: release v{'.'.join(map(str, version))} is older than the oldest entrypoint archive "
                         f"({oldest}) in tests/fixtures/ttis/entrypoints; the lab cannot build its start-up code")
    chosen = releases[max(usable)]
    if max(usable) != version:
        log(f"{image}: no entrypoint archive of v{'.'.join(map(str, version))}, using {chosen} (the newest below it)")
    return kind, chosen


def venv_packages(names):
    """The dependency closure of ``names`` in the controller's .venv: {name: {version, root, files}}."""
    python = os.path.join(ROOT, ".venv", "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"{python} is missing: run `make tools` (the lab images copy PyPI packages from .venv)")
    proc = subprocess.run([python, "-c", _CLOSURE_SCRIPT, *names], check=False, text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"cannot read the packages {', '.join(names)} in .venv ({proc.stderr.strip()[-400:]}): "
                         "run `make tools` (requirements-dev.txt pins them)")
    data = json.loads(proc.stdout)
    if data["python"] != [3, 11]:
        raise SystemExit(f".venv runs Python {data['python']}, the lab images Debian 12's 3.11: its compiled wheels "
                         "would not load; recreate .venv with python3.11 (make tools)")
    return data["dists"]


def _extract_release(tag, context):
    """Upstream's files of ``tag`` into the build context: app/{src,utils,VERSION}, docker-entrypoint.sh, server/,
    model_spec.json; returns the text of workflows/model_spec.py."""
    import tarfile

    archive = os.path.join(ENTRYPOINT_FIXTURES, f"tt-inference-server-{tag}-entrypoint.tgz")
    prefix = f"tt-inference-server-{tag[1:]}/"
    places = {"vllm-tt-metal/src/": "app/src/", "utils/": "app/utils/", "VERSION": "app/VERSION",
              "docker-entrypoint.sh": "docker-entrypoint.sh", "tt-media-server/run_uvicorn.sh": "server/run_uvicorn.sh",
              "workflows/model_spec.py": "workflows/model_spec.py"}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            rel = member.name[len(prefix):]
            target = next((dst + rel[len(src):] for src, dst in places.items() if rel.startswith(src)), None)
            if target is None:
                continue
            path = os.path.join(context, target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with tar.extractfile(member) as src_handle, open(path, "wb") as dst_handle:
                shutil.copyfileobj(src_handle, dst_handle)
            os.chmod(path, 0o755 if member.mode & 0o111 else 0o644)
    import gzip

    spec_gz = os.path.join(ENTRYPOINT_FIXTURES, f"model_spec-{tag}.json.gz")
    with gzip.open(spec_gz) as src_handle, open(os.path.join(context, "model_spec.json"), "wb") as dst_handle:
        shutil.copyfileobj(src_handle, dst_handle)
    spec_py = os.path.join(context, "workflows", "model_spec.py")
    with open(spec_py, encoding="utf-8") as handle:
        text = handle.read()
    shutil.rmtree(os.path.join(context, "workflows"))
    return text


def _copy_venv(context, packages, stubs):
    """The image's venv: pyvenv.cfg, the stand-in bin/activate (and uvicorn), the .venv's packages, the stubs."""
    venv = os.path.join(context, "python_env")
    site = os.path.join(context, SITE_PACKAGES)
    os.makedirs(site)
    os.makedirs(os.path.join(venv, "bin"))
    with open(os.path.join(venv, "pyvenv.cfg"), "w", encoding="utf-8") as handle:
        handle.write("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n")
    shutil.copy(os.path.join(UPSTREAM_STUBS, "bin", "activate"), os.path.join(venv, "bin", "activate"))
    for dist in packages.values():
        for rel in dist["files"]:
            src = os.path.join(dist["root"], rel)
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
                shutil.copy(src, os.path.join(site, rel))
    for name in stubs:
        src = os.path.join(UPSTREAM_STUBS, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(site, name), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, os.path.join(site, name))


def media_model_names(catalog):
    """{model_name: hf_model_repo} of the media and forge specs of a release's catalog (what tt-media-server lists)."""
    names = {}

    def walk(node):
        if isinstance(node, dict):
            if node.get("inference_engine") in ("media", "forge") and node.get("model_name"):
                names[node["model_name"]] = node.get("hf_model_repo") or node["model_name"]
                return
            for value in node.values():
                walk(value)

    walk(catalog)
    return names


def build_context(kind, tag, context):
    """Fill ``context`` for the lab image of ``kind`` of upstream ``tag``; returns its docker build args."""
    stubs_dir = os.path.join(UPSTREAM_STUBS)
    if stubs_dir not in sys.path:
        sys.path.insert(0, stubs_dir)
    from lab_standin import tt_config_source

    spec_py = _extract_release(tag, context)
    shutil.copy(os.path.join(UPSTREAM_IMAGE_DIR, f"Dockerfile.{kind}"), os.path.join(context, "Dockerfile"))
    args = {"UPSTREAM_TAG": tag}
    if kind == "vllm":
        _copy_venv(context, venv_packages(VLLM_IMAGE_PACKAGES), VLLM_STUBS)
        try:
            key, member = tt_config_source(spec_py)
        except ValueError as exc:
            raise SystemExit(f"{tag}: {exc}") from exc
        args.update(TT_CONFIG_KEY=key, TT_CONFIG_MEMBER=member or "")
    else:
        _copy_venv(context, venv_packages(MEDIA_IMAGE_PACKAGES), MEDIA_STUBS)
        uvicorn = os.path.join(context, "python_env", "bin", "uvicorn")
        shutil.copy(os.path.join(UPSTREAM_STUBS, "bin", "uvicorn"), uvicorn)
        with open(os.path.join(context, "model_spec.json"), encoding="utf-8") as handle:
            names = media_model_names(json.load(handle))
        with open(os.path.join(context, SITE_PACKAGES, "lab-media-models.json"), "w", encoding="utf-8") as handle:
            json.dump(names, handle, indent=1, sort_keys=True)
    return args


def tree_digest(path, extra):
    """sha256 over every file's relative path, mode bit x and content under ``path``, plus ``extra``."""
    digest = hashlib.sha256(extra.encode())
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            with open(full, "rb") as handle:
                digest.update(f"{os.path.relpath(full, path)}\0{os.access(full, os.X_OK)}\0".encode())
                digest.update(handle.read())
    return digest.hexdigest()[:12]


def upstream_image(kind, tag, base):
    """The lab image of ``kind`` for upstream ``tag`` (built when its inputs changed): its build tag."""
    with tempfile.TemporaryDirectory(prefix="ttfleet-upstream-image.") as context:
        args = build_context(kind, tag, context)
        base_id = docker("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
        build = tree_digest(context, json.dumps({"base": base_id, "args": args}, sort_keys=True))
        build_tag = f"{UPSTREAM_BUILD_REPO}:{kind}-{tag}-{build}"
        if docker("image", "inspect", build_tag, check=False).returncode == 0:
            return build_tag
        log(f"building {build_tag} (tt-inference-server {tag} start-up code, {kind} LAB STAND-INs)")
        started = time.monotonic()
        argv = ["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", build_tag]
        for name, value in sorted(args.items()):
            argv += ["--build-arg", f"{name}={value}"]
        proc = subprocess.run([*argv, context], check=False, text=True, capture_output=True)
        if proc.returncode != 0:
            raise SystemExit(f"docker build of {build_tag} failed: {proc.stderr.strip()[-2000:]}")
        log(f"built {build_tag} in {time.monotonic() - started:.1f} s")
        # Older builds of this kind and release lose their build tag (an image still named by a spec's tag stays).
        listed = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", UPSTREAM_BUILD_REPO).stdout.split()
        prefix = f"{UPSTREAM_BUILD_REPO}:{kind}-{tag}-"
        stale = [name for name in listed if name.startswith(prefix) and name != build_tag]
        if stale:
            docker("image", "rm", *stale, check=False)
        return build_tag


def serve_image(tags):
    """The lab inference images for the image names ``tags`` (each the lab image of its kind and upstream release),
    saved together once per content under .cache/serve-image (call it under cache_lock("serve-image"))."""
    base = ensure_image("--standin")
    kinds = {image: image_kind(image) for image in tags}
    builds = {key: upstream_image(*key, base) for key in sorted(set(kinds.values()))}
    mapping = {image: builds[kinds[image]] for image in tags}
    tag_set = hashlib.sha256("\0".join(sorted(tags)).encode()).hexdigest()[:8]
    content = hashlib.sha256(json.dumps(mapping, sort_keys=True).encode()).hexdigest()[:12]
    tarball = os.path.join(SERVE_IMAGE_CACHE, f"upstream-{tag_set}-{content}.tar")
    if os.path.exists(tarball):
        return tarball
    for image, build_tag in mapping.items():
        docker("tag", build_tag, image)
    os.makedirs(SERVE_IMAGE_CACHE, exist_ok=True)
    # An older content of this set of names goes (and the single stand-in's tarballs); other sets are other scenarios'.
    for stale in glob.glob(os.path.join(SERVE_IMAGE_CACHE, f"upstream-{tag_set}-*.tar")) + glob.glob(
            os.path.join(SERVE_IMAGE_CACHE, "standin-*.tar")):
        if stale != tarball:
            os.unlink(stale)
    log(f"docker save {' '.join(tags)} -> {os.path.relpath(tarball, ROOT)}")
    docker("save", "--output", tarball + ".tmp", *tags)
    os.replace(tarball + ".tmp", tarball)
    return tarball


def cmd_serve_image(args):
    with cache_lock("serve-image"):
        tarball = serve_image(args.tag)
        for item in args.copy or []:
            name, _sep, path = item.partition(":")
            if not name or not path.startswith("/"):
                raise SystemExit(f"--copy {item!r}: expected NAME:/absolute/path")
            docker("exec", name, "mkdir", "-p", os.path.dirname(path))
            docker("cp", tarball, f"{name}:{path}")
            log(f"{name}: {path}")
    print(tarball)


def cmd_status(_args):
    for name, info in sorted(lab_containers().items()):
        print(f"{name}\t{info['device']}\t{info['state']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start lab hosts and write inventories/lab/hosts.yml")
    up.add_argument("--hosts", default=os.environ.get("TTFLEET_LAB_HOSTS", DEFAULT_HOSTS),
                    help=f"comma-separated device types, one host each (default {DEFAULT_HOSTS})")
    up.add_argument("--connection", choices=CONNECTIONS, default=os.environ.get("TTFLEET_LAB_CONNECTION", "ssh"),
                    help="how the inventory reaches the hosts: ssh as the admin user with sudo (default), or "
                         "docker exec as root")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="remove all lab hosts").set_defaults(func=cmd_down)
    sub.add_parser("status", help="list lab hosts").set_defaults(func=cmd_status)
    prov = sub.add_parser("provision", help="add the hardware stand-ins to running containers")
    prov.add_argument("containers", nargs="+", metavar="NAME=DEVICE")
    prov.set_defaults(func=cmd_provision)
    admin = sub.add_parser("admin", help="give running containers the admin user, for SSH with sudo")
    admin.add_argument("containers", nargs="+", metavar="NAME")
    admin.add_argument("--inventory", required=True, help="YAML inventory file to write each host's ansible_host into")
    admin.add_argument("--known-hosts", required=True, help="known_hosts file to write the hosts' keys into")
    admin.set_defaults(func=cmd_admin)
    fault = sub.add_parser("fault", help="make a host report wrong boards, old firmware or no hugepages")
    fault.add_argument("name")
    fault.add_argument("--device", required=True, help="the host's real device type")
    fault.add_argument("--boards", choices=sorted(DEVICES), help="report the boards of this device type instead")
    fault.add_argument("--firmware", help="report this firmware bundle version on every board")
    fault.add_argument("--kmd", help="report this KMD version")
    fault.add_argument("--no-hugepages", action="store_true", help="unmount /dev/hugepages-1G")
    fault.add_argument("--reset", action="store_true", help="back to the real device's snapshot and mounts")
    fault.set_defaults(func=cmd_fault)
    image = sub.add_parser("serve-image", help="build, save and copy the lab inference images")
    image.add_argument("--tag", action="append", required=True, help="image name to give it (repeatable)")
    image.add_argument("--copy", action="append", metavar="NAME:PATH", help="copy the tarball into a host")
    image.set_defaults(func=cmd_serve_image)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
