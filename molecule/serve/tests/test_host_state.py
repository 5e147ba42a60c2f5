"""The serve host's state after the converge, read with testinfra (pytest-testinfra, docker:// backend).

Run by verify.yml against every platform: `pytest --hosts=docker://<name>,... molecule/serve/tests`. Unit files,
owners and modes, running units and timers, listening ports and the instances' containers, where the Ansible verify
would need a stat and an assert per item.
"""

import json

import pytest

INSTANCES = {"llama-3-1-8b-instruct": 8000, "llama-3-1-8b": 8001}
CONFIG_DIR = "/etc/ttfleet/serve"
STATE_DIR = "/var/lib/ttfleet/serve"


@pytest.mark.parametrize(
    "path", ["/etc/systemd/system/tt-serve@.service", "/etc/systemd/system/tt-serve-health@.service",
             "/etc/systemd/system/tt-serve-health@.timer", "/usr/local/libexec/ttfleet-serve"],
)
def test_unit_files_and_wrapper_are_roots_and_read_only_to_others(host, path):
    f = host.file(path)
    assert f.is_file and not f.is_symlink
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)


@pytest.mark.parametrize("path", [CONFIG_DIR, STATE_DIR])
def test_config_and_state_dirs_are_roots_and_not_writable_by_others(host, path):
    d = host.file(path)
    assert d.is_directory and not d.is_symlink
    assert (d.user, d.group, d.mode) == ("root", "root", 0o755)


@pytest.mark.parametrize("instance", INSTANCES)
def test_instance_files_owners_and_modes(host, instance):
    env = host.file(f"{CONFIG_DIR}/{instance}.env")
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    for path in (f"{CONFIG_DIR}/{instance}.conf", f"{STATE_DIR}/{instance}.json"):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644), path


@pytest.mark.parametrize("instance", INSTANCES)
def test_instance_unit_and_health_timer_run_and_start_at_boot(host, instance):
    unit = host.service(f"tt-serve@{instance}")
    assert unit.is_running and unit.is_enabled
    timer = host.service(f"tt-serve-health@{instance}.timer")
    assert timer.is_running and timer.is_enabled


@pytest.mark.parametrize(("instance", "port"), INSTANCES.items())
def test_instance_listens_on_its_port_and_its_container_runs(host, instance, port):
    assert host.socket(f"tcp://0.0.0.0:{port}").is_listening
    conf = json.loads(host.file(f"{CONFIG_DIR}/{instance}.conf").content_string)
    state = host.check_output("docker inspect --format '{{.State.Running}}' %s", conf["container_name"])
    assert state == "true"


@pytest.mark.parametrize("instance", INSTANCES)
def test_the_units_main_process_is_the_wrapper_of_its_instance(host, instance):
    pid = host.check_output("systemctl show --property MainPID --value tt-serve@%s", instance)
    assert pid.isdigit() and int(pid) > 0
    args = host.file(f"/proc/{pid}/cmdline").content.rstrip(b"\0").split(b"\0")
    assert [a.decode() for a in args[-3:]] == ["/usr/local/libexec/ttfleet-serve", "start", instance]
