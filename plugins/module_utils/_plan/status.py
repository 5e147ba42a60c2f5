# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""What a host serves right now, for ttfleet.inference.fleet_status (no Ansible imports: unit-testable).

The serve role leaves one non-secret state file per instance under ``/var/lib/ttfleet/serve``; this
module reads them, asks systemd about each unit, probes ``/health`` and describes the expected
volume (alias or directory, weights manifest, kernel cache meshes). Nothing here reads a secret.
"""

from __future__ import annotations

import http.client
import os
import stat
import subprocess
import time
import urllib.parse
from typing import TYPE_CHECKING

from ansible_collections.ttfleet.inference.plugins.module_utils._fs.dirs import open_dir
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.files import read_json
from ansible_collections.ttfleet.inference.plugins.module_utils._fs.paths import SafeFileError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import NetError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import connection, describe, read_capped
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import DEFAULT_STALL, MAX_HEALTH_BYTES
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import printable
from ansible_collections.ttfleet.inference.plugins.module_utils._net.urls import origin_of
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.reuse import read_record
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import serve_unit
from ansible_collections.ttfleet.inference.plugins.module_utils._volumes.contents import volume_contents

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    JSON = dict[str, Any]
    # subprocess.run, or any callable with its signature (the unit tests pass their own).
    Runner = Callable[..., subprocess.CompletedProcess[str]]

STATE_SUFFIX = ".json"
# Accepted bandit B104: binds nothing; an instance published on every address is probed on loopback instead.
_ANY_IPV4 = "0.0.0.0"  # nosec B104
_STATE_MAX_BYTES = 1 << 20
UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "UnitFileState", "ActiveEnterTimestamp")


def read_state_files(state_dir: str) -> list[JSON]:
    """Every ``<instance>.json`` in state_dir, sorted by name; unreadable files are reported, not skipped."""
    found: list[JSON] = []
    try:
        dirfd = open_dir(state_dir)
    except FileNotFoundError:
        return found
    try:
        names = sorted(os.listdir(dirfd))
        for name in names:
            if not name.endswith(STATE_SUFFIX) or name.startswith("."):
                continue
            path = os.path.join(state_dir, name)
            entry: JSON = {"instance": name[: -len(STATE_SUFFIX)], "state_file": path, "error": None, "data": {}}
            try:
                entry["data"] = read_json(dirfd, name, _STATE_MAX_BYTES, where=state_dir, missing={})
            except SafeFileError as exc:
                entry["error"] = printable(exc.reason, 300)
            except OSError as exc:
                entry["error"] = printable(exc, 300)
            found.append(entry)
    finally:
        os.close(dirfd)
    return found


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``Key=Value`` lines of ``systemctl show`` into a dict."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def unit_state(unit: str, runner: Runner = subprocess.run) -> JSON:
    """ActiveState and friends of one unit; ``available`` False when systemctl is missing or fails."""
    try:
        proc = runner(
            ["systemctl", "show", unit, "--property=" + ",".join(UNIT_PROPERTIES)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"unit": unit, "available": False, "error": printable(exc, 300)}
    if proc.returncode != 0:
        return {"unit": unit, "available": False, "error": printable((proc.stderr or "").strip()[-300:], 300)}
    props = parse_systemctl_show(proc.stdout)
    try:
        restarts: int | None = int(props.get("NRestarts", "0") or 0)
    except ValueError:
        restarts = None
    return {
        "unit": unit,
        "available": True,
        "active_state": props.get("ActiveState", "unknown"),
        "sub_state": props.get("SubState", "unknown"),
        "enabled": props.get("UnitFileState", "unknown"),
        "restarts": restarts,
        "active_since": props.get("ActiveEnterTimestamp", ""),
    }


def health_url(data: Mapping[str, Any]) -> str | None:
    """The URL to probe: the state file's own, else http://127.0.0.1:<port>/health."""
    url = data.get("health_url")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return url
    port = data.get("port")
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        host = data.get("bind_host") or "127.0.0.1"
        if host in (_ANY_IPV4, "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{int(port)}/health"
    return None


def _probe_result(url: str, status: str, code: int | None, started: float, error: str | None = None) -> JSON:
    return {
        "url": url,
        "status": status,
        "code": code,
        "seconds": round(time.monotonic() - started, 3),
        "error": None if error is None else printable(error, 300),
    }


def probe(url: str | None, timeout: float) -> JSON:
    """GET url within ``timeout`` seconds in all: ``healthy`` on a whole 200 answer, ``unreachable`` when the port
    takes no connection, else ``unhealthy`` (another status, a redirect, a line that is not HTTP, a body that ends
    early or passes MAX_HEALTH_BYTES, a stall): one instance's broken port never fails the host's report.

    No credential is sent and redirects are not followed: the probe talks to the instance's own port only."""
    if not url:
        return {"url": None, "status": "unknown", "code": None, "seconds": None, "error": "no port in the state file"}
    started = time.monotonic()
    deadline = Deadline(total=timeout, stall=min(float(timeout), DEFAULT_STALL), what="the /health probe")
    parts = urllib.parse.urlsplit(url)
    scheme, host, port = origin_of(url)
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    try:
        conn = connection(scheme, host, port, deadline)
        conn.connect()
    except (NetError, OSError, ValueError, http.client.HTTPException) as exc:
        return _probe_result(url, "unreachable", None, started, str(describe(exc, deadline, url)))
    code = response = None
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "identity"})
        response = conn.getresponse()
        code = response.status
        read_capped(response, MAX_HEALTH_BYTES, "the /health answer", url, deadline)
    except (NetError, OSError, ValueError, http.client.HTTPException) as exc:
        return _probe_result(url, "unhealthy", code, started, str(describe(exc, deadline, url)))
    finally:
        if response is not None:
            response.close()
        conn.close()
    return _probe_result(url, "healthy" if code == 200 else "unhealthy", code, started)


def describe_expected(path: str | None, model_name: str | None) -> JSON:
    """The expected volume: alias or directory, weights completeness, manifest identity, cache meshes."""
    info: JSON = {
        "path": path,
        "type": "absent",
        "is_alias": False,
        "alias_of": None,
        "weights_from": None,
        "tt_metal_commit": None,
        "exists": False,
        "problems": [],
    }
    if not path:
        info["type"] = "unknown"
        return info
    try:
        lst = os.lstat(path)
    except OSError:
        return info
    if stat.S_ISLNK(lst.st_mode):
        info["type"] = "link"
        info["is_alias"] = True
        try:
            info["alias_of"] = os.path.realpath(path)
        except OSError:
            info["alias_of"] = None
    elif stat.S_ISDIR(lst.st_mode):
        info["type"] = "directory"
        # A volume of a new model version whose weights are hardlinks of an older volume's (own kernel cache).
        record = read_record(path) or {}
        info["weights_from"] = record.get("weights_from")
        info["tt_metal_commit"] = record.get("tt_metal_commit")
    else:
        info["type"] = "other"
    info["exists"] = os.path.isdir(path)
    weights: JSON = {
        "usable": False,
        "complete": False,
        "revision": None,
        "source": None,
        "verified": None,
        "manifest": False,
    }
    meshes: list[str] = []
    if info["exists"] and model_name:
        contents = volume_contents(path, model_name)
        status = contents["weights"]
        weights.update(usable=status["usable"], complete=status["complete"], missing_shards=status["missing_shards"])
        manifest = contents["manifest"]
        weights["manifest"] = manifest["present"] and manifest["error"] is None
        data = manifest["data"] if isinstance(manifest["data"], dict) else {}
        weights["revision"] = data.get("revision")
        weights["source"] = data.get("source")
        weights["repo_id"] = data.get("repo_id")
        weights["files"] = len(data.get("files") or {}) if isinstance(data.get("files"), dict) else None
        weights["verified"] = data.get("verified_at")
        weights["manifest_file"] = manifest["path"]
        meshes = contents["tensor_cache_meshes"]
        info["problems"] = contents["problems"]
    info["weights"] = weights
    info["kernel_cache_meshes"] = meshes
    return info


def current_release(releases_root: str) -> dict[str, str | None]:
    """Tags the ``current`` and ``previous`` links of the inference_server layout point at."""
    result: dict[str, str | None] = {"current": None, "previous": None}
    for key in result:
        link = os.path.join(releases_root, key)
        try:
            if os.path.islink(link):
                result[key] = os.path.basename(os.path.normpath(os.readlink(link)))
        except OSError:
            pass
    return result


def instance_report(entry: JSON, timeout: float, runner: Runner = subprocess.run) -> JSON:
    """One instance: its recorded configuration, its unit, its health and its volume."""
    data = entry["data"]
    instance = entry["instance"]
    unit = data.get("unit") or serve_unit(instance)
    model = data.get("model_name") or data.get("model")
    report: JSON = {
        "instance": instance,
        "state_file": entry["state_file"],
        "error": entry["error"],
        "model": data.get("model"),
        "model_name": model,
        "hf_model_repo": data.get("hf_model_repo"),
        "device": data.get("device"),
        "impl": data.get("impl") or data.get("impl_id"),
        "engine": data.get("engine"),
        "image": data.get("image"),
        "image_origin": data.get("image_origin") or data.get("image"),
        "image_digest": data.get("image_digest") or None,
        "port": data.get("port"),
        "device_ids": data.get("device_ids"),
        "release": data.get("ttis_release") or data.get("release"),
        "profile": data.get("profile") or None,
        "spec_source": data.get("spec_source"),
        "unit": unit_state(unit, runner=runner),
    }
    report["health"] = probe(health_url(data), timeout)
    expected = data.get("volume_path") or data.get("expected_volume") or data.get("volume")
    report["volume"] = describe_expected(expected if isinstance(expected, str) else None, model)
    report["healthy"] = (
        entry["error"] is None
        and report["unit"].get("active_state") == "active"
        and report["health"]["status"] == "healthy"
    )
    return report


def host_report(state_dir: str, releases_root: str, timeout: float = 5.0, runner: Runner = subprocess.run) -> JSON:
    instances = [instance_report(entry, timeout, runner) for entry in read_state_files(state_dir)]
    releases = current_release(releases_root)
    return {
        "release": releases["current"],
        "previous_release": releases["previous"],
        "instances": instances,
        "instance_count": len(instances),
        "unhealthy": [item["instance"] for item in instances if not item["healthy"]],
    }


def _cell(value: object) -> str:
    """One cell of the table, terminal-safe: the rows come from the hosts, whose answers are not trusted."""
    if value is None or value == "":
        return "-"
    return printable(value, 200)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: object) -> list[Any]:
    if isinstance(value, list):
        return value
    return [] if value is None or value == "" else [value]


def status_summary(rows: Iterable[Any] | None) -> JSON:
    """The counts and names of the fleet report: the set_stats summary (without its time and report directory) and
    what the play's final failure message lists.

    Every name and release a host gave is a ``_cell`` of its own, as in the table: an instance name such as
    ``\x1b]0;t\x07`` reaches the operator's terminal (the failure message, the custom stats) and AWX as escapes.
    """
    rows = [_mapping(row) for row in rows or []]
    reachable = [row for row in rows if row.get("reachable")]
    instances = [_mapping(item) for row in rows for item in _items(row.get("instances"))]
    releases: dict[str, int] = {}
    for row in reachable:
        key = _cell(row.get("release") or "none")
        releases[key] = releases.get(key, 0) + 1
    unreachable = [_cell(row.get("host")) for row in rows if not row.get("reachable")]
    unhealthy = [
        f"{_cell(row.get('host'))}/{_cell(name)}" for row in reachable for name in _items(row.get("unhealthy"))
    ]
    return {
        "healthy": not unreachable and not unhealthy,
        "hosts": len(rows),
        "reachable": len(reachable),
        "unreachable": unreachable,
        "unhealthy": unhealthy,
        "instances": len(instances),
        "healthy_instances": sum(1 for item in instances if item.get("healthy")),
        "releases": releases,
    }


def _base(path: object) -> str:
    if not isinstance(path, str):
        return "" if path is None else str(path)
    return os.path.basename(path)


def _image_cell(item: Mapping[str, Any]) -> str:
    """The image's last path component and tag, and the first 12 hex digits of its registry digest."""
    image = item.get("image")
    if not isinstance(image, str) or not image:
        return "-"
    short = image.rsplit("/", 1)[-1]
    digest = item.get("image_digest")
    if isinstance(digest, str) and digest.startswith("sha256:"):
        short += "@" + digest[7:19]
    return _cell(short)


def status_lines(rows: Iterable[Any] | None) -> list[str]:
    """A fixed-width table of the fleet report rows: one line per instance, one per host without any. Every cell
    goes through ``_net.redact.printable``: a state, a name or a path with ESC, OSC, CR, LF or a bidi override reaches
    the terminal as escapes."""
    header = ("HOST", "DEVICE", "RELEASE", "INSTANCE", "PORT", "UNIT", "HEALTH", "VOLUME", "IMAGE")
    table = [header]
    for row in rows or []:
        row = _mapping(row)
        host = _cell(row.get("host"))
        device = _cell(row.get("device_type"))
        release = _cell(row.get("release"))
        if not row.get("reachable", True):
            table.append((host, device, release, "-", "-", "-", "unreachable", "-", "-"))
            continue
        instances = row.get("instances") or []
        if not isinstance(instances, list):
            instances = [{}]
        if not instances:
            table.append((host, device, release, "(none)", "-", "-", "-", "-", "-"))
        for item in instances:
            item = _mapping(item)
            volume = _mapping(item.get("volume"))
            name = _base(volume.get("path") or "") or "-"
            if volume.get("is_alias"):
                name += " -> " + (_base(volume.get("alias_of")) or "?")
            elif volume.get("weights_from"):
                name += " (weights of " + _base(volume["weights_from"]) + ")"
            table.append(
                (
                    host,
                    device,
                    release,
                    # A serve profile follows the instance's name: qwen-b (p1d1).
                    _cell(item.get("instance")) + (f" ({_cell(item['profile'])})" if item.get("profile") else ""),
                    _cell(item.get("port")),
                    _cell(_mapping(item.get("unit")).get("active_state")),
                    _cell(_mapping(item.get("health")).get("status")),
                    _cell(name),
                    _image_cell(item),
                )
            )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table]
