#!/usr/bin/python
# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: serve_unit
short_description: Run a served instance's systemd units and wait until it answers, in one call
version_added: 0.3.0
description:
  - For one instance of the P(ttfleet.inference.serve#role) role, in one module call (issue 34, three tasks an
    instance before), reloads systemd when O(daemon_reload), enables and starts (or restarts, O(state=restarted)) the
    instance's unit C(tt-serve@<instance>.service), enables and starts its health timer
    C(tt-serve-health@<instance>.timer), then runs C(<wrapper> ready <instance>), for which /health must answer 200 and
    /v1/models list the model.
  - Starting a unit waits for it as C(systemctl start) does (the unit is C(Type=notify), ready once /health answers).
  - A unit systemd cannot start, or an instance that does not become ready, fails the module with systemd's or the
    wrapper's message.
  - In check mode nothing is started; the wait runs only against an instance that is already active and would not
    restart, as the role's readiness check did.
extends_documentation_fragment:
  - ttfleet.inference.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - V(state=restarted) restarts the instance on every run; the role asks for it only when something changed.
options:
  instance:
    description: The instance name (the C(%i) of its units).
    type: str
    required: true
  state:
    description: V(started) starts the unit when it is not active; V(restarted) restarts it.
    type: str
    choices: [started, restarted]
    default: started
  daemon_reload:
    description: Run C(systemctl daemon-reload) first (the template units changed).
    type: bool
    default: false
  health_timer:
    description: Also enable and start the health timer of the instance.
    type: bool
    default: true
  wait:
    description: Wait for the instance with the wrapper's C(ready) command.
    type: bool
    default: true
  python:
    description: The interpreter the wrapper runs with.
    type: path
    default: /usr/bin/python3
  wrapper:
    description: The instance wrapper installed by the role.
    type: path
    default: /usr/local/libexec/ttfleet-serve
notes:
  - The wrapper bounds every request and the wait itself (the instance's start timeout); give the task a C(timeout)
    as a backstop.
seealso:
  - module: ttfleet.inference.serve_env
  - module: ttfleet.inference.root_files
author:
  - ttfleet.inference maintainers (@ttfleet)
"""

EXAMPLES = r"""
- name: Run qwen3-32b and wait until it answers
  ttfleet.inference.serve_unit:
    instance: qwen3-32b
    state: restarted
    daemon_reload: true
  timeout: 3660
"""

RETURN = r"""
units:
  description: Per unit, what was done (C(enabled), C(started), C(restarted)) and its C(active) state before.
  returned: always
  type: dict
  sample: {tt-serve@qwen3-32b.service: {active: active, enabled: true, started: false, restarted: false}}
ready:
  description: What the wrapper's C(ready) printed (the model list), V(null) when the wait did not run.
  returned: always
  type: dict
  sample: {health: 200, models: [Qwen/Qwen3-32B]}
"""

import json
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.names import serve_unit

_INSTANCE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _show(module: AnsibleModule, unit: str) -> dict[str, str]:
    rc, out, err = module.run_command(
        ["systemctl", "show", "--property=ActiveState,UnitFileState,LoadState", "--", unit]
    )
    if rc != 0:
        module.fail_json(msg=f"systemctl cannot tell the state of {unit}: {(err or out).strip()[-300:]}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _systemctl(module: AnsibleModule, *args: str) -> None:
    rc, out, err = module.run_command(["systemctl", *args])
    if rc != 0:
        reason = (err or out).strip()[-1000:]
        module.fail_json(msg=f"systemctl {' '.join(args)} failed ({rc}): {reason}; see journalctl -u {args[-1]}")


def _keep(module: AnsibleModule, unit: str, restart: bool) -> dict[str, object]:
    """Enable ``unit`` and start (or restart) it; what was done, and whether it was active before."""
    state = _show(module, unit)
    if state.get("LoadState") == "not-found" and not module.check_mode:
        module.fail_json(msg=f"{unit} is not installed: its template unit is missing (run the serve role's install).")
    done: dict[str, object] = {
        "active": state.get("ActiveState"), "enabled": False, "started": False, "restarted": False,
    }  # fmt: skip
    if state.get("UnitFileState") != "enabled":
        done["enabled"] = True
        if not module.check_mode:
            _systemctl(module, "enable", "--", unit)
    if restart:
        done["restarted"] = True
        if not module.check_mode:
            _systemctl(module, "restart", "--", unit)
    elif state.get("ActiveState") != "active":
        done["started"] = True
        if not module.check_mode:
            _systemctl(module, "start", "--", unit)
    return done


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            instance=dict(type="str", required=True),
            state=dict(type="str", choices=["started", "restarted"], default="started"),
            daemon_reload=dict(type="bool", default=False),
            health_timer=dict(type="bool", default=True),
            wait=dict(type="bool", default=True),
            python=dict(type="path", default="/usr/bin/python3"),
            wrapper=dict(type="path", default="/usr/local/libexec/ttfleet-serve"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    instance = params["instance"]
    if not _INSTANCE.match(instance):
        module.fail_json(
            msg=f"instance {instance!r} is not an instance name (1-63 lower-case letters, digits and '-')."
        )
    if params["daemon_reload"] and not module.check_mode:
        _systemctl(module, "daemon-reload")
    service = serve_unit(instance)
    units = {service: _keep(module, service, params["state"] == "restarted")}
    if params["health_timer"]:
        timer = f"tt-serve-health@{instance}.timer"
        units[timer] = _keep(module, timer, False)
    changed = any(done["enabled"] or done["started"] or done["restarted"] for done in units.values())
    ready = None
    service_done = units[service]
    idle = service_done["started"] or service_done["restarted"] or service_done["active"] != "active"
    if params["wait"] and not (module.check_mode and idle):
        rc, out, err = module.run_command([params["python"], params["wrapper"], "ready", instance])
        if rc != 0:
            module.fail_json(
                msg=f"{instance} did not become ready: {(err or out).strip()[-1000:]}; see journalctl -u {service}",
                units=units,
                changed=changed,
            )
        try:
            ready = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
        except ValueError:
            ready = None
    module.exit_json(changed=changed, units=units, ready=ready)


if __name__ == "__main__":
    main()
