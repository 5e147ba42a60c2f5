# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""_host/preflight.py, _plan/preflight.py and the tt_preflight module: every check, real v0.20.0 specs."""

from __future__ import annotations

import json
import os

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._host import facts as facts_utils
from ansible_collections.ttfleet.inference.plugins.module_utils._host import preflight as pf
from ansible_collections.ttfleet.inference.plugins.module_utils._plan.preflight import model_summaries
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis.catalog import load_spec_file
from ansible_collections.ttfleet.inference.plugins.modules import tt_preflight as tt_preflight_module

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "fixtures")
V20 = os.path.join(FIXTURES, "specs", "release_model_spec-v0.20.0.json.gz")
QWEN_VOLUME = "volume_id_tt_transformers-Qwen3-32B-v0.17.0"
QB2_VOLUME = "volume_id_tt_transformers-Qwen3-32B-vqb2_launch"


@pytest.fixture(scope="module")
def catalog():
    return load_spec_file(V20)


def write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def make_weights(volume, model="Qwen3-32B"):
    for name in ("model-00001-of-00001.safetensors", "tokenizer.json", "config.json"):
        write(os.path.join(volume, "weights", model, name), "{}")


def host_facts(tmp_path, device="p300x2", **overrides):
    """Facts of a healthy lab host of ``device``, then ``overrides`` (dotted keys reach into dicts)."""
    root = tmp_path / "hostroot"
    with open(os.path.join(FIXTURES, "tt_smi", device + ".json"), encoding="utf-8") as handle:
        snapshot = json.load(handle)
    boards = facts_utils.boards_from_snapshot(snapshot)
    for n in range(sum(1 for board in boards if not board["remote"])):
        write(str(root / "dev/tenstorrent" / str(n)))
    sysfs = root / "sys/kernel/mm/hugepages/hugepages-1048576kB"
    pages = 4 * max(1, len(os.listdir(str(root / "dev/tenstorrent"))))
    write(str(sysfs / "nr_hugepages"), f"{pages}\n")
    write(str(sysfs / "free_hugepages"), f"{pages}\n")
    write(str(root / "proc/self/mounts"), "hugetlbfs /dev/hugepages-1G hugetlbfs rw,relatime,pagesize=1024M 0 0\n")
    write(str(root / "proc/meminfo"), "MemTotal: 268435456 kB\nMemAvailable: 201326592 kB\n")
    result = facts_utils.assemble(
        snapshot=snapshot,
        root=str(root),
        declared_device=device,
        hostname="lab-p300x2-1",
        docker={"reachable": True, "version": "28.2.2", "api_version": "1.50", "error": None, "socket": "/x"},
    )
    result["disk"] = {
        "volume_root": "/var/lib/tt-cache",
        "path": "/var/lib",
        "free_gb": 500.0,
        "total_gb": 1000.0,
        "error": None,
    }
    for key, value in overrides.items():
        target = result
        parts = key.split(".")
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = value
    return result


def qwen(catalog, tmp_path, preseeded=()):
    root = str(tmp_path / "tt-cache")
    summaries, warnings = model_summaries(catalog, [{"name": "Qwen3-32B"}], "p300x2", root, list(preseeded))
    assert warnings == []
    return summaries


def run(facts, summaries=(), checks=None, **kwargs):
    return pf.evaluate(facts, list(summaries), pf.check_levels(checks), **kwargs)


def only(findings, check):
    chosen = [finding for finding in findings if finding["check"] == check]
    assert len(chosen) == 1, findings
    return chosen[0]


# ---------------------------------------------------------------------------
# Inputs


def test_check_levels_defaults_and_overrides():
    levels = pf.check_levels(None)
    assert levels["hugepages_pages"] == "warn"
    assert all(levels[name] == "fail" for name in pf.CHECK_NAMES if name != "hugepages_pages")
    assert pf.check_levels({"kmd": "warn", "disk": "skip"})["kmd"] == "warn"


def test_check_levels_unknown_name_suggests():
    with pytest.raises(pf.PreflightError, match=r"unknown check 'hugepage'\. Did you mean hugepages"):
        pf.check_levels({"hugepage": "skip"})


def test_check_levels_bad_level():
    with pytest.raises(pf.PreflightError, match="disk is 'off'; use one of fail, warn, skip"):
        pf.check_levels({"disk": "off"})


def test_present_models():
    models = [{"name": "a"}, {"name": "b", "state": "absent"}, {"name": "c", "state": "present", "port": 8001}]
    assert [m["name"] for m in pf.present_models(models)] == ["a", "c"]
    with pytest.raises(pf.PreflightError, match=r"models\[1\]"):
        pf.present_models([{"name": "a"}, {"impl": "x"}])


def test_unwrap_facts():
    tt = {"hostname": "h"}
    assert pf.unwrap_facts(tt) is tt
    assert pf.unwrap_facts({"tt": tt, "changed": False}) is tt
    assert pf.unwrap_facts({"ansible_facts": {"tt": tt}}) is tt
    with pytest.raises(pf.PreflightError):
        pf.unwrap_facts(None)


# ---------------------------------------------------------------------------
# A healthy host


def test_healthy_quietbox2_passes_everything(catalog, tmp_path):
    summaries = qwen(catalog, tmp_path)
    result = run(host_facts(tmp_path, kmd_version="2.6.0"), summaries)
    assert result == {"failures": [], "warnings": [], "passed": list(pf.CHECK_NAMES), "skipped": []}


def test_qwen3_32b_summary_from_v020(catalog, tmp_path):
    (summary,) = qwen(catalog, tmp_path)
    assert summary["volume_name"] == QWEN_VOLUME
    assert summary["volume_path"] == str(tmp_path / "tt-cache" / QWEN_VOLUME)
    assert (summary["min_disk_gb"], summary["min_ram_gb"]) == (84, 80.0)
    assert (summary["weights_present"], summary["weights_path"], summary["counted_disk_gb"]) == (False, None, 84)
    assert summary["system_requirements"] == {
        "firmware": {"specifier": ">=19.2.0", "mode": "STRICT"},
        "kmd": {"specifier": ">=2.5.0", "mode": "STRICT"},
    }


# ---------------------------------------------------------------------------
# device_type


def test_device_type_mismatch(tmp_path):
    result = run(host_facts(tmp_path, declared_device="n150"))
    finding = only(result["failures"], "device_type")
    assert finding["requirement"] == "device n150"
    assert finding["measured"] == "p300x2"
    assert finding["msg"].startswith("lab-p300x2-1: declared device n150 but the boards (4 x p300c) make a p300x2.")
    assert "device_type" not in result["passed"]


def test_device_type_declared_by_option_wins(tmp_path):
    result = run(host_facts(tmp_path), declared_device="P300X2")
    assert "device_type" in result["passed"]
    result = run(host_facts(tmp_path), declared_device="p150x4")
    assert only(result["failures"], "device_type")["requirement"] == "device p150x4"


def test_device_type_no_boards(tmp_path):
    facts = host_facts(
        tmp_path,
        boards=[],
        implied_device=None,
        tt_smi_error="tt-smi -s exited with 1: No Tenstorrent driver detected!",
    )
    finding = only(run(facts)["failures"], "device_type")
    assert finding["measured"] == "no boards"
    assert "install tenstorrent-dkms" in finding["fix"]
    assert "No Tenstorrent driver detected!" in finding["msg"]
    assert "declared as p300x2" in finding["msg"]


def test_device_type_unknown_combination(tmp_path):
    facts = host_facts(tmp_path, device="t3k")
    facts.update(implied_device=None, implied_device_reason="tt-smi lists 7 n300 chips, an odd number")
    finding = only(run(facts)["failures"], "device_type")
    assert "odd number" in finding["msg"]
    assert "8 x n300" not in finding["msg"] and "4 x n300 L" in finding["msg"]


def test_device_type_without_declaration_needs_known_device(tmp_path):
    facts = host_facts(tmp_path, declared_device=None)
    assert "device_type" in run(facts)["passed"]
    facts.update(implied_device=None, implied_device_reason="no tt-inference-server device is made of 2 x n150")
    assert only(run(facts)["failures"], "device_type")["requirement"] == "a known device"


def test_device_type_warn_and_skip(tmp_path):
    facts = host_facts(tmp_path, declared_device="n150")
    warned = run(facts, checks={"device_type": "warn"})
    assert warned["failures"] == []
    assert only(warned["warnings"], "device_type")["measured"] == "p300x2"
    skipped = run(facts, checks={"device_type": "skip"})
    assert skipped["failures"] == [] and skipped["warnings"] == []
    assert "device_type" in skipped["skipped"] and "device_type" not in skipped["passed"]


# ---------------------------------------------------------------------------
# hugepages


def test_hugepages_not_mounted(tmp_path):
    facts = host_facts(tmp_path, **{"hugepages_1g.mounted": False, "hugepages_1g.fstype": None})
    finding = only(run(facts)["failures"], "hugepages")
    assert finding["measured"] == "not mounted"
    assert "dev-hugepages\\x2d1G.mount" in finding["fix"]
    assert finding["msg"].startswith("lab-p300x2-1: no hugetlbfs at /dev/hugepages-1G (nothing mounted)")


def test_hugepages_wrong_pagesize(tmp_path):
    facts = host_facts(tmp_path, **{"hugepages_1g.pagesize": "2M"})
    assert only(run(facts)["failures"], "hugepages")["measured"] == "pagesize=2M"


def test_hugepages_pages_lab_host_warns_by_default(tmp_path):
    facts = host_facts(tmp_path, **{"hugepages_1g.total": 0, "hugepages_1g.free": 0})
    result = run(facts)
    assert result["failures"] == []
    finding = only(result["warnings"], "hugepages_pages")
    assert finding["requirement"] == "16 x 1 GiB hugepages (4 per PCIe device x 4)"
    assert finding["measured"] == "0 reserved, 0 free"
    assert "hugepages" in result["passed"]


def test_hugepages_pages_counts_reserved_not_free(tmp_path):
    facts = host_facts(tmp_path, **{"hugepages_1g.total": 16, "hugepages_1g.free": 0})
    assert "hugepages_pages" in run(facts)["passed"]
    facts["hugepages_1g"]["total"] = 15
    assert only(run(facts, checks={"hugepages_pages": "fail"})["failures"], "hugepages_pages")


def test_hugepages_pages_kernel_without_1g_pages(tmp_path):
    facts = host_facts(tmp_path, **{"hugepages_1g.total": None})
    assert only(run(facts)["warnings"], "hugepages_pages")["measured"] == "not supported"


# ---------------------------------------------------------------------------
# docker


def test_docker_unreachable(tmp_path):
    facts = host_facts(tmp_path, docker={"reachable": False, "error": "/var/run/docker.sock does not exist"})
    finding = only(run(facts)["failures"], "docker")
    assert "systemctl enable --now docker" in finding["fix"]
    assert "/var/run/docker.sock does not exist" in finding["msg"]


# ---------------------------------------------------------------------------
# disk


def test_disk_qwen3_32b_on_p300x2(catalog, tmp_path):
    facts = host_facts(tmp_path, **{"disk.free_gb": 12.3}, kmd_version="2.6.0")
    result = run(facts, qwen(catalog, tmp_path))
    finding = only(result["failures"], "disk")
    assert finding["model"] == "Qwen3-32B"
    assert finding["requirement"] == "94 GB free on /var/lib/tt-cache"
    assert finding["measured"] == "12.3 GB free"
    assert finding["msg"] == (
        "lab-p300x2-1: Qwen3-32B needs 94 GB free on /var/lib/tt-cache (min_disk_gb 84 + margin 10), 12.3 GB free. "
        "Fix: free space, point the volume root at a bigger filesystem, or pre-seed the weights."
    )
    assert [f["check"] for f in result["failures"]] == ["disk"]


@pytest.mark.parametrize(("free", "margin", "ok"), [(94.0, 10, True), (93.9, 10, False), (84.0, 0, True)])
def test_disk_boundary(catalog, tmp_path, free, margin, ok):
    facts = host_facts(tmp_path, **{"disk.free_gb": free})
    result = run(facts, qwen(catalog, tmp_path), disk_margin_gb=margin)
    assert ("disk" in result["passed"]) is ok


def test_disk_preseeded_qb2_volume_counts_zero(catalog, tmp_path):
    preseeded = tmp_path / "home" / "tt" / "data" / "tt-cache"
    make_weights(str(preseeded / QB2_VOLUME))
    (summary,) = qwen(catalog, tmp_path, preseeded=[str(tmp_path / "home" / "*" / "data" / "tt-cache")])
    assert summary["weights_present"] is True
    assert summary["weights_path"] == str(preseeded / QB2_VOLUME)
    assert summary["counted_disk_gb"] == 0
    result = run(host_facts(tmp_path, **{"disk.free_gb": 12.3}), [summary])
    assert "disk" in result["passed"]
    # Only the margin is left to hold.
    result = run(host_facts(tmp_path, **{"disk.free_gb": 9.5}), [summary])
    assert "(margin 10, all weights present), 9.5 GB free" in only(result["failures"], "disk")["msg"]


def test_disk_incomplete_preseeded_volume_still_counts(catalog, tmp_path):
    preseeded = tmp_path / "seed"
    write(str(preseeded / QB2_VOLUME / "weights" / "Qwen3-32B" / "config.json"), "{}")
    (summary,) = qwen(catalog, tmp_path, preseeded=[str(preseeded)])
    assert summary["weights_present"] is False
    assert summary["counted_disk_gb"] == 84


def test_disk_expected_volume_with_weights_counts_zero(catalog, tmp_path):
    make_weights(str(tmp_path / "tt-cache" / QWEN_VOLUME))
    (summary,) = qwen(catalog, tmp_path)
    assert summary["weights_path"] == str(tmp_path / "tt-cache" / QWEN_VOLUME)
    assert summary["counted_disk_gb"] == 0


def test_disk_sums_models(catalog, tmp_path):
    summaries, _warnings = model_summaries(
        catalog,
        [{"name": "Qwen3-32B"}, {"name": "Llama-3.1-8B-Instruct"}],
        "p300x2",
        str(tmp_path / "tt-cache"),
    )
    llama = summaries[1]["min_disk_gb"]
    needed = 84 + llama + 10
    facts = host_facts(tmp_path, **{"disk.free_gb": needed - 1})
    finding = only(run(facts, summaries)["failures"], "disk")
    assert finding["model"] is None
    assert finding["requirement"] == f"{needed} GB free on /var/lib/tt-cache"
    assert "min_disk_gb 84 for Qwen3-32B + min_disk_gb" in finding["msg"]
    facts["disk"]["free_gb"] = needed
    assert "disk" in run(facts, summaries)["passed"]


def test_disk_without_models_is_not_checked(tmp_path):
    assert "disk" in run(host_facts(tmp_path, **{"disk.free_gb": 0}))["passed"]


def test_disk_unknown_free_space_fails(catalog, tmp_path):
    facts = host_facts(tmp_path, **{"disk.free_gb": None, "disk.error": "cannot stat /x: Permission denied"})
    finding = only(run(facts, qwen(catalog, tmp_path))["failures"], "disk")
    assert "Permission denied" in finding["measured"]


# ---------------------------------------------------------------------------
# ram


def test_ram(catalog, tmp_path):
    summaries = qwen(catalog, tmp_path)
    assert "ram" in run(host_facts(tmp_path, memory_gb=80.0), summaries)["passed"]
    finding = only(run(host_facts(tmp_path, memory_gb=23.5), summaries)["failures"], "ram")
    assert finding["msg"].startswith(
        "lab-p300x2-1: Qwen3-32B needs 80 GB RAM (min_ram_gb 80), the host has 23.5 GB. Fix: serve fewer"
    )
    assert (finding["requirement"], finding["measured"]) == ("80 GB RAM", "23.5 GB")


def test_ram_sums_models_and_skip(catalog, tmp_path):
    summaries = qwen(catalog, tmp_path) * 2
    result = run(host_facts(tmp_path, memory_gb=159.0), summaries)
    assert only(result["failures"], "ram")["model"] is None
    assert "ram" in run(host_facts(tmp_path, memory_gb=159.0), summaries, checks={"ram": "skip"})["skipped"]


def test_ram_not_needed_when_weights_are_on_the_host(catalog, tmp_path):
    # run.py skips its RAM check when the weights are complete: a QuietBox 2 with 24 GB of RAM serves
    # Qwen3-32B (min_ram_gb 80) from its factory volume.
    preseeded = tmp_path / "home" / "tt" / "data" / "tt-cache"
    make_weights(str(preseeded / QB2_VOLUME))
    summaries = qwen(catalog, tmp_path, preseeded=[str(tmp_path / "home" / "*" / "data" / "tt-cache")])
    assert "ram" in run(host_facts(tmp_path, memory_gb=23.5), summaries)["passed"]


# ---------------------------------------------------------------------------
# firmware and kmd


def test_firmware_below_requirement(catalog, tmp_path):
    facts = host_facts(tmp_path, firmware_versions=["19.1.0.0"], firmware_version="19.1.0.0")
    finding = only(run(facts, qwen(catalog, tmp_path))["failures"], "firmware")
    assert finding["model"] == "Qwen3-32B"
    assert (finding["requirement"], finding["measured"]) == (">=19.2.0", "19.1.0.0")
    assert finding["msg"].startswith(
        "lab-p300x2-1: Qwen3-32B needs firmware bundle >=19.2.0 (STRICT in its spec), the boards run 19.1.0.0 "
        "(19.1.0.0 is not >=19.2.0). Fix: flash a firmware bundle"
    )
    assert "tt-flash" in finding["fix"]


def test_firmware_mixed_bundles(catalog, tmp_path):
    facts = host_facts(tmp_path, firmware_versions=["19.4.0.0", "19.6.0.0"])
    result = run(facts, qwen(catalog, tmp_path))
    finding = only(result["failures"], "firmware")
    assert finding["model"] is None
    assert finding["measured"] == "19.4.0.0, 19.6.0.0"


def test_firmware_unknown_fails_for_models_with_requirements(catalog, tmp_path):
    facts = host_facts(tmp_path, firmware_versions=[], boards=[], tt_smi_error="tt-smi timed out")
    finding = only(run(facts, qwen(catalog, tmp_path))["failures"], "firmware")
    assert finding["measured"] == "unknown"
    assert "(STRICT in its spec), no board reports a firmware version (0 boards found)" in finding["msg"]


def test_suggested_requirement_only_warns(catalog, tmp_path):
    (summary,) = qwen(catalog, tmp_path)
    summary["system_requirements"] = {
        "firmware": {"specifier": ">=99.0.0", "mode": "SUGGESTED"},
        "kmd": {"specifier": ">=9.0.0", "mode": "SUGGESTED"},
    }
    result = run(host_facts(tmp_path), [summary])
    assert result["failures"] == []
    assert {f["check"] for f in result["warnings"]} == {"firmware", "kmd"}
    assert "SUGGESTED" in only(result["warnings"], "kmd")["msg"]
    # skip still wins over SUGGESTED
    assert run(host_facts(tmp_path), [summary], checks={"kmd": "skip"})["warnings"][0]["check"] == "firmware"


def test_no_system_requirements_pass(catalog, tmp_path):
    (summary,) = qwen(catalog, tmp_path)
    summary["system_requirements"] = None
    result = run(host_facts(tmp_path, kmd_version=None, firmware_versions=["1.0.0.0"]), [summary])
    assert "firmware" in result["passed"] and "kmd" in result["passed"]


@pytest.mark.parametrize(
    ("kmd", "ok", "needle"),
    [
        ("2.6.0", True, None),
        ("2.5.0", True, None),
        ("2.4.1", False, "the host runs 2.4.1 (2.4.1 is not >=2.5.0)"),
        ("1.27.1", False, "the host runs 1.27.1"),
        (None, False, "the host runs none (the tenstorrent kernel module is not loaded)"),
    ],
)
def test_kmd(catalog, tmp_path, kmd, ok, needle):
    result = run(host_facts(tmp_path, kmd_version=kmd), qwen(catalog, tmp_path))
    if ok:
        assert "kmd" in result["passed"]
    else:
        finding = only(result["failures"], "kmd")
        assert needle in finding["msg"]
        assert finding["msg"].startswith("lab-p300x2-1: Qwen3-32B needs KMD >=2.5.0 (STRICT in its spec)")
        assert "tenstorrent-dkms" in finding["fix"]


def test_kmd_warn_level(catalog, tmp_path):
    result = run(host_facts(tmp_path, kmd_version="2.4.1"), qwen(catalog, tmp_path), checks={"kmd": "warn"})
    assert result["failures"] == []
    assert only(result["warnings"], "kmd")["measured"] == "2.4.1"


def test_host_option_names_messages(tmp_path):
    result = run(host_facts(tmp_path, declared_device="n150"), host="qb2-rack3")
    assert result["failures"][0]["msg"].startswith("qb2-rack3: ")


# ---------------------------------------------------------------------------
# The module


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        tt_preflight_module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def test_module_passes_and_reports_models(capsys, tmp_path):
    facts = host_facts(tmp_path, kmd_version="2.6.0")
    code, result = run_module(
        capsys,
        {
            "facts": {"tt": facts},
            "models": [{"name": "Qwen3-32B"}, {"name": "Llama-3.1-8B-Instruct", "state": "absent"}],
            "spec_file": V20,
            "volume_root": str(tmp_path / "tt-cache"),
            "_ansible_check_mode": True,
        },
    )
    assert code == 0, result
    assert result["changed"] is False
    assert result["device"] == "p300x2"
    assert [m["name"] for m in result["models"]] == ["Qwen3-32B"]
    assert result["passed"] == list(pf.CHECK_NAMES)


def test_module_fails_with_every_message(capsys, tmp_path, monkeypatch):
    # Where module.warn() output goes depends on what else the test session imported: record it.
    warned = []
    monkeypatch.setattr(tt_preflight_module.AnsibleModule, "warn", lambda self, text: warned.append(text))
    facts = host_facts(tmp_path, kmd_version="2.4.1", **{"disk.free_gb": 12.3, "hugepages_1g.total": 0})
    code, result = run_module(
        capsys,
        {"facts": facts, "models": [{"name": "Qwen3-32B"}], "spec_file": V20, "volume_root": str(tmp_path / "c")},
    )
    assert code == 1
    assert result["failed"] is True
    assert [f["check"] for f in result["failures"]] == ["disk", "kmd"]
    assert result["msg"].startswith("2 preflight problems: lab-p300x2-1: Qwen3-32B needs 94 GB free")
    assert "needs KMD >=2.5.0" in result["msg"]
    assert [w["check"] for w in result["warning_details"]] == ["hugepages_pages"]
    assert warned == [result["warning_details"][0]["msg"]]


def test_module_needs_spec_source_for_models(capsys, tmp_path):
    code, result = run_module(capsys, {"facts": host_facts(tmp_path), "models": [{"name": "Qwen3-32B"}]})
    assert code == 1
    assert "tt_inference_server_dir" in result["msg"]


def test_module_unknown_model_fails_with_suggestions(capsys, tmp_path):
    code, result = run_module(
        capsys, {"facts": host_facts(tmp_path), "models": [{"name": "Qwen3-33B"}], "spec_file": V20}
    )
    assert code == 1
    assert "Qwen3-32B" in result["msg"]


def test_module_without_device_cannot_select_specs(capsys, tmp_path):
    facts = host_facts(tmp_path, declared_device=None, implied_device=None, implied_device_reason="no boards found")
    code, result = run_module(capsys, {"facts": facts, "models": [{"name": "Qwen3-32B"}], "spec_file": V20})
    assert code == 1
    assert "no device to select the model specs for" in result["msg"]


def test_module_rejects_unknown_check(capsys, tmp_path):
    code, result = run_module(capsys, {"facts": host_facts(tmp_path), "checks": {"dsik": "skip"}})
    assert code == 1
    assert "Did you mean disk" in result["msg"]


def test_module_gathers_the_facts_itself_and_waits_for_a_release(capsys, tmp_path):
    """One call for tt_facts and tt_preflight (issue 34): the facts come back as ansible_facts.tt, and the models are
    not checked while the release directory is missing."""
    args = {
        "gather": {"volume_root": str(tmp_path), "tt_smi": str(tmp_path / "no-tt-smi"), "declared_device": "n150",
                   "release_dir": str(tmp_path / "current")},
        "models": [{"name": "Qwen3-32B"}],
        "models_need_release": True,
        "tt_inference_server_dir": str(tmp_path / "current"),
        "checks": {"device_type": "warn", "hugepages": "skip", "hugepages_pages": "skip", "docker": "skip",
                   "firmware": "skip", "kmd": "skip"},
    }  # fmt: skip
    code, result = run_module(capsys, args)
    assert code == 0, result
    assert result["release_missing"] is True and result["models"] == []
    assert result["ansible_facts"]["tt"] == result["tt"]
    assert result["tt"]["declared_device"] == "n150"
    assert result["tt"]["installed"]["release_dir"] == {"path": str(tmp_path / "current"), "exists": False,
                                                        "link_target": None}  # fmt: skip


def test_module_refuses_facts_with_gather_and_unknown_gather_options(capsys, tmp_path):
    code, result = run_module(capsys, {"facts": {}, "gather": {}})
    assert code == 1 and "mutually exclusive" in result["msg"]
    code, result = run_module(capsys, {"gather": {"volume_root": str(tmp_path), "tt_smii": "x"}})
    assert code == 1 and "unknown options tt_smii" in result["msg"]
    code, result = run_module(capsys, {"gather": {"volume_root": "relative"}})
    assert code == 1 and "gather: volume_root must be an absolute path" in result["msg"]
