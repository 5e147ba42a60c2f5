"""What every benchmark script records beside its numbers: the date, the machine, and the JSON file itself."""

import configparser
import json
import os
import platform
import time


def stamp():
    """Date (UTC) and machine of a run, for the head of a results file."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
    }


def write(path, data):
    """Write data as indented JSON to path (directories created) and say where."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    print(f"wrote {path}")


def callbacks(root, *bench):
    """ANSIBLE_CALLBACKS_ENABLED for a timed run: the checkout's ansible.cfg's callbacks_enabled plus the bench's own.

    The variable replaces the configured list, so a bench that only named its own callbacks would time the run
    without the ones operators get from ansible.cfg (ttfleet.inference.lean_workers).
    """
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.path.join(root, "ansible.cfg"))
    configured = [name.strip() for name in config.get("defaults", "callbacks_enabled", fallback="").split(",")]
    return ",".join([name for name in configured if name] + list(bench))
