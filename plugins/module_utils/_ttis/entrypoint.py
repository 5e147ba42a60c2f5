# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""What a tt-inference-server vLLM image does with its start-up input, by the release that built the image.

Private to the collection. Pure functions, standard library only.

Every vLLM image starts ``vllm-tt-metal/src/run_vllm_api_server.py`` of the release that built it (the version its tag
starts with), and that release's vLLM reads the TT config from the argument its ``workflows/model_spec.py`` writes. The
rules differ by generation; the collection's run.py rules (``container._rules``) are keyed on the *catalog's* release,
these on the *image's*, because a catalog pins images of many older releases (v0.20.0 pins 0.11.1 for 15 specs).

``tests/fixtures/ttis/entrypoint-parity.json`` records the same facts as derived from upstream's code at each release,
and the unit tests hold this table to it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    JSON = dict[str, Any]


class Generation(NamedTuple):
    """How one generation of images turns a spec and container arguments into vLLM's start.

    - ``cli_over_spec``: a container argument replaces the spec's vLLM argument of the same name
      (``set_vllm_sys_argv``). False in 0.11.x, where the spec's arguments are appended after the command line and the
      last value wins, so the spec's value beats the argument.
    - ``service_port_to_vllm``: ``--service-port`` becomes vLLM's ``--port``. In 0.11.x the wrapper keeps it for its
      trace-capture client only, and vLLM listens on the spec's ``port`` or 8000.
    - ``tt_config_arg``: the vLLM argument that carries the TT config; ``tt_config_wrapped`` when its value is
      ``{"tt": config}`` rather than the config itself.
    - ``weights_always_checked``: without MODEL_WEIGHTS_DIR the entrypoint calls ``snapshot_download`` even when the
      weights directory is full (falling back to it when the hub cannot be reached); before, a non-empty directory was
      used as it is.
    """

    first: tuple[int, int, int]
    label: str
    cli_over_spec: bool
    service_port_to_vllm: bool
    tt_config_arg: str
    tt_config_wrapped: bool
    weights_always_checked: bool


# Oldest first. The interface before 0.11.0 (TT_MODEL_SPEC_JSON_PATH, gosu) is refused by container.py (legacy).
GENERATIONS = (
    Generation((0, 11, 0), "0.11", False, False, "override_tt_config", False, False),
    Generation((0, 12, 0), "0.12-0.14", True, True, "override_tt_config", False, False),
    Generation((0, 15, 0), "0.15", True, True, "plugin_config", True, False),
    Generation((0, 16, 0), "0.16-0.18", True, True, "additional_config", True, False),
    Generation((0, 19, 0), "0.19 and later", True, True, "additional_config", True, True),
)
CURRENT = GENERATIONS[-1]
# Every argument that has carried the TT config to vLLM in some generation.
TT_CONFIG_ARGS = frozenset(generation.tt_config_arg for generation in GENERATIONS)


def generation(version: tuple[int, ...] | None) -> Generation:
    """The generation of an image of ``version``; None (not a tt-inference-server tag, or ``latest``) is the newest."""
    if version is None:
        return CURRENT
    found = GENERATIONS[0]
    for candidate in GENERATIONS:
        if tuple(version[:3]) >= candidate.first:
            found = candidate
    return found


def tt_config_of(vllm_args: Mapping[str, Any], override_tt_config: object) -> JSON:
    """The TT config a spec carries: its ``device_model_spec.override_tt_config``, else the one in its vLLM arguments.

    ``overrides.apply_overrides`` keeps the two in step; a runtime spec may give only the argument.
    """
    if isinstance(override_tt_config, dict) and override_tt_config:
        return dict(override_tt_config)
    for name in sorted(TT_CONFIG_ARGS):
        text = vllm_args.get(name)
        if not isinstance(text, str) or not text:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and name != "override_tt_config":
            value = value.get("tt")
        if isinstance(value, dict) and value:
            return value
    return dict(override_tt_config) if isinstance(override_tt_config, dict) else {}


def check_carried(where: str, vllm_args: Mapping[str, Any], gen: Generation, version: str) -> None:
    """Refuse a spec whose TT config argument holds more than ``{"tt": ...}`` for an image that reads another one.

    ``additional_config`` and ``plugin_config`` are vLLM's own settings, of which the TT config is one member; an image
    that reads ``override_tt_config`` (or the other name) has nowhere to put the rest.
    """
    for name in sorted(TT_CONFIG_ARGS - {gen.tt_config_arg, "override_tt_config"}):
        text = vllm_args.get(name)
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            value = None
        others = sorted(set(value) - {"tt"}) if isinstance(value, dict) else []
        if others or (text not in (None, "") and not isinstance(value, dict)):
            raise ValueError(
                f"{where}: vllm_args.{name} holds {others or [text]!r} besides the TT config, which an image of "
                f"{version} cannot carry: its vLLM reads the TT config from --{gen.tt_config_arg} and has no "
                f"--{name}. Serve an image of a release whose vLLM reads {name} (0.16.0 or later for "
                "additional_config), or keep only the TT config in it."
            )


def json_arguments(vllm_args: Mapping[str, Any]) -> JSON:
    """``vllm_args`` with each mapping or list value as its JSON text.

    Every entrypoint renders a value with ``str()``, which turns a mapping into Python's repr (single quotes, True),
    text vLLM cannot parse; JSON text passes through unchanged.
    """
    return {key: json.dumps(value) if isinstance(value, (dict, list)) else value for key, value in vllm_args.items()}


def encode_tt_config(vllm_args: Mapping[str, Any], tt_config: Mapping[str, Any], gen: Generation) -> JSON:
    """``vllm_args`` with the TT config under the argument ``gen``'s vLLM reads, and no other TT config argument.

    The image's own catalog has exactly that (its ``model_spec.py`` writes it even for an empty config), so a resolved
    spec mounted in its place says the same thing in the same words.
    """
    out = {key: value for key, value in vllm_args.items() if key not in TT_CONFIG_ARGS}
    out[gen.tt_config_arg] = json.dumps({"tt": dict(tt_config)} if gen.tt_config_wrapped else dict(tt_config))
    return out
