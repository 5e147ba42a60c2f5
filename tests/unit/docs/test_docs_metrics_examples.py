"""docs/examples: the Grafana dashboard and the alert rules ask only for metrics that exist.

The names the hosts export are read from the code that writes them (the health run of roles/serve/files/ttfleet-serve),
vLLM's from tests/fixtures/metrics/vllm-metric-names.txt; the lab's stand-in exports only vLLM names. The alert rules'
behaviour is tested by promtool in the lint stage (docs/examples/prometheus/ttfleet-alerts.test.yml).
"""

import json
import os
import re
import sys

import pytest
import yaml
from conftest import FIXTURES, ROOT

DASHBOARD = os.path.join(ROOT, "docs", "examples", "grafana", "ttfleet-fleet.json")
ALERTS = os.path.join(ROOT, "docs", "examples", "prometheus", "ttfleet-alerts.yml")
WRAPPER = os.path.join(ROOT, "roles", "serve", "files", "ttfleet-serve")
STANDIN = os.path.join(ROOT, "tests", "lab", "upstream_image", "stubs")
SUFFIXES = ("_bucket", "_sum", "_count", "_created")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def exported():
    with open(WRAPPER, encoding="utf-8") as handle:
        names = set(re.findall(r'out\.add\(\s*"(ttfleet_[a-z0-9_]+)"', handle.read()))
    assert len(names) >= 10, "the wrapper's metric names were not found: did out.add() change?"
    return names


def vllm_names():
    with open(os.path.join(FIXTURES, "metrics", "vllm-metric-names.txt"), encoding="utf-8") as handle:
        return {line.strip() for line in handle if line.strip() and not line.startswith("#")}


def metric_names(expr):
    """The metric names a PromQL expression selects (functions, keywords, labels and durations left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, regexes
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = match.group(0), text[match.end() :].lstrip()
        if rest.startswith("(") or word in KEYWORDS or word.startswith("$"):
            continue
        if re.fullmatch(r"[0-9.]+[smhdwy]?", word) or text[match.start() - 1 : match.start()] == "$":
            continue
        names.add(word)
    return names


def known(name, names):
    return name in names or any(name.endswith(s) and name[: -len(s)] in names for s in SUFFIXES)


def dashboard_exprs():
    with open(DASHBOARD, encoding="utf-8") as handle:
        board = json.load(handle)
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            exprs.append(re.sub(r"label_values\(([^,]+),.*\)", r"\1", variable["query"]["query"]))
    return board, exprs


def alert_exprs():
    with open(ALERTS, encoding="utf-8") as handle:
        return [rule["expr"] for group in yaml.safe_load(handle)["groups"] for rule in group["rules"]]


def test_the_name_reader_finds_names_and_skips_the_rest():
    expr = 'sum by (host, instance) (rate(vllm:request_success_total{host=~"$host",x="a b"}[5m])) / on(host) ttfleet_x'
    assert metric_names(expr) == {"vllm:request_success_total", "ttfleet_x"}
    assert metric_names("count(a == 0) or vector(0)") == {"a"}
    assert metric_names("time() - b > 300") == {"b"}


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_expression_names_an_exported_or_vllm_metric(source):
    names = exported() | vllm_names()
    exprs = dashboard_exprs()[1] if source == "dashboard" else alert_exprs()
    assert exprs
    unknown = sorted({(name, expr) for expr in exprs for name in metric_names(expr) if not known(name, names)})
    assert unknown == [], f"{source} asks for metrics nobody exports: {unknown}"


def test_the_dashboard_and_the_alerts_cover_the_metrics_of_the_issue():
    used = set().union(*(metric_names(e) for e in dashboard_exprs()[1] + alert_exprs()))
    for name in (
        "ttfleet_instance_health_ok",
        "ttfleet_instance_restarts_total",
        "ttfleet_volume_free_bytes",
        "ttfleet_upgrade_need_bytes",
        "ttfleet_host_boards",
        "ttfleet_reclaimable_bytes",
        "vllm:num_requests_running",
        "vllm:request_success_total",
    ):
        assert name in used


def test_the_dashboard_is_importable():
    """What Grafana's import needs: unique panel ids, a grid position, queries on the datasource variable."""
    board, _exprs = dashboard_exprs()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    for panel in board["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]


def test_the_lab_stand_in_exports_only_vllm_names():
    sys.path.insert(0, STANDIN)
    try:
        import lab_standin
    finally:
        sys.path.remove(STANDIN)
    text = lab_standin.vllm_metrics("m", 3)
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert families and families <= vllm_names()
    assert "vllm:num_requests_running" in families and "vllm:request_success_total" in families
