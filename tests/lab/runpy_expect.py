#!/usr/bin/env python
"""What run.py's own path gives a model's vLLM start, computed by upstream's code, and a check of a recorded start.

For the lab's molecule scenarios (issue 30): an instance's recorded start (GET /lab/config of the lab's inference image,
which runs upstream's own entrypoint, see docs/development.md) must carry what tt-inference-server's run.py resolves for
the same entry.

    runpy_expect.py --model M --device D [--vllm-override-args JSON] [--override-tt-config JSON] [--port P]
                    [--image-catalog vX.Y.Z] [--recorded JSON]

Without --image-catalog: upstream v0.20.0's ``workflows.model_spec`` (tests/fixtures/ttis/tt-inference-server-v0.20.0-
subset.tgz, run in a child interpreter) selects the default spec of M on D from its prod catalog and applies the
overrides with ``ModelSpec.apply_overrides``, as ``run.py --vllm-override-args --override-tt-config --service-port``
does. With --image-catalog: the spec the image of that release finds in its own catalog
(tests/fixtures/ttis/entrypoints/model_spec-vX.Y.Z.json.gz), where an image reads it when no spec is mounted.

Prints the expectation as JSON. With --recorded (the /lab/config JSON): exits 1 naming every vLLM argument and TT
config key the start got differently, and when the TT config came under an argument the image does not read; for an
instance that was given no spec (it read the image's own catalog), that catalog is the expectation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "ttis")
RELEASE_ARCHIVE = os.path.join(FIXTURES, "tt-inference-server-v0.20.0-subset.tgz")
TT_CONFIG_ARGS = ("override_tt_config", "plugin_config", "additional_config")
# MODEL_SPECS_JSON_PATH of every vLLM image: the catalog it was built with.
IMAGE_CATALOG = "/home/container_app_user/model_specs/model_spec.json"

# Runs in the unpacked release, with its directory as the working directory and on sys.path.
_UPSTREAM = r"""
import json, sys, types
from workflows.model_spec import MODEL_SPECS
model, device, vllm_override_args, override_tt_config, port = json.loads(sys.argv[1])
short = model.split("/")[-1]
found = [
    spec for spec in MODEL_SPECS.values()
    if short in (spec.model_name, spec.hf_model_repo.split("/")[-1])
    and spec.device_type.name == device.upper()
    and spec.inference_engine == "vLLM"
]
default = [spec for spec in found if spec.device_model_spec.default_impl] or found
if not default:
    sys.exit(f"no vLLM spec of {model} on {device} in the catalog")
spec = default[0]
spec.apply_overrides(types.SimpleNamespace(
    override_tt_config=override_tt_config, vllm_override_args=vllm_override_args,
    service_port=port, override_docker_image=None))
print(json.dumps({
    "source": "run.py v0.20.0 (ModelSpec.apply_overrides)",
    "docker_image": spec.docker_image,
    "vllm_args": spec.device_model_spec.vllm_args,
    "tt_config": spec.device_model_spec.override_tt_config,
}))
"""


def from_release(model: str, device: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="runpy-expect-") as work:
        with tarfile.open(RELEASE_ARCHIVE) as archive:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                archive.extractall(work, filter="data")
            else:
                archive.extractall(work)
        (checkout,) = [os.path.join(work, name) for name in os.listdir(work)]
        # upstream's workflows/utils.py looks for the repository root (a .git) while it is imported.
        os.mkdir(os.path.join(checkout, ".git"))
        payload = json.dumps([model, device, args.vllm_override_args, args.override_tt_config, args.port])
        proc = subprocess.run(
            [sys.executable, "-B", "-c", _UPSTREAM, payload],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": checkout, "MODEL_SPECS_ENV": "prod"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"upstream's model_spec failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def from_image_catalog(model: str, device: str, tag: str, args: argparse.Namespace) -> dict:
    path = os.path.join(FIXTURES, "entrypoints", f"model_spec-{tag}.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    catalog = data.get("model_specs", data)
    short = model.split("/")[-1]
    for repo, devices in catalog.items():
        if repo.split("/")[-1] != short:
            continue
        engines = devices.get(device.upper()) or {}
        specs = list((engines.get("vLLM") or {}).values())
        specs = [spec for spec in specs if spec["device_model_spec"].get("default_impl")] or specs
        if specs:
            dms = specs[0]["device_model_spec"]
            vllm_args = dict(dms.get("vllm_args") or {})
            # As the image takes the container's own arguments over its catalog's (run.py's --vllm-override-args).
            vllm_args.update(json.loads(args.vllm_override_args or "{}"))
            if args.port:
                vllm_args["port"] = args.port
            return {
                "source": f"the image's own catalog ({tag})",
                "docker_image": specs[0].get("docker_image"),
                "vllm_args": vllm_args,
                "tt_config": dms.get("override_tt_config") or {},
            }
    raise SystemExit(f"no vLLM spec of {model} on {device} in the catalog of {tag}")


def _name(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


def differences(expected: dict, recorded: dict) -> list[str]:
    got = {_name(key): value for key, value in (recorded.get("vllm_args") or {}).items()}
    problems = []
    for key, value in expected["vllm_args"].items():
        name = _name(key)
        if name in TT_CONFIG_ARGS or value is None or value is False:
            continue
        have = got.get(name, "8000" if name == "port" else None)
        if str(have) != str(value):
            problems.append(f"vLLM argument {name}: started with {have!r}, run.py resolves {value!r}")
    if (recorded.get("tt_config") or {}) != (expected["tt_config"] or {}):
        problems.append(
            f"TT config under --{recorded.get('tt_config_key')}: started with {recorded.get('tt_config')!r}, run.py "
            f"resolves {expected['tt_config']!r}"
        )
    if recorded.get("tt_config_ignored"):
        problems.append(f"TT config under arguments this image does not read: {recorded['tt_config_ignored']!r}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--vllm-override-args", default=None, help="JSON, as run.py takes it")
    parser.add_argument("--override-tt-config", default=None, help="JSON, as run.py takes it")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--image-catalog", default=None, help="vX.Y.Z: the image's own catalog instead of run.py's")
    parser.add_argument("--recorded", default=None, help="the /lab/config JSON of the running instance")
    args = parser.parse_args()
    recorded = json.loads(args.recorded) if args.recorded is not None else None
    if not args.image_catalog and recorded and recorded.get("spec_source") == IMAGE_CATALOG:
        # No spec mounted: the image resolved its own catalog, as it does under run.py.
        args.image_catalog = recorded.get("upstream_tag")
    if args.image_catalog:
        expected = from_image_catalog(args.model, args.device, args.image_catalog, args)
    else:
        expected = from_release(args.model, args.device, args)
    print(json.dumps(expected, sort_keys=True))
    if recorded is None:
        return 0
    problems = differences(expected, recorded)
    for problem in problems:
        print(f"{args.model} on {args.device}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
