#!/usr/bin/env python
# LAB STAND-IN, not tenstorrent's run.py.
#
# tests/lab/ttis_repo.py commits this file as run.py into the lab's tt-inference-server repository so
# that the release tags have a run.py at the place the real one lives. It only shows which release it
# belongs to and that the release's Python (>= 3.10 with PyYAML) can run it; it starts nothing.
"""LAB STAND-IN for tt-inference-server's run.py (tests only, never shipped)."""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model")
    parser.add_argument("--tt-device")
    parser.add_argument("--print-docker-cmd", action="store_true", help="print the image of the spec and exit")
    args = parser.parse_args()
    import yaml  # noqa: F401  (the real run.py needs PyYAML; so does its stand-in)

    with open(os.path.join(HERE, "VERSION"), encoding="utf-8") as handle:
        version = handle.read().strip()
    print(f"LAB STAND-IN run.py of tt-inference-server {version}")
    if args.print_docker_cmd:
        if not (args.model and args.tt_device):
            parser.error("--print-docker-cmd needs --model and --tt-device")
        with open(os.path.join(HERE, "release_model_spec.json"), encoding="utf-8") as handle:
            specs = json.load(handle)["model_specs"]
        device = args.tt_device.upper()
        for repo, devices in specs.items():
            if args.model not in (repo, repo.rsplit("/", 1)[-1]):
                continue
            for engines in devices.get(device, {}).values():
                for spec in engines.values():
                    if spec["device_model_spec"].get("default_impl"):
                        print(f"docker run ... {spec['docker_image']} --model {repo} --tt-device {args.tt_device}")
                        return
        raise SystemExit(f"no default spec for {args.model} on {args.tt_device}")


if __name__ == "__main__":
    main()
