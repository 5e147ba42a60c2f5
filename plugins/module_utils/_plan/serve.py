# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Serving instances of the fleet contract: names, ports, boards, env files, and the serve plan of a host.

Pure functions, standard library only. One instance per ``tt_models`` entry: its name is the entry's
``instance`` or a slug of the short model name; it runs as ``tt-serve@<instance>.service`` with its
configuration in ``/etc/ttfleet/serve/<instance>.conf``, its secrets in ``<instance>.env`` beside it
and its state in ``/var/lib/ttfleet/serve/<instance>.json``.
"""

from __future__ import annotations

import re
import secrets
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
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


class ServeError(FleetError, ValueError):
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


def retired_instances(state_files: Iterable[Mapping[str, Any]], instances: Iterable[Mapping[str, Any]]) -> list[str]:
    """The instances whose state file is in the serve state dir but that no tt_models entry names any more.

    ``state_files``: the ``files`` of ansible.builtin.find over the state dir (``*.json``), each with ``path`` and
    ``isreg``. ``instances``: the host's planned instances (present and absent). A state file whose name is not
    ``<instance>.json``, or that is not a regular file, is refused, naming it: it is not one the serve role wrote."""
    listed = {item["instance"] for item in instances}
    retired = set()
    for found in state_files:
        path = str(found["path"])
        name = path.rsplit("/", 1)[-1]
        stem, dot, ext = name.rpartition(".")
        if not dot or ext != "json" or not _INSTANCE.match(stem) or not found.get("isreg", True):
            raise ServeError(
                f"{path} is not a state file of the serve role (those are regular files named <instance>.json, with "
                "1-63 lower-case letters, digits and '-'); it cannot say which instance to retire. Move it out of "
                "the state directory, or set serve_retire_unlisted: false."
            )
        if stem not in listed:
            retired.add(stem)
    return sorted(retired)


# Accepted bandit B104: binds nothing; a port published on every IPv4 address is probed on loopback instead.
_ANY_IPV4 = "0.0.0.0"  # nosec B104


def health_host(bind_host: str | None) -> str:
    """Address the host itself reaches a published port on."""
    if bind_host in (_ANY_IPV4, "", None):
        return "127.0.0.1"
    return "[::1]" if bind_host == "::" else bind_host


# ---------------------------------------------------------------------------------------------
# The serve plan of a host, from the results of the role's tasks (roles/serve/tasks): which images are fetched and
# from where, which volumes are missing, and what restarts an instance.

# The entry keys of an instance that travel with its image to ttfleet.inference.container_image, by their name there.
_ARCHIVE_KEYS = (
    ("image_archive", "archive"),
    ("image_archive_s3_key", "archive_s3_key"),
    ("image_archive_sha256", "archive_sha256"),
)


def image_list(commands: Iterable[Mapping[str, Any]] | None) -> list[JSON]:
    """The images of the present instances, each once, first instance first.

    ``commands``: the loop results of ttfleet.inference.container_command, each with the instance it was computed
    for under ``__serve_instance``. Each image is ``{image, origin}`` (the reference mapped by tt_registry_mirrors
    and the one upstream names), with the first instance's archive (``archive``, ``archive_s3_key``,
    ``archive_sha256``) when its entry names one. A skipped result (no ``image``) adds nothing.
    """
    found: dict[str, JSON] = {}
    for command in commands or []:
        if "image" not in command or command["image"] in found:
            continue
        entry: JSON = {"image": command["image"], "origin": command["image_origin"]}
        instance = command.get("__serve_instance") or {}
        for key, name in _ARCHIVE_KEYS:
            if key in instance:
                entry[name] = instance[key]
        found[command["image"]] = entry
    return list(found.values())


def mirror_list(pulls_by_host: Iterable[Iterable[Mapping[str, Any]] | None]) -> list[JSON]:
    """What the site cache host copies into the site registry: ``{source, target}`` per mirrored name, once.

    ``pulls_by_host``: per host of the play, the images it pulls from a registry (its fact serve_registry_pulls,
    each ``{image, origin, ...}``). An image pulled under its own name (no mirror) is the registry's, not the site's.
    """
    found: dict[str, JSON] = {}
    for pulls in pulls_by_host or []:
        for image in pulls or []:
            if image["image"] != image["origin"] and image["image"] not in found:
                found[image["image"]] = {"source": image["origin"], "target": image["image"]}
    return list(found.values())


def _ran(result: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A registered result, or nothing when the task was skipped or never ran."""
    return {} if not result or result.get("skipped") else result


def image_fetch_list(images: Iterable[Mapping[str, Any]], mirrored: Mapping[str, Any] | None) -> list[JSON]:
    """``images`` (see :func:`image_list`), each with the ``size`` the site copy (ttfleet.inference.image_mirror's
    result ``mirrored``) gave its mirrored name: in check mode nothing is in the site registry yet to measure."""
    sizes = {image["target"]: image["image_bytes"] for image in _ran(mirrored).get("images") or []}
    return [dict(entry, size=sizes[entry["image"]]) if entry["image"] in sizes else dict(entry) for entry in images]


def image_records(probe: Mapping[str, Any] | None, fetched: Mapping[str, Any] | None) -> dict[str, JSON]:
    """image -> what the host has (ttfleet.inference.container_image: id, digest, pinned), after the fetch: the
    probe's answer, replaced by the fetch's where it ran."""
    found: dict[str, JSON] = {}
    for image in [*(_ran(probe).get("images") or []), *(_ran(fetched).get("images") or [])]:
        found[image["image"]] = image
    return found


def run_argv(command: Mapping[str, Any], record: Mapping[str, Any] | None, pin_digest: bool) -> list[str]:
    """The container argv of an instance with the reference its unit runs: ``name:tag@digest`` when the registry gave
    a digest and serve_image_pin_digest is on, else the image as computed."""
    image = command["image"]
    run = ((record or {}).get("pinned") or image) if pin_digest else image
    return [run if arg == image else arg for arg in command["argv"]]


def volumes_missing(
    results: Iterable[Mapping[str, Any]] | None, cache_plan: Mapping[str, Any] | None, check_mode: bool
) -> list[str]:
    """The present instances whose volume does not exist, as ``'instance (path)'``.

    ``results``: the loop results of ttfleet.inference.container_command for the present instances (each with its
    ``volume``, ``volume_exists`` and the loop's ``__serve_instance``), or, as before, the loop results of a stat of
    each volume (``stat.exists``, the container command as ``item``). In check mode a volume that model_cache plans in
    the same run (its result ``cache_plan``, model_cache_plan) is created by then.
    """
    planned = [model["volume"]["path"] for model in (cache_plan or {}).get("models") or []] if check_mode else []
    missing = []
    for result in results or []:
        if "stat" in result:
            item, exists = result["item"], (result.get("stat") or {}).get("exists", False)
        else:
            item, exists = result, result.get("volume_exists")
        # None: a Docker named volume, which docker creates itself.
        if exists is False and item["volume"] not in planned:
            missing.append(f"{item['__serve_instance']['instance']} ({item['volume']})")
    return missing


def changed(result: Mapping[str, Any] | None) -> bool:
    """Ansible's ``changed`` test: the result's flag, or any loop result's."""
    result = result or {}
    if "changed" in result:
        return bool(result["changed"])
    results = result.get("results")
    return isinstance(results, list) and any(isinstance(item, dict) and item.get("changed") for item in results)


def unit_plan(causes: Mapping[str, Mapping[str, Any] | None], check_mode: bool) -> JSON:
    """Whether an instance's unit restarts, why, and whether it can be asked about at all.

    ``causes``: the results of the tasks whose change takes effect only in a new container, by what they wrote:
    ``configuration`` (the argv, so a new image too), ``secrets`` (the env file), ``units`` (the template units),
    ``wrapper`` and ``model spec``. Returns ``state`` (``restarted`` when any of them changed, else ``started``),
    ``reasons`` (the names of those that changed) and ``asked``: false in check mode when the template units or the
    configuration are not installed yet, so systemd cannot know the unit.
    """
    reasons = [name for name, result in causes.items() if changed(result)]
    unknown = changed(causes.get("units")) or changed(causes.get("configuration"))
    return {
        "state": "restarted" if reasons else "started",
        "reasons": reasons,
        "asked": not (check_mode and unknown),
    }


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
