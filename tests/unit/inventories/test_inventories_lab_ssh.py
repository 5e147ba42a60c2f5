"""The lab reaches its hosts the way the README tells operators to: SSH as an admin user, `become` through sudo
without a password and without `requiretty`, pipelining, one persistent master connection per host, host keys checked.

What tests/lab/lab.py writes (the lab inventory, the admin user's sudoers and key, known_hosts), the collection's
ansible.cfg, molecule's base config and the SSH scenarios' connection options are checked here against each other and
against the README; molecule fleet and upgrade run them for real.
"""

import configparser
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))
import lab

SSH_SCENARIOS = ("fleet", "upgrade")


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture
def lab_inventory(tmp_path, monkeypatch):
    """lab.py's inventory for two hosts over SSH, beside a copy of the committed group_vars; its ansible-inventory."""
    shutil.copytree(
        os.path.join(ROOT, "inventories", "lab", "group_vars"),
        tmp_path / "group_vars",
        ignore=shutil.ignore_patterns("zz_*"),
    )
    monkeypatch.setattr(lab, "INVENTORY", str(tmp_path / "hosts.yml"))
    monkeypatch.setattr(lab, "LAB_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    monkeypatch.setattr(lab, "ssh_key", lambda: "/lab/.cache/lab-ssh/id_ed25519")

    def listing(connection):
        lab.write_inventory(
            {"lab-n150-1": "n150", "lab-p300x2-1": "p300x2"},
            connection,
            {"lab-n150-1": "172.30.0.2", "lab-p300x2-1": "172.30.0.3"},
        )
        program = shutil.which("ansible-inventory") or os.path.join(ROOT, ".venv", "bin", "ansible-inventory")
        out = subprocess.run(
            [program, "-i", str(tmp_path), "--list"],
            check=True,
            capture_output=True,
            text=True,
            env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections")),
        )
        return json.loads(out.stdout)

    return listing


def test_lab_inventory_reaches_hosts_over_ssh_with_become(lab_inventory):
    data = lab_inventory("ssh")
    hostvars = data["_meta"]["hostvars"]
    assert sorted(data["n150"]["hosts"]) == ["lab-n150-1"]
    for host, address in (("lab-n150-1", "172.30.0.2"), ("lab-p300x2-1", "172.30.0.3")):
        hv = hostvars[host]
        assert hv["ansible_connection"] == "ssh"
        assert hv["ansible_host"] == address
        assert hv["ansible_user"] == lab.ADMIN_USER != "root"
        assert hv["ansible_become"] is True
        assert hv["ansible_ssh_private_key_file"] == "/lab/.cache/lab-ssh/id_ed25519"
        # Host keys are checked against the file the lab set-up wrote, never accepted on first use.
        assert hv["ansible_host_key_checking"] is True
        args = hv["ansible_ssh_common_args"].split()
        assert f"UserKnownHostsFile={lab.LAB_KNOWN_HOSTS}" in args
        assert "StrictHostKeyChecking=yes" in args
        assert not any(arg.startswith("StrictHostKeyChecking=") and arg != "StrictHostKeyChecking=yes" for arg in args)


def test_lab_inventory_docker_connection_is_an_option(lab_inventory):
    hostvars = lab_inventory("docker")["_meta"]["hostvars"]
    for hv in hostvars.values():
        assert hv["ansible_connection"] == "community.docker.docker"
        assert "ansible_become" not in hv
        assert "ansible_host" not in hv


def test_group_vars_leave_the_connection_to_each_inventory():
    """The lab's group_vars serve the SSH inventory, molecule's and the fault suite's: none of them may be overridden
    by a connection set for all."""
    group_vars = yaml.safe_load(_read("inventories", "lab", "group_vars", "all", "main.yml"))
    for key in ("ansible_connection", "ansible_user", "ansible_become", "ansible_host"):
        assert key not in group_vars, key


def test_admin_user_has_sudo_as_the_readme_asks():
    script = lab.admin_script("ssh-ed25519 AAAAtest ttfleet-lab-admin")
    assert f"{lab.ADMIN_USER} ALL=(ALL:ALL) NOPASSWD: ALL" in script
    assert "requiretty" not in script
    assert "visudo -cqf" in script
    assert "chmod 0600" in script and "install -d -m 0700" in script
    # uid 1000 is the QuietBox's `tt`, who owns its factory volume.
    assert lab.ADMIN_UID != 1000 and "-u 1000" in lab.QB2_SCRIPT
    readme = " ".join(_read("README.md").split())
    assert "`ansible_user`" in readme and "`ansible_become: true`" in readme
    assert "NOPASSWD" in readme and "requiretty" in readme and "pipelining" in readme
    assert "ansible_become_password" in readme


def test_ssh_key_is_private_and_made_once(tmp_path, monkeypatch):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed (make test installs openssh-client)")
    monkeypatch.setattr(lab, "SSH_DIR", str(tmp_path / "lab-ssh"))
    monkeypatch.setattr(lab, "SSH_KEY", str(tmp_path / "lab-ssh" / "id_ed25519"))
    path = lab.ssh_key()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with open(path + ".pub", encoding="utf-8") as handle:
        public = handle.read()
    assert public.startswith("ssh-ed25519 ")
    assert lab.ssh_key() == path
    with open(path + ".pub", encoding="utf-8") as handle:
        assert handle.read() == public
    assert sorted(os.listdir(os.path.dirname(path))) == ["id_ed25519", "id_ed25519.pub"]


def test_known_hosts_replaces_the_entries_of_reused_addresses(tmp_path):
    path = str(tmp_path / "known_hosts")
    lab.write_known_hosts(path, ["172.30.0.2 ssh-ed25519 OLD", "172.30.0.3 ssh-ed25519 KEEP"])
    lab.write_known_hosts(path, ["172.30.0.2 ssh-ed25519 NEW"])
    with open(path, encoding="utf-8") as handle:
        assert handle.read().splitlines() == ["172.30.0.3 ssh-ed25519 KEEP", "172.30.0.2 ssh-ed25519 NEW"]


def _ansible_cfg():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(ROOT, "ansible.cfg"))
    return parser


def test_controller_ssh_settings():
    cfg = _ansible_cfg()["ssh_connection"]
    assert cfg.getboolean("pipelining") is True
    args = cfg["ssh_args"].split()
    assert "ControlMaster=auto" in args
    persist = next(arg for arg in args if arg.startswith("ControlPersist="))
    assert int(persist.split("=", 1)[1].rstrip("s")) >= 60
    # %C: a hash of host, port and user, so a long host name cannot push the socket path past 108 bytes.
    assert cfg["control_path"] == "%(directory)s/%%C"


def test_molecule_ssh_scenarios_use_the_same_settings(monkeypatch):
    monkeypatch.setattr(lab, "ssh_key", lambda: "KEY")
    base = yaml.safe_load(_read(".config", "molecule", "config.yml"))["ansible"]["cfg"]
    cfg = _ansible_cfg()["ssh_connection"]
    assert base["ssh_connection"]["pipelining"] is True
    assert base["ssh_connection"]["ssh_args"] == cfg["ssh_args"]
    assert base["ssh_connection"]["control_path"] == cfg["control_path"]
    expected = lab.ssh_vars("KNOWN_HOSTS")
    for scenario in SSH_SCENARIOS:
        options = yaml.safe_load(_read("molecule", scenario, "molecule.yml"))["provisioner"]["connection_options"]
        assert options["ansible_ssh_private_key_file"] == "${MOLECULE_PROJECT_DIRECTORY}/.cache/lab-ssh/id_ed25519"
        options = dict(options, ansible_ssh_private_key_file="KEY")
        options["ansible_ssh_common_args"] = options["ansible_ssh_common_args"].replace(
            "${MOLECULE_EPHEMERAL_DIRECTORY}/known_hosts", "KNOWN_HOSTS"
        )
        assert options == expected, scenario
