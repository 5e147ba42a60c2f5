# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Serving instances of the fleet contract: names, ports, boards and env files.

Pure functions, standard library only. One instance per ``tt_models`` entry: its name is the entry's
``instance`` or a slug of the short model name; it runs as ``tt-serve@<instance>.service`` with its
configuration in ``/etc/ttfleet/serve/<instance>.conf``, its secrets in ``<instance>.env`` beside it
and its state in ``/var/lib/ttfleet/serve/<instance>.json``.
"""

from __future__ import annotations

import re
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]

DEFAULT_BASE_PORT = 8000

# The variable each engine's server reads its API key from (UPSTREAM.md, "Secrets and auth").
API_KEY_VARIABLE = {"vllm": "VLLM_API_KEY", "media": "API_KEY", "forge": "API_KEY"}
# Media servers fall back to this well-known key when API_KEY is unset; never use it.
UPSTREAM_DEFAULT_KEYS = frozenset({"your-secret-key"})

# The entry's keys an instance carries on (after ttfleet.inference.tt_model_entries applied profiles and packages).
PASSED_KEYS = (
    "impl",
    "engine",
    "image",
    "image_archive",
    "image_archive_s3_key",
    "image_archive_sha256",
    "spec",
    "profile",
    "kernel_cache",
    "vllm_override_args",
    "override_tt_config",
    "env",
    "ready_log_marker",
    "start_timeout",
    "first_start_timeout",
)

_INSTANCE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_ENV_VALUE = re.compile(r"^[\x21-\x7e]+\Z")


class ServeError(ValueError):
    """Bad input; the message names it and says how to fix it."""


def short_name(name: object) -> str:
    return str(name).rstrip("/").rsplit("/", 1)[-1]


def slug(name: object) -> str:
    """Lower-case short model name with every run of other characters turned into '-'."""
    text = re.sub(r"[^a-z0-9]+", "-", short_name(name).lower()).strip("-")
    return text[:63].rstrip("-")


def instance_name(entry: Mapping[str, Any]) -> str:
    """The entry's ``instance`` key, or the slug of its model name."""
    given = entry.get("instance")
    if given not in (None, ""):
        if not _INSTANCE.match(str(given)):
            raise ServeError(
                f"tt_models entry {entry.get('name')!r} has instance {given!r}; an instance name is 1-63 lower-case "
                "letters, digits and '-', starting with a letter or digit "
                f"(for example {slug(entry.get('name', 'x'))!r})."
            )
        return str(given)
    name = slug(entry.get("name", ""))
    if not name:
        raise ServeError(
            f"tt_models entry {entry.get('name')!r} gives no usable instance name; set its instance key "
            "(lower-case letters, digits and '-')."
        )
    return name


def _boards(ids: set[int]) -> str:
    return "every board" if not ids else f"device ids {sorted(ids)}"


def plan_instances(
    models: list[Any] | None, device: str | None, base_port: int | str = DEFAULT_BASE_PORT
) -> tuple[list[JSON], list[str]]:
    """Instances of ``models`` (tt_models) and the clashes between them.

    Returns ``(instances, problems)``. Each instance is a dict with ``instance``, ``name``, ``index``
    (position in tt_models), ``state``, ``device`` (the entry's or ``device``), ``port`` (the entry's
    or ``base_port + index``), ``device_ids`` (empty: every board) and the entry's optional keys
    of ``PASSED_KEYS``. ``problems`` lists clashes of present instances
    (a port or a board used twice, both model names given) and names used twice.
    """
    instances: list[JSON] = []
    problems: list[str] = []
    for index, entry in enumerate(models or []):
        if not isinstance(entry, dict) or not entry.get("name"):
            raise ServeError(f"tt_models entry {index} ({entry!r}) has no name; every entry needs the model's name.")
        port = entry.get("port")
        port = int(base_port) + index if port in (None, "") else int(port)
        ids = entry.get("device_ids") or []
        instance: JSON = {
            "instance": instance_name(entry),
            "name": str(entry["name"]),
            "index": index,
            "state": entry.get("state") or "present",
            "device": str(entry.get("device") or device or "").lower(),
            "port": port,
            "device_ids": sorted(int(i) for i in ids),
        }
        for key in PASSED_KEYS:
            if entry.get(key) not in (None, "", {}, []):
                instance[key] = entry[key]
        if not 1 <= port <= 65535:
            problems.append(
                f"{instance['name']} (instance {instance['instance']}) would serve on port {port}, outside 1-65535: "
                "set its port or a lower serve_base_port"
            )
        instances.append(instance)

    seen: dict[str, JSON] = {}
    for item in instances:
        other = seen.get(item["instance"])
        if other is not None:
            problems.append(
                f"{other['name']} and {item['name']} both get instance name {item['instance']}: set a distinct "
                "instance key on one of them"
            )
        seen.setdefault(item["instance"], item)

    present = [item for item in instances if item["state"] == "present"]
    for position, first in enumerate(present):
        for second in present[position + 1 :]:
            if first["port"] == second["port"]:
                problems.append(
                    f"port clash: {first['name']} (instance {first['instance']}) and {second['name']} (instance "
                    f"{second['instance']}) both serve on port {first['port']}: give one of them another port"
                )
            ids_first, ids_second = set(first["device_ids"]), set(second["device_ids"])
            if not ids_first or not ids_second or ids_first & ids_second:
                shared = sorted(ids_first & ids_second) if ids_first and ids_second else None
                where = f"device ids {shared}" if shared else "every board"
                problems.append(
                    f"board clash: {first['name']} (instance {first['instance']}, {_boards(ids_first)}) and "
                    f"{second['name']} (instance {second['instance']}, {_boards(ids_second)}) share {where}: give "
                    "each its own device_ids"
                )
    return instances, problems


# Accepted bandit B104: binds nothing; a port published on every IPv4 address is probed on loopback instead.
_ANY_IPV4 = "0.0.0.0"  # nosec B104


def health_host(bind_host: str | None) -> str:
    """Address the host itself reaches a published port on."""
    if bind_host in (_ANY_IPV4, "", None):
        return "127.0.0.1"
    return "[::1]" if bind_host == "::" else bind_host


# ---------------------------------------------------------------------------------------------
# Env files: KEY=VALUE lines, read by docker run --env-file (no quoting, no expansion).


def parse_env(text: str | None) -> dict[str, str]:
    """The variables of an env file; blank lines and comments are skipped."""
    values: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _sep, value = line.partition("=")
        values[key.strip()] = value
    return values


def render_env(values: Mapping[str, Any], header: str = "") -> str:
    """Env file text for ``values``, keys sorted; refuses what docker --env-file cannot carry."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    for key in sorted(values):
        value = values[key]
        if not _ENV_NAME.match(key):
            raise ServeError(f"env variable name {key!r} is not valid; use letters, digits and '_'.")
        if not isinstance(value, str) or not _ENV_VALUE.match(value):
            raise ServeError(
                f"the value of {key} must be printable ASCII without spaces (docker --env-file takes the rest of the "
                "line literally); give another value."
            )
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def new_secret() -> str:
    """A fresh API key: 43 URL-safe characters (256 bits)."""
    return secrets.token_urlsafe(32)


def desired_env(
    engine: object,
    existing: Mapping[str, str],
    api_key: str | None = None,
    hf_token: str | None = None,
    no_auth: bool = False,
) -> tuple[dict[str, str], bool]:
    """The env file variables of an instance and whether its API key is newly generated.

    Only what the container needs: its engine's API key variable (the given ``api_key``, else the one
    already in the file, else a new one) unless ``no_auth``, and ``HF_TOKEN`` when given.
    """
    variable = API_KEY_VARIABLE.get(str(engine).lower())
    if variable is None:
        raise ServeError(f"inference engine {engine!r} is not one of vLLM, media, forge.")
    if api_key in UPSTREAM_DEFAULT_KEYS:
        raise ServeError(
            "serve_api_keys gives upstream's well-known default key; give a random one or leave it out to have "
            "one generated on the host."
        )
    values: dict[str, str] = {}
    generated = False
    if not no_auth:
        key = api_key or existing.get(variable)
        if not key or key in UPSTREAM_DEFAULT_KEYS:
            key = new_secret()
            generated = True
        values[variable] = key
    if hf_token:
        values["HF_TOKEN"] = hf_token
    return values, generated
