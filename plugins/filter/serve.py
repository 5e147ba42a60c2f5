# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""Jinja filters of the serve role: its plan, decided in plugins/module_utils/_plan/serve.py.

Documentation lives beside this file, one YAML file per filter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.ttfleet.inference.plugins.plugin_utils.lazy import module_utils

_serve = module_utils("_plan.serve")


def serve_instances(models: Any, device: Any, base_port: Any = 8000) -> dict[str, Any]:
    if not isinstance(models, list):
        raise AnsibleFilterError("serve_instances: the input must be tt_models, a list of dicts.")
    try:
        instances, problems = _serve.plan_instances(models, device, int(base_port))
    except (_serve.ServeError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"serve_instances: {exc}") from exc
    return {"instances": instances, "problems": problems}


def serve_retired(state_files: Any, plan: Any) -> list[str]:
    state_files = _results("serve_retired", state_files, "the files of the find over the serve state directory")
    plan = _result("serve_retired", plan, "the serve plan (serve_instances)")
    try:
        return _serve.retired_instances(state_files, plan.get("instances") or [])
    except _serve.ServeError as exc:
        raise AnsibleFilterError(f"serve_retired: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"serve_retired: malformed find results ({exc}).") from None


def _results(name: str, value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise AnsibleFilterError(f"{name}: the input must be {what}, a list of dicts.")
    return value


def _result(name: str, value: Any, what: str) -> Mapping[str, Any]:
    if value is not None and not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: {what} must be a registered result (a dict).")
    return value or {}


def _bool(name: str, value: Any, what: str) -> bool:
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise AnsibleFilterError(f"{name}: {what} must be true or false, got {value!r}.") from None


def _call(name: str, what: str, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"{name}: malformed {what} ({exc}).") from None


def serve_image_list(commands: Any) -> list[dict[str, Any]]:
    commands = _results("serve_image_list", commands, "the results of container_command")
    return _call("serve_image_list", "container_command results", _serve.image_list, commands)


def serve_mirror_list(pulls_by_host: Any) -> list[dict[str, Any]]:
    if not isinstance(pulls_by_host, list) or not all(
        (pulls is None or isinstance(pulls, list)) for pulls in pulls_by_host
    ):
        raise AnsibleFilterError(
            "serve_mirror_list: the input must be the hosts' serve_registry_pulls, a list of lists."
        )
    return _call("serve_mirror_list", "serve_registry_pulls", _serve.mirror_list, pulls_by_host)


def serve_image_fetch_list(images: Any, mirrored: Any = None) -> list[dict[str, Any]]:
    images = _results("serve_image_fetch_list", images, "the image list of serve_image_list")
    mirrored = _result("serve_image_fetch_list", mirrored, "the result of image_mirror")
    return _call("serve_image_fetch_list", "image_mirror result", _serve.image_fetch_list, images, mirrored)


def serve_image_records(probe: Any, fetched: Any = None) -> dict[str, Any]:
    probe = _result("serve_image_records", probe, "the input")
    fetched = _result("serve_image_records", fetched, "the result of the fetch")
    return _call("serve_image_records", "container_image result", _serve.image_records, probe, fetched)


def serve_run_argv(command: Any, record: Any = None, pin_digest: Any = True) -> list[str]:
    command = _result("serve_run_argv", command, "the input")
    record = _result("serve_run_argv", record, "the image record")
    pin = _bool("serve_run_argv", pin_digest, "pin_digest")
    return _call("serve_run_argv", "container_command result", _serve.run_argv, command, record, pin)


def serve_volumes_missing(stats: Any, cache_plan: Any = None, check_mode: Any = False) -> list[str]:
    stats = _results("serve_volumes_missing", stats, "the results of the stat of the volumes")
    cache_plan = _result("serve_volumes_missing", cache_plan, "model_cache_plan")
    check = _bool("serve_volumes_missing", check_mode, "check_mode")
    return _call("serve_volumes_missing", "results", _serve.volumes_missing, stats, cache_plan, check)


def serve_unit_plan(causes: Any, check_mode: Any = False) -> dict[str, Any]:
    if not isinstance(causes, Mapping) or not all((r is None or isinstance(r, Mapping)) for r in causes.values()):
        raise AnsibleFilterError("serve_unit_plan: the input must map what was written to its registered result.")
    return _serve.unit_plan(causes, _bool("serve_unit_plan", check_mode, "check_mode"))


def serve_health_host(bind_host: Any) -> str:
    if bind_host is not None and not isinstance(bind_host, str):
        raise AnsibleFilterError(f"serve_health_host: the input must be serve_bind_host, got {bind_host!r}.")
    return _serve.health_host(bind_host)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "serve_instances": serve_instances,
            "serve_image_list": serve_image_list,
            "serve_mirror_list": serve_mirror_list,
            "serve_image_fetch_list": serve_image_fetch_list,
            "serve_image_records": serve_image_records,
            "serve_run_argv": serve_run_argv,
            "serve_volumes_missing": serve_volumes_missing,
            "serve_unit_plan": serve_unit_plan,
            "serve_health_host": serve_health_host,
            "serve_retired": serve_retired,
        }
