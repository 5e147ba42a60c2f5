"""LAB STAND-IN for a tt-inference-server image (tests only; no model, no device access).

Honours the container contract the serve role relies on, as the vLLM images do:
  - arguments --model <hf repo> --tt-device <device> [--service-port P] [--no-auth]
    (media/forge images take none and read MODEL and DEVICE from the environment, listening on 8000);
  - the cache_root bind mount at /home/container_app_user/cache_root and TT_CACHE_PATH under it,
    where it writes a marker file, as the real server writes its tensor cache;
  - GET /health (200 once up), GET /v1/models (lists the model), POST /v1/chat/completions with a
    deterministic answer;
  - the bearer key: VLLM_API_KEY, else the JWT signed with JWT_SECRET (HS256, upstream's fixed
    payload), else API_KEY for media; 401 without it, none needed with --no-auth or NO_AUTH=1;
  - logs "Application startup complete." when serving.
As run_vllm_api_server does: a spec from RUNTIME_MODEL_SPEC_JSON_PATH (run.py --dev-mode, and the serve role for
tuning and specs from outside the catalog) replaces the image's own, its env_vars are set, and every other argument
is a vLLM argument that replaces the spec's of the same name. GET /lab/config shows the result: the vLLM arguments
the server would start with, the environment it set and where its spec came from.
Test hooks in the cache volume: `.lab-fail-health` makes /health answer 503, `.lab-crash` makes the
server exit with status 3 right after starting (a crash loop), `.lab-start-delay` holds a number of
seconds to wait before serving.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CACHE_ROOT = "/home/container_app_user/cache_root"
JWT_PAYLOAD = {"team_id": "tenstorrent", "token_id": "debug-test"}


def log(message):
    print(message, flush=True)


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_hs256(payload, secret):
    # PyJWT's encoding: compact JSON, header keys sorted, payload keys as given.
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = b64url(json.dumps(payload, separators=(",", ":")).encode())
    signature = hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64url(signature)}"


def expected_key(no_auth):
    if no_auth or os.environ.get("NO_AUTH") == "1":
        return None
    if os.environ.get("VLLM_API_KEY"):
        return os.environ["VLLM_API_KEY"]
    if os.environ.get("JWT_SECRET"):
        return jwt_hs256(JWT_PAYLOAD, os.environ["JWT_SECRET"])
    return os.environ.get("API_KEY") or None


def _arg_name(name):
    return name.lstrip("-").split("=", 1)[0].replace("-", "_")


def effective_config(remaining):
    """The spec's vLLM arguments with the passthrough arguments over them (set_vllm_sys_argv), and its env_vars."""
    spec, source = {}, "image catalog"
    path = os.environ.get("RUNTIME_MODEL_SPEC_JSON_PATH")
    if path:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        spec, source = data.get("runtime_model_spec", data), path
    dms = spec.get("device_model_spec") or {}
    env = {**(dms.get("env_vars") or {}), **(spec.get("env_vars") or {})}
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    args = {_arg_name(key): value for key, value in (dms.get("vllm_args") or {}).items()}
    index = 0
    while index < len(remaining):
        token = remaining[index]
        if token.startswith("--"):
            value = True
            if "=" in token:
                value = token.split("=", 1)[1]
            elif index + 1 < len(remaining) and not remaining[index + 1].startswith("--"):
                value = remaining[index + 1]
                index += 1
            args[_arg_name(token)] = value
        index += 1
    return {"vllm_args": args, "env": env, "spec_source": source, "cli_args": list(remaining)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--tt-device", default=None)
    parser.add_argument("--service-port", type=int, default=8000)
    parser.add_argument("--no-auth", action="store_true")
    args, remaining = parser.parse_known_args()
    try:
        config = effective_config(remaining)
    except (OSError, ValueError) as exc:
        log(f"stand-in: cannot read the runtime model spec: {exc}")
        return 2
    log(f"stand-in: vLLM arguments {json.dumps(config['vllm_args'], sort_keys=True)}")
    model = args.model or os.environ.get("MODEL")
    device = args.tt_device or os.environ.get("DEVICE")
    if not model or not device:
        log("stand-in: give --model and --tt-device (vLLM) or MODEL and DEVICE (media, forge)")
        return 2
    if not os.path.isdir(CACHE_ROOT):
        log(f"stand-in: {CACHE_ROOT} is not mounted")
        return 2
    if os.path.exists(os.path.join(CACHE_ROOT, ".lab-crash")):
        log("stand-in: .lab-crash present in the cache volume, exiting with 3")
        return 3
    cache_path = os.environ.get("TT_CACHE_PATH")
    if cache_path:
        if not cache_path.startswith(CACHE_ROOT + "/"):
            log(f"stand-in: TT_CACHE_PATH {cache_path} is outside {CACHE_ROOT}")
            return 2
        os.makedirs(cache_path, exist_ok=True)
        with open(os.path.join(cache_path, "lab-standin-kernels.txt"), "w", encoding="utf-8") as handle:
            handle.write(f"{model} {device}\n")
    devices = sorted(os.listdir("/dev/tenstorrent")) if os.path.isdir("/dev/tenstorrent") else []
    log(f"stand-in: model {model} on {device}, boards {devices}, port {args.service_port}")
    try:
        with open(os.path.join(CACHE_ROOT, ".lab-start-delay"), encoding="utf-8") as handle:
            time.sleep(float(handle.read().strip() or 0))
    except (OSError, ValueError):
        pass
    key = expected_key(args.no_auth)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self):
            if key is None:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):  # http.server calls it by this name
            if self.path == "/health":
                failing = os.path.exists(os.path.join(CACHE_ROOT, ".lab-fail-health"))
                self._send(503 if failing else 200, {"status": "failing" if failing else "ok"})
            elif self.path == "/lab/config":
                self._send(200, config)
            elif self.path == "/v1/models":
                if self._authorised():
                    self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "lab"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": "not found"})
                return
            if not self._authorised():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
                prompt = request["messages"][-1]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                self._send(400, {"error": "expected {messages: [{role, content}]}"})
                return
            digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()[:16]
            self._send(200, {
                "id": f"chatcmpl-{digest}",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"lab stand-in {model}: {digest}"}}],
            })

        def log_message(self, fmt, *fmt_args):
            log(f"{self.command} {self.path} {fmt_args[1] if len(fmt_args) > 1 else ''}")

    server = ThreadingHTTPServer(("0.0.0.0", args.service_port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log("Application startup complete.")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
