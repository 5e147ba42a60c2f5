"""What every benchmark script records beside its numbers: the date, the machine, and the JSON file itself."""

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
