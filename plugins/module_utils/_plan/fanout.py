# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Who fetches a model from its origin, and who pulls it from which peer in which round, across a play.

The rule, per site and per (repository, revision):

* The origin (Hub, bucket, directory) is read at most once. A host whose weights are complete holds the model
  (``done``). When no host of the site holds it, the first host in play order that needs it is the ``seed``: it
  fetches from the origin before the first round.
* The pulls go in doubling rounds. In round 1 every holder serves one host; a host that finished a round holds a
  verified copy and serves in the next round too, so the holders double each round and N hosts are served in
  ceil(log2(N / holders)) rounds instead of N / holders pulls from the same uplinks. Pullers are spread over the
  holders in play order.
* Each pull names its ``peer`` and up to ``MAX_ALTERNATES`` other holders of the same round (``alternates``, the
  list rotated to start after the peer so that a dead holder's pullers spread over the others). A puller asks them
  in turn when its peer fails, resuming where the last one stopped; the origin comes only after all of them.
* Holders serve only in the rounds where some pull names them (``serve_rounds``); a holder serves its own pulls
  (``serve``) and stands by for the alternates of others.
* The first pull of each round (per site and model) shows its progress (``progress``): the pulls of a round move the
  same files at about the same rate, so one line per round tells the operator as much as one per puller, and the
  others run as plain tasks (no job to launch and poll on each of them).
* A model without a pinned revision (a path source, a floating branch) or a host with peers turned off fetches
  from the origin on its own (``origin``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    Entry = Mapping[str, Any]
    ModelKey = tuple[str, str, str]
    Slot = dict[str, Any]

# Holders a puller may fall back to before the origin. More holders dying in one round than this is a site outage.
MAX_ALTERNATES = 3
# The rounds the role runs (roles/model_cache/tasks/weights_rounds*.yml, one task each): 65,536 pulls per holder.
MAX_ROUNDS = 16


def model_key(entry: Entry) -> ModelKey | None:
    """The (site, repository, revision) a work entry shares with its peers, or None when it cannot be shared."""
    if not entry.get("shareable") or not entry.get("repo_id") or not entry.get("revision"):
        return None
    return (str(entry.get("site") or "default"), entry["repo_id"], entry["revision"])


def _slot(role: str | None) -> Slot:
    return {
        "role": role,
        "round": 0,
        "peer": None,
        "alternates": [],
        "serve": [],
        "serve_rounds": [],
        "progress": False,
    }


def fanout(work_by_host: Mapping[str, Iterable[Entry] | None], play_hosts: Iterable[str]) -> dict[str, dict[str, Slot]]:
    """Assign a role, and for a pull a round and holders, per host and model.

    ``work_by_host``: ``{host: [entry, ...]}``, each entry a dict with ``model``, ``repo_id``, ``revision``,
    ``site``, ``complete`` (bool) and ``shareable`` (pinned revision and peers allowed). ``play_hosts`` gives the
    order. Returns ``{host: {model: slot}}``; a slot has ``role`` (done, seed, pull, origin), ``round`` (of a pull,
    from 1; 0 otherwise), ``peer`` (the holder of a pull), ``alternates`` (holders to ask next), ``serve`` (a
    holder's own pulls, ``[round, host]`` pairs), ``serve_rounds`` (the rounds in which it serves) and ``progress``
    (true on the first pull of its round, the one that shows the round's progress).
    """
    order = [host for host in play_hosts if host in work_by_host]
    result: dict[str, dict[str, Slot]] = {host: {} for host in order}
    groups: dict[ModelKey, list[tuple[str, str, bool]]] = {}
    for host in order:
        for entry in work_by_host[host] or []:
            key = model_key(entry)
            complete = bool(entry.get("complete"))
            result[host][entry["model"]] = _slot("done" if complete else ("origin" if key is None else None))
            if key is not None:
                groups.setdefault(key, []).append((host, entry["model"], complete))
    for members in groups.values():
        _schedule(result, members)
    return result


def _schedule(result: dict[str, dict[str, Slot]], members: list[tuple[str, str, bool]]) -> None:
    """Doubling rounds for the hosts of one site and model; ``members`` are ``(host, model, complete)``."""
    model_of = {host: model for host, model, _complete in members}
    holders = [host for host, _model, complete in members if complete]
    needers = [host for host, _model, complete in members if not complete]
    if not needers:
        return
    if not holders:
        seed = needers.pop(0)
        result[seed][model_of[seed]]["role"] = "seed"
        holders = [seed]
    round_no = 0
    while needers:
        round_no += 1
        pulling, needers = needers[: len(holders)], needers[len(holders) :]
        for index, host in enumerate(pulling):
            peer = holders[index]
            others = holders[index + 1 :] + holders[:index]
            slot = result[host][model_of[host]]
            slot.update(role="pull", round=round_no, peer=peer, alternates=others[:MAX_ALTERNATES], progress=index == 0)
            result[peer][model_of[peer]]["serve"].append([round_no, host])
            for holder in [peer, *slot["alternates"]]:
                rounds = result[holder][model_of[holder]]["serve_rounds"]
                if round_no not in rounds:
                    rounds.append(round_no)
        holders = holders + pulling


def rounds(plan: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> int:
    """The number of pull rounds of a plan that ``fanout`` returned (0 when nothing is pulled)."""
    return max((int(slot.get("round") or 0) for models in plan.values() for slot in models.values()), default=0)


def anchors(fetched_by_host: Mapping[str, Iterable[Mapping[str, Any]] | None]) -> dict[str, str]:
    """The digest of each model's files, fixed from the hosts that read its origin, before the fan-out starts.

    ``fetched_by_host``: ``{host: [result, ...]}``, the results of the origin task (model_weights on the seed,
    ``origin`` and ``done`` hosts), each with its ``item`` (the work entry: ``repo_id``, ``revision``) and the
    ``manifest_sha256`` the module returned. Returns ``{"<repo_id>@<revision>": digest}``; the pulls of that
    repository and revision pass it as ``expected_manifest_sha256``, so what a holder serves is checked against the
    origin, not against the holder's own manifest. Skipped and failed results, and those without a digest or a
    pinned revision, fix nothing. Hosts that disagree on a repository and revision are an error naming them.
    """
    seen: dict[str, dict[str, list[str]]] = {}
    for host, results in fetched_by_host.items():
        for result in results or []:
            if not isinstance(result, Mapping) or result.get("skipped") or result.get("failed"):
                continue
            item = result.get("item") or {}
            repo_id, revision, digest = item.get("repo_id"), item.get("revision"), result.get("manifest_sha256")
            if not repo_id or not revision or not digest or result.get("revision") != revision:
                continue
            seen.setdefault(f"{repo_id}@{revision}", {}).setdefault(str(digest), []).append(str(host))
    fixed = {}
    for key, by_digest in seen.items():
        if len(by_digest) > 1:
            told = "; ".join(
                f"{', '.join(hosts)} hold files with manifest digest {digest}" for digest, hosts in by_digest.items()
            )
            raise ValueError(
                f"the hosts that read the origin of {key} disagree on its files: {told}. One of them holds other "
                "files than the origin (a changed bucket copy, a local edit, a tampered host), and the fan-out would "
                "spread them; run model_weights with verify: sha256 on those hosts, fix the odd one out, run again"
            )
        fixed[key] = next(iter(by_digest))
    return fixed


_SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def server_name(model: str) -> str:
    """The weights_server name of a work entry's model: the model itself when it is a safe name (letters, digits,
    ``.``, ``_``, ``-``, at most 128), else a slug of it with a short digest of the whole name, so that a package
    entry named by repository id (``acme/Acme-8B``) gets ``acme-Acme-8B-<8 hex>`` and two models never share one."""
    model = str(model)
    if _SERVER_NAME_RE.match(model):
        return model
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-._")[:100] or "model"
    return f"{slug}-{hashlib.sha256(model.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def kernels_fanout(wants: Mapping[str, Mapping[str, Any]], play_hosts: Iterable[str]) -> dict[str, Any]:
    """The same doubling rounds for kernel-cache archives pulled from kernel peers.

    ``wants``: ``{host: {"peer": kernel peer, "site": model_cache_site, "keys": [kernel key, ...]}}`` for the hosts
    that pull, each key a dict with ``model_name``, ``mesh``, ``impl_id``, ``tt_metal_commit`` and ``vllm_commit``.
    A kernel peer holds every key its pullers want (it packs them first); a puller holds a key once it deployed it
    in a round (it keeps the verified archive in its own store). Holders are the peer and the hosts of the same
    site that name the same peer: a peer named by several sites sends each site its first copy, and the rest of
    the site pulls inside it.
    Returns ``{"rounds": n, "peers": [peer, ...], "hosts": {host: [slot, ...]}}`` with the slots of ``fanout``
    plus ``id`` (the key's store path) and ``key`` (the host's own key as given, with its volume; on a kernel peer,
    the first puller's); a kernel peer's slots have role ``done``.
    """
    order = list(dict.fromkeys(str(want["peer"]) for want in wants.values()))
    order += [host for host in play_hosts if host in wants and host not in order]
    work: dict[str, list[dict[str, Any]]] = {host: [] for host in order}
    keys: dict[tuple[str, str], Mapping[str, Any]] = {}
    held: dict[str, dict[str, set[str]]] = {}
    for host in order:
        want = wants.get(host)
        if want is None:
            continue
        peer = str(want["peer"])
        group = f"{peer}@{want.get('site') or 'default'}"
        for key in want.get("keys") or []:
            ident = _key_id(key)
            keys[(host, ident)] = key
            keys.setdefault((peer, ident), key)
            work[host].append(_kernel_entry(group, ident, complete=False))
            held.setdefault(peer, {}).setdefault(group, set()).add(ident)
    for peer, groups in held.items():
        # A peer that also pulls keys from another peer keeps those entries: names are per peer and site.
        for group, idents in groups.items():
            work[peer].extend(_kernel_entry(group, ident, complete=True) for ident in sorted(idents))
    plan = fanout(work, order)
    hosts: dict[str, list[Slot]] = {}
    for host, models in plan.items():
        hosts[host] = []
        for model, slot in models.items():
            ident = model.rsplit("|", 1)[1]
            hosts[host].append({**slot, "id": ident, "key": dict(keys[(host, ident)])})
    return {"rounds": rounds(plan), "peers": list(held), "hosts": hosts}


def _key_id(key: Mapping[str, Any]) -> str:
    parts = [key["model_name"], key["mesh"], key["impl_id"], key["tt_metal_commit"], key.get("vllm_commit") or "-"]
    return "/".join(str(part) for part in parts)


def _kernel_entry(group: str, ident: str, complete: bool) -> dict[str, Any]:
    return {
        "model": f"{group}|{ident}",
        "repo_id": ident,
        "revision": "kernels",
        "site": group,
        "complete": complete,
        "shareable": True,
    }
