"""LAB STAND-IN (tests only) for vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``).

Upstream's run_vllm_api_server.py runs it with ``runpy.run_module(..., run_name="__main__")`` after its own start-up
code has built ``sys.argv``. It reads that argv as vLLM's parser would (lab_standin.parse_vllm_argv), records what the
start received (printed once as ``lab-vllm: start {json}``, GET /lab/config, and ``$LAB_VLLM_RECORD`` when set), and
serves the lab's contract on ``--host``/``--port``; the bearer key is ``--api-key`` or VLLM_API_KEY, as in vLLM.
``LAB_VLLM_NO_SERVE=1`` exits 0 after the record (unit tests run upstream's script without Docker).
"""

import os
import sys
from typing import Any

from lab_standin import image_facts, parse_vllm_argv, prepare, redacted_env, serve, tt_config

from vllm import ModelRegistry

DEFAULT_MODEL = "facebook/opt-125m"  # vLLM's default --model


def _names(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def build_record(argv: list[str]) -> dict[str, Any]:
    vllm_args = parse_vllm_argv(argv[1:])
    tag, key, member = image_facts()
    tt, ignored = tt_config(vllm_args, key, member)
    runtime_spec = os.environ.get("RUNTIME_MODEL_SPEC_JSON_PATH")
    spec_source = runtime_spec if runtime_spec and os.path.exists(runtime_spec) else os.environ.get(
        "MODEL_SPECS_JSON_PATH")
    return {
        "argv": list(argv),
        "vllm_args": vllm_args,
        "tt_config": tt,
        "tt_config_key": key,
        "tt_config_ignored": ignored,
        "env": redacted_env(),
        "spec_source": spec_source,
        "registered_models": list(ModelRegistry.registered),
        "upstream_tag": tag,
        "engine": "vLLM",
    }


def main() -> int:
    record = build_record(list(sys.argv))
    vllm_args = record["vllm_args"]
    model = str(vllm_args.get("model") or DEFAULT_MODEL)
    status = prepare(record, "lab-vllm", f"{model} {os.environ.get('MESH_DEVICE', '')}")
    if status is not None:
        return status
    served = vllm_args.get("served_model_name")
    models = _names(served) if served not in (None, True) else [model]
    api_key = vllm_args.get("api_key") or os.environ.get("VLLM_API_KEY") or None
    host = vllm_args.get("host")
    port = int(vllm_args.get("port") or 8000)
    return serve(str(host) if host not in (None, True) else "0.0.0.0", port, models,
                 None if api_key in (None, True) else str(api_key), record, "lab-vllm")


if __name__ == "__main__":
    sys.exit(main())
