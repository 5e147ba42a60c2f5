# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

"""What a host still needs before ttfleet.inference.disk_prune lists the rest (the prune playbook, issue 33).

Pure functions, standard library only. The kept releases are the two the ``current`` and ``previous`` links point at
(``fleet_status``); each is planned with ``model_cache_plan`` (``weights: false``) for the host's present models,
which gives the volumes, kernel keys and images they expect. A kept release that is gone or cannot be read keeps every
volume of the host's models: the safe side.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.space import human_bytes
from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import map_image, parse_reference
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import parse_volume_name

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]

# The kernel key fields disk_prune keeps spool archives by (model_cache_plan's records[].kernel without the volume).
KERNEL_KEY_FIELDS = ("model_name", "mesh", "impl_id", "tt_metal_commit", "vllm_commit")


class PruneError(FleetError, ValueError):
    """Input the prune plan cannot use; the message names it and the fix."""


def kept_releases(status: Mapping[str, Any], release_root: str) -> list[JSON]:
    """The releases prune keeps, from a fleet_status result: ``[{role, release, dir}]``, current first.

    The same tag twice (previous pointing at current) is kept once."""
    if not isinstance(release_root, str) or not release_root.startswith("/"):
        raise PruneError(f"the release root must be an absolute path (tt_release_root), got {release_root!r}")
    kept: list[JSON] = []
    for role, key in (("current", "release"), ("previous", "previous_release")):
        tag = status.get(key)
        if not tag or any(item["release"] == tag for item in kept):
            continue
        if not isinstance(tag, str) or "/" in tag or tag in (".", ".."):
            raise PruneError(f"fleet_status gave the {role} release as {tag!r}, which is not a release tag")
        kept.append({"role": role, "release": tag, "dir": posixpath.join(release_root, "releases", tag)})
    return kept


def _image(record: Mapping[str, Any]) -> str | None:
    entry = record.get("entry") or {}
    spec = record.get("spec") or {}
    return entry.get("image") or spec.get("docker_image") or None


def _model_names(models: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The model names the host's volumes may carry: the entries' short names and the specs' model names."""
    names = {str(model.get("name") or "").rsplit("/", 1)[-1] for model in models}
    names.update(str((record.get("spec") or {}).get("model_name") or "") for record in records)
    names.discard("")
    return names


def host_needs(
    plans: Iterable[Mapping[str, Any]],
    models: Iterable[Mapping[str, Any]],
    volume_names: Iterable[str],
    mirrors: Mapping[str, str] | None = None,
) -> JSON:
    """What the kept releases need on the host, for disk_prune.

    ``plans``: the results of model_cache_plan (``weights: false``) looped over ``kept_releases``, each with its
    release as ``item`` (``failed`` with ``msg`` when the release dir is gone or cannot be read). ``models``: the
    host's tt_models entries (absent ones are ignored). ``volume_names``: the entries of the volume root.
    ``mirrors``: tt_registry_mirrors, as serve maps the spec's image.

    Returns ``needed_volumes``, ``needed_kernel_keys``, ``needed_images``, ``image_repositories`` (the repositories of
    the kept images: their other tags are candidates), ``notes`` (one line per kept release that keeps every volume of
    the models) and ``releases`` (the tags planned). A host with models but no kept release keeps every volume of them
    too."""
    models = [model for model in models if (model.get("state") or "present") == "present"]
    plans = list(plans)
    volumes: set[str] = set()
    keys: list[JSON] = []
    images: set[str] = set()
    repositories: set[str] = set()
    notes: list[str] = []
    records: list[Mapping[str, Any]] = []
    planned = []
    if models and not plans:
        notes.append(
            "no tt-inference-server release is linked as current or previous: every volume of the host's models is kept"
        )
    for plan in plans:
        release = plan.get("item") or {}
        if plan.get("failed") or "models" not in plan:
            notes.append(
                f"the {release.get('role', 'kept')} release {release.get('release')} at {release.get('dir')} cannot be "
                f"read ({_first_line(plan.get('msg'))}): every volume of the host's models is kept"
            )
            continue
        planned.append(release.get("release"))
        for record in plan["models"]:
            records.append(record)
            kernel = record.get("kernel") or {}
            if kernel.get("volume_name"):
                volumes.add(kernel["volume_name"])
            key = {field: str(kernel.get(field) or "") for field in KERNEL_KEY_FIELDS}
            if key["model_name"] and key not in keys:
                keys.append(key)
            image = _image(record)
            if image:
                mapped, _prefix = map_image(image, mirrors or {}, f"the image of {record.get('name')}")
                images.add(mapped)
                repositories.add(parse_reference(mapped).name)
    if notes and models:
        names = _model_names(models, records)
        for volume in volume_names:
            parsed = parse_volume_name(volume)
            if parsed["parsed"] and parsed["model_name"] in names:
                volumes.add(volume)
    return {
        "needed_volumes": sorted(volumes),
        "needed_kernel_keys": keys,
        "needed_images": sorted(images),
        "image_repositories": sorted(repositories),
        "notes": notes,
        "releases": planned,
    }


def _first_line(text: object) -> str:
    line = str(text or "unknown error").strip().splitlines()[0] if str(text or "").strip() else "unknown error"
    return line[:300]


def _size(count: int) -> str:
    return f"{count} bytes ({human_bytes(count)})"


def report_line(host: str, result: Mapping[str, Any], check_mode: bool) -> str:
    """One line per host after disk_prune: what went (or would go), the unneeded items that stay, what is pending."""
    items = result.get("items") or []
    removing = [item for item in items if item.get("action") == "remove"]
    kinds: dict[str, int] = {}
    for item in removing:
        kinds[item.get("kind", "?")] = kinds.get(item.get("kind", "?"), 0) + 1
    what = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "nothing"
    # Unneeded (a reason) but left: a factory volume, an alias target, something in use, a kind not allowed.
    held = [item for item in items if item.get("action") != "remove" and item.get("reason")]
    if check_mode:
        text = f"{host}: prune would reclaim {_size(int(result.get('reclaimable_bytes') or 0))} ({what})"
    else:
        text = f"{host}: reclaimed {_size(int(result.get('reclaimed_bytes') or 0))} ({what})"
    if held:
        text += (
            f"; {len(held)} unneeded item(s) stay by default or in use (name them in prune_remove, or add their kind "
            "to prune_kinds; --check --diff says why)"
        )
    if result.get("pending"):
        text += f"; {len(result['pending'])} left for the next run (time limit)"
    return text + "."


def pressure_text(host: str, result: Mapping[str, Any] | None, inventory: Iterable[str] | str | None) -> str:
    """What to add to a failed disk check: what prune would reclaim on the host (disk_prune with kinds: [], which
    removes nothing and counts what a run with every kind would free) and the command that does it."""
    sources = [inventory] if isinstance(inventory, str) else list(inventory or [])
    where = " ".join(f"-i {source}" for source in sources) or "-i <inventory>"
    command = f"ansible-playbook {where} ttfleet.inference.prune --limit {host}"
    if not result or result.get("failed") or "reclaimable_bytes" not in result:
        why = _first_line((result or {}).get("msg")) if result else "not computed"
        return f"What prune would reclaim on {host} is unknown ({why}); see with: {command} --check --diff"
    total = int(result.get("reclaimable_bytes") or 0)
    if not total:
        return f"Prune would reclaim nothing on {host}: the kept releases need everything prune may remove there."
    return (
        f"Prune would reclaim {_size(total)} on {host} ({_first_line(result.get('msg'))}; factory and aliased volumes "
        f"stay unless named): {command} (add --check --diff to see each item first)."
    )
