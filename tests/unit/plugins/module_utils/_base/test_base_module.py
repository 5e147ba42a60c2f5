# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""plugins/module_utils/_base: FleetError and the adapter ``fail_on`` that turns it into fail_json, run on a real
AnsibleModule (its fail_json prints the task result and exits)."""

from __future__ import annotations

import json

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._base.errors import FleetError
from ansible_collections.ttfleet.inference.plugins.module_utils._base.module import fail_on, mask, message_of

TOKEN = "hf_" + "SecretToken42"


class SubjectError(FleetError):
    """A subject's error, as _volumes' or _images' derive from FleetError."""


class BothError(FleetError, OSError):
    """An error that callers also count as a failed connection, as ProxyError is."""


def _module(token=None):
    from ansible.module_utils.basic import AnsibleModule

    with patch_module_args({"token": token} if token else {}):
        return AnsibleModule(argument_spec={"token": {"type": "str", "no_log": True}})


def _failed(capsys, raised, **kwargs):
    """The task result that fail_on prints when ``raised`` escapes its block, after the module exited."""
    module = kwargs.pop("module", None) or _module()
    # ansible-core 2.19 reads the task's arguments again when the module exits: keep a set patched until then.
    with patch_module_args({}), pytest.raises(SystemExit) as exited, fail_on(module, **kwargs):
        raise raised
    assert exited.value.code == 1
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] is True
    assert "Traceback" not in result["msg"] and "exception" not in result
    return result


def test_a_fleet_error_fails_the_task_with_its_message_unchanged(capsys):
    text = "volume_root /srv/x is a link; point it at a real directory."
    result = _failed(capsys, SubjectError(text))
    assert result["msg"] == text


def test_extra_fields_go_beside_the_message(capsys):
    result = _failed(capsys, SubjectError("no boards"), changed=False, failures=[{"msg": "no boards"}])
    assert result["msg"] == "no boards" and result["changed"] is False and result["failures"] == [{"msg": "no boards"}]


def test_the_context_goes_before_the_message(capsys):
    result = _failed(capsys, SubjectError("401 from the registry"), context="registry_auth of ghcr.io")
    assert result["msg"] == "registry_auth of ghcr.io: 401 from the registry"


def test_an_os_error_fails_with_its_label_only_when_asked(capsys):
    result = _failed(capsys, FileNotFoundError(2, "No such file or directory", "/srv/v"), os_error="cannot read")
    assert result["msg"] == "cannot read: [Errno 2] No such file or directory: '/srv/v'"
    with pytest.raises(FileNotFoundError), fail_on(_module()):
        raise FileNotFoundError(2, "No such file or directory", "/srv/v")


def test_an_error_that_is_both_reads_as_an_os_error_when_the_module_labels_those(capsys):
    assert _failed(capsys, BothError("proxy refused"), os_error="fetch failed")["msg"] == "fetch failed: proxy refused"
    assert _failed(capsys, BothError("proxy refused"))["msg"] == "proxy refused"


def test_any_other_error_fails_with_its_type_only_when_asked(capsys):
    result = _failed(capsys, KeyError("etag"), any_error="container_image")
    assert result["msg"] == "container_image: KeyError: 'etag'"
    with pytest.raises(KeyError), fail_on(_module(), os_error="cannot read"):
        raise KeyError("etag")  # a bug: its traceback, not a failed task that hides it


def test_no_log_values_and_given_secrets_never_reach_the_message(capsys):
    module = _module(token=TOKEN)
    longer = "s3-" + "Key" + "Secret9999"
    shorter = longer[:-4]  # a prefix of the longer secret: replacing it first would leave "9999" behind
    result = _failed(
        capsys,
        SubjectError(f"Bearer {TOKEN} and {longer} refused at https://u:pw@hub.example/x"),
        module=module,
        secrets=[shorter, None, "", longer],
        redact=lambda text: text.replace("u:pw@", "********@"),
    )
    assert result["msg"] == "Bearer ******** and ******** refused at https://********@hub.example/x"
    assert TOKEN not in json.dumps(result) and "9999" not in result["msg"]


def test_mask_replaces_the_longest_secret_first():
    assert mask("abc-abcdef", ["abc", "abcdef"]) == "********-********"
    assert mask("nothing here", [None, ""]) == "nothing here"


def test_the_block_runs_to_its_end_without_an_error(capsys):
    ran = []
    with fail_on(_module(), os_error="x", any_error="y"):
        ran.append(1)
    assert ran == [1] and capsys.readouterr().out == ""


def test_code_after_the_block_never_runs_when_fail_json_returns(monkeypatch):
    module = _module()
    reported = []
    monkeypatch.setattr(module, "fail_json", lambda **kwargs: reported.append(kwargs))
    with pytest.raises(SubjectError), fail_on(module):
        raise SubjectError("bad input")
    assert reported == [{"msg": "bad input"}]


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupts_and_exits_pass_through(raised):
    with pytest.raises(type(raised)), fail_on(_module(), any_error="x"):
        raise raised


def test_message_of_names_what_propagates():
    assert message_of(ValueError("x")) is None
    assert message_of(OSError("x")) is None
    assert message_of(SubjectError("x"), context="c") == "c: x"


def test_the_message_is_masked_before_fail_json_sees_it(monkeypatch):
    module = _module(token=TOKEN)
    reported = []
    monkeypatch.setattr(module, "fail_json", lambda **kwargs: reported.append(kwargs))
    with pytest.raises(SubjectError), fail_on(module):
        raise SubjectError(f"the hub refused {TOKEN}")
    assert reported == [{"msg": "the hub refused ********"}]
