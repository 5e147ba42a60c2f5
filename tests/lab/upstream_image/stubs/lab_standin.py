"""LAB STAND-IN (tests only) for what a tt-inference-server image runs after its own start-up code.

Shared by the ``vllm.entrypoints.openai.api_server`` stand-in (vLLM images) and the ``uvicorn`` stand-in (media and
forge images): no model, no device. It records what the start received (GET /lab/config), honours the lab's test hooks
in the cache volume and serves the HTTP contract the collection relies on:

- GET /health: 200, or 503 while ``.lab-fail-health`` exists in CACHE_ROOT;
- GET /v1/models and POST /v1/chat/completions, /v1/completions: a deterministic answer, behind the bearer key;
- GET /metrics: a few of vLLM's metrics in the Prometheus text format (vllm:num_requests_running, ...), open without
  the key as vLLM's is; the request counters count the completions answered;
- ``.lab-crash`` in CACHE_ROOT: exit 3 right after start; ``.lab-start-delay``: seconds to wait before serving;
- ``$TT_CACHE_PATH/lab-standin-kernels.txt`` written (a TT_CACHE_PATH outside CACHE_ROOT is refused, exit 2);
- the readiness line ``INFO:     Application startup complete.`` (uvicorn's, as vLLM and the media server log it);
- SIGTERM: exit 0.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_CACHE_ROOT = "/home/container_app_user/cache_root"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_KEY|ACCESS_KEY|PRIVATE|CREDENTIAL|AUTHORIZATION", re.IGNORECASE)
# The vLLM arguments that carry a TT config in one release or another (workflows/model_spec.py, DeviceModelSpec).
TT_CONFIG_KEYS = ("override_tt_config", "plugin_config", "additional_config")
# In DeviceModelSpec's default vllm_args: "<key>": json.dumps(self.override_tt_config) (up to v0.14.0) or
# "<key>": json.dumps({"tt": self.override_tt_config}) (plugin_config in v0.15.0, additional_config from v0.16.0).
_TT_KEY_SOURCE = re.compile(
    r"""["']([A-Za-z0-9_-]+)["']\s*:\s*json\.dumps\(\s*(\{\s*["']([A-Za-z0-9_]+)["']\s*:\s*)?self\.override_tt_config\b"""
)

Json = dict[str, Any]


def log(message: str) -> None:
    print(message, flush=True)


def tt_config_source(model_spec_py: str) -> tuple[str, str | None]:
    """The vLLM argument that carries the TT config in upstream's ``workflows/model_spec.py`` text, and the member of
    its JSON value that holds it (None: the value is the TT config itself)."""
    match = _TT_KEY_SOURCE.search(model_spec_py)
    if match is None:
        raise ValueError(
            "workflows/model_spec.py has no '\"<key>\": json.dumps(... self.override_tt_config ...)' in "
            "DeviceModelSpec's vllm_args: this release passes the TT config another way; teach "
            "tests/lab/upstream_image/stubs/lab_standin.py its form"
        )
    return match.group(1).replace("-", "_"), match.group(3)


def _find_on_path(relative: str) -> Path | None:
    for entry in sys.path:
        candidate = Path(entry or ".") / relative
        if candidate.is_file():
            return candidate
    return None


def image_facts() -> tuple[str | None, str | None, str | None]:
    """(upstream tag, TT config key, its member): baked into the image (LAB_UPSTREAM_TAG, LAB_TT_CONFIG_KEY,
    LAB_TT_CONFIG_MEMBER), else derived from an upstream tree on sys.path (a test outside Docker)."""
    tag = os.environ.get("LAB_UPSTREAM_TAG")
    key = os.environ.get("LAB_TT_CONFIG_KEY")
    member = os.environ.get("LAB_TT_CONFIG_MEMBER") or None
    if not key:
        spec_py = _find_on_path("workflows/model_spec.py")
        if spec_py is not None:
            key, member = tt_config_source(spec_py.read_text(encoding="utf-8"))
    if not tag:
        version = _find_on_path("VERSION")
        if version is not None:
            tag = "v" + version.read_text(encoding="utf-8").strip()
    return tag, key, member


def redacted_env() -> dict[str, str]:
    return {name: ("<set>" if SECRET_NAME.search(name) else value) for name, value in sorted(os.environ.items())}


def parse_vllm_argv(argv: list[str]) -> dict[str, Any]:
    """vLLM's reading of its arguments: ``--a-b v``, ``--a_b v``, ``--a-b=v``, bare flags (True); ``-`` and ``_``
    are one; the last occurrence wins. Several values after one option (nargs="+") make a list."""
    args: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--") or token == "--":
            args.setdefault("_positional", []).append(token)
            continue
        name, has_value, value = token[2:].partition("=")
        key = name.replace("-", "_")
        if has_value:
            args[key] = value
            continue
        values = []
        while index < len(argv) and not argv[index].startswith("--"):
            values.append(argv[index])
            index += 1
        args[key] = True if not values else values[0] if len(values) == 1 else values
    return args


def tt_config(vllm_args: dict[str, Any], key: str | None, member: str | None) -> tuple[Any, Json]:
    """The TT config the image's vLLM reads (from ``key``, its ``member`` when set), and the other TT keys given."""
    def decoded(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    ignored = {name: decoded(vllm_args[name]) for name in TT_CONFIG_KEYS if name in vllm_args and name != key}
    if key is None or key not in vllm_args:
        return None, ignored
    value = decoded(vllm_args[key])
    if member is not None:
        value = value.get(member) if isinstance(value, dict) else None
    return value, ignored


class Hooks:
    """The lab's test hooks in the cache volume."""

    def __init__(self) -> None:
        self.cache_root = Path(os.environ.get("CACHE_ROOT") or DEFAULT_CACHE_ROOT)

    def crash_requested(self) -> bool:
        return (self.cache_root / ".lab-crash").exists()

    def failing_health(self) -> bool:
        return (self.cache_root / ".lab-fail-health").exists()

    def start_delay(self) -> float:
        try:
            return float((self.cache_root / ".lab-start-delay").read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def write_kernels(self, marker: str) -> str | None:
        """Write the stand-in kernel file under TT_CACHE_PATH; an error message when TT_CACHE_PATH is refused."""
        cache_path = os.environ.get("TT_CACHE_PATH")
        if not cache_path:
            return None
        root = os.path.realpath(self.cache_root)
        if not os.path.realpath(cache_path).startswith(root + os.sep):
            return f"TT_CACHE_PATH {cache_path} is outside CACHE_ROOT {self.cache_root}: mount the volume there"
        os.makedirs(cache_path, exist_ok=True)
        with open(os.path.join(cache_path, "lab-standin-kernels.txt"), "w", encoding="utf-8") as handle:
            handle.write(marker + "\n")
        return None


def prepare(record: Json, prefix: str, kernels_marker: str) -> int | None:
    """Print and save the record, then apply the start hooks: an exit status, or None to serve."""
    log(f"{prefix}: start {json.dumps(record, sort_keys=True)}")
    record_path = os.environ.get("LAB_VLLM_RECORD")
    if record_path:
        Path(record_path).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if os.environ.get("LAB_VLLM_NO_SERVE") == "1":
        log(f"{prefix}: LAB_VLLM_NO_SERVE=1, not serving")
        return 0
    hooks = Hooks()
    if hooks.crash_requested():
        log(f"{prefix}: .lab-crash present in CACHE_ROOT, exiting with 3")
        return 3
    refused = hooks.write_kernels(kernels_marker)
    if refused:
        log(f"{prefix}: {refused}")
        return 2
    delay = hooks.start_delay()
    if delay > 0:
        log(f"{prefix}: .lab-start-delay, waiting {delay:g} s before serving")
        time.sleep(delay)
    return None


def _answer(model: str, prompt: str) -> tuple[str, str]:
    digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:16]
    return digest, f"lab stand-in {model}: {digest}"


def vllm_metrics(model: str, finished: int) -> str:
    """A few of vLLM's own metric families, named and labelled as vLLM's /metrics names them."""
    labels = f'engine="0",model_name="{model}"'
    families = [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "", 0),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "", 0),
        ("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "", 0.0),
        ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
         ',finished_reason="stop"', finished),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "", finished * 8),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", "", finished * 16),
    ]
    lines = []
    for name, kind, text, extra, value in families:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{labels}{extra}}} {value}"]
    return "\n".join(lines) + "\n"


def serve(host: str, port: int, models: list[str], api_key: str | None, record: Json, prefix: str,
          open_models: bool = False) -> int:
    """Serve until SIGTERM (exit status 0); ``open_models``: GET /v1/models needs no key."""
    hooks = Hooks()
    record_body = json.dumps(record, sort_keys=True).encode()
    served = {"stop": 0}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: Any, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if api_key is None:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                failing = hooks.failing_health()
                self._send(503 if failing else 200, {"status": "failing" if failing else "ok"})
            elif path == "/lab/config":
                self._send(200, None, record_body)
            elif path == "/metrics":
                data = vllm_metrics(models[0], served["stop"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/v1/models":
                if open_models or self._authorised():
                    data = [{"id": name, "object": "model", "owned_by": "lab"} for name in models]
                    self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, {"error": "not found"})
                return
            if not self._authorised():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
                chat = path == "/v1/chat/completions"
                prompt = request["messages"][-1]["content"] if chat else request["prompt"]
            except (ValueError, KeyError, IndexError, TypeError):
                self._send(400, {"error": "expected {messages: [{role, content}]} or {prompt}"})
                return
            # As the lab's first stand-in answered (molecule/serve/verify.yml): the served model, whatever the request
            # names, and a digest of the served model and the prompt text.
            model = models[0]
            served["stop"] += 1
            digest, text = _answer(model, prompt if isinstance(prompt, str) else json.dumps(prompt))
            if chat:
                choice: Json = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                self._send(200, {"id": f"chatcmpl-{digest}", "object": "chat.completion", "model": model,
                                 "choices": [choice]})
            else:
                self._send(200, {"id": f"cmpl-{digest}", "object": "text_completion", "model": model,
                                 "choices": [{"index": 0, "finish_reason": "stop", "text": text}]})

        def log_message(self, fmt: str, *fmt_args: Any) -> None:
            status = fmt_args[1] if len(fmt_args) > 1 else ""
            log(f"INFO:     {self.client_address[0]} - \"{self.command} {self.path}\" {status}")

    server = ThreadingHTTPServer((host, port), Handler)
    stop: Callable[..., None] = lambda *_: sys.exit(0)  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    log(f"INFO:     Uvicorn running on http://{host}:{port} ({prefix}, LAB STAND-IN)")
    log("INFO:     Application startup complete.")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
