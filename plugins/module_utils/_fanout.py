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
* A model without a pinned revision (a path source, a floating branch) or a host with peers turned off fetches
  from the origin on its own (``origin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    Entry = Mapping[str, Any]
    ModelKey = tuple[str, str, str]
    Slot = dict[str, Any]

# Holders a puller may fall back to before the origin. More holders dying in one round than this is a site outage.
MAX_ALTERNATES = 3


def model_key(entry: Entry) -> ModelKey | None:
    """The (site, repository, revision) a work entry shares with its peers, or None when it cannot be shared."""
    if not entry.get("shareable") or not entry.get("repo_id") or not entry.get("revision"):
        return None
    return (str(entry.get("site") or "default"), entry["repo_id"], entry["revision"])


def _slot(role: str | None) -> Slot:
    return {"role": role, "round": 0, "peer": None, "alternates": [], "serve": [], "serve_rounds": []}


def fanout(work_by_host: Mapping[str, Iterable[Entry] | None], play_hosts: Iterable[str]) -> dict[str, dict[str, Slot]]:
    """Assign a role, and for a pull a round and holders, per host and model.

    ``work_by_host``: ``{host: [entry, ...]}``, each entry a dict with ``model``, ``repo_id``, ``revision``,
    ``site``, ``complete`` (bool) and ``shareable`` (pinned revision and peers allowed). ``play_hosts`` gives the
    order. Returns ``{host: {model: slot}}``; a slot has ``role`` (done, seed, pull, origin), ``round`` (of a pull,
    from 1; 0 otherwise), ``peer`` (the holder of a pull), ``alternates`` (holders to ask next), ``serve`` (a
    holder's own pulls, ``[round, host]`` pairs) and ``serve_rounds`` (the rounds in which it serves).
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
            slot.update(role="pull", round=round_no, peer=peer, alternates=others[:MAX_ALTERNATES])
            result[peer][model_of[peer]]["serve"].append([round_no, host])
            for holder in [peer, *slot["alternates"]]:
                rounds = result[holder][model_of[holder]]["serve_rounds"]
                if round_no not in rounds:
                    rounds.append(round_no)
        holders = holders + pulling


def rounds(plan: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> int:
    """The number of pull rounds of a plan that ``fanout`` returned (0 when nothing is pulled)."""
    return max((int(slot.get("round") or 0) for models in plan.values() for slot in models.values()), default=0)
