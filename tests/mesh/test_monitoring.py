"""deploy/monitoring against a running mesh: every metric the Grafana dashboard and the alert rules query, and
every label they match on, is exported by the session mesh's processes.

The PromQL is parsed (promql-parser), not searched with a pattern: a histogram's ``_bucket``, ``_sum`` and
``_count`` and a counter's ``_total`` count as their family. Grafana's variables become a plain value first.
"""

from __future__ import annotations

import json
import re

import openai
import promql_parser
import pytest
import yaml

from services.launcher.plan import ROOT
from tests.mesh.conftest import DEMO
from tests.mesh.test_metrics import scrape

pytestmark = pytest.mark.mesh

MONITORING = ROOT / "deploy" / "monitoring"
# Series Prometheus makes itself, and labels its scrape config adds (prometheus.yml's relabelling).
PROMETHEUS_SERIES = {"up": {"job", "instance"}}
TARGET_LABELS = {"job", "instance", "pod", "namespace"}
# Grafana's variables (the dashboard's own and its built-ins), as a query would have them filled in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$model": ".*"}


def _dashboard() -> dict:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def _alerts() -> dict:
    return yaml.safe_load((MONITORING / "alerts.yml").read_text())


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' label_values(...)."""
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append(re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"]).group(1))
    for name, value in GRAFANA_VARIABLES.items():
        out = [q.replace(name, value) for q in out]
    return out


def alert_queries(rules: dict) -> list[str]:
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of each vector selector in ``expr``; raises on invalid PromQL."""
    found: list[tuple[str, set[str]]] = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, {m.name for m in node.matchers.matchers}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


SERIES_OF = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", ""),
             "gauge": ("",), "info": ("_info",), "unknown": ("",)}


def exported_series(scraped: dict[str, dict[str, object]]) -> dict[str, set[str] | None]:
    """Series name -> the label names its samples carry, over every process; None for a labelled family with no
    child yet (nothing observed), whose labels the exposition does not show."""
    out: dict[str, set[str] | None] = {}
    for families in scraped.values():
        for family in families.values():
            labels = set().union(*(s.labels for s in family.samples)) if family.samples else None
            for suffix in SERIES_OF[family.type]:
                name = family.name + suffix
                if labels is not None:
                    out[name] = (out.get(name) or set()) | labels
                else:
                    out.setdefault(name, None)
    return out


def test_the_files_are_well_formed():
    dashboard, rules = _dashboard(), _alerts()
    assert dashboard["uid"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["labels"]["severity"] in ("critical", "warning", "info")
            assert rule["annotations"]["summary"], rule["alert"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    pods = config["scrape_configs"][0]
    assert pods["kubernetes_sd_configs"][0]["role"] == "pod"
    # The job label the dashboard's per-stage panels group by is the pod's name label, as deploy/k8s sets it.
    assert {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "target_label": "job"} \
        in pods["relabel_configs"]
    for manifest in ("gateway", "preprocessor", "router", "postprocessor", "mocker"):
        text = (ROOT / "deploy" / "k8s" / "base" / f"{manifest}.yaml").read_text()
        assert 'prometheus.io/scrape: "true"' in text and "app.kubernetes.io/name" in text, manifest


def test_every_queried_metric_is_exported_by_a_running_mesh(mesh, client):
    # One request of each kind the panels plot (a stream has a TTFT and an ITL), so no histogram is empty.
    client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    list(client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                        stream=True))
    with pytest.raises(openai.NotFoundError):  # errors_total gets a child: its labels are checked too
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    exported = exported_series(scrape(mesh))
    queries = dashboard_queries(_dashboard()) + alert_queries(_alerts())
    assert len(queries) > 30
    referenced = [(name, labels, q) for q in queries for name, labels in selectors(q)]
    covered = {"requests_total", "errors_total", "time_to_first_token", "inter_token_latency", "inflight",
               "cached_tokens", "migrations", "worker_inflight_requests", "route_duration", "preprocessor_duration"}
    names = {name for name, _, _ in referenced}
    assert {c for c in covered if not any(c in n for n in names)} == set()  # the brief's subjects are all there
    missing = [(name, q) for name, _, q in referenced if name not in exported and name not in PROMETHEUS_SERIES]
    assert missing == []
    for name, labels, q in referenced:
        seen = PROMETHEUS_SERIES.get(name) or exported[name]
        if seen is not None:  # a family nothing was counted in yet (no queue, no overload) shows no labels
            assert labels <= seen | TARGET_LABELS, (name, labels - seen, q)


def test_the_check_would_catch_a_wrong_name():
    """The parser finds each selector: a misspelt family or a counter without _total is not exported."""
    assert selectors("sum(rate(meshfront_gateway_request_total[5m])) / on() group_left up") == [
        ("meshfront_gateway_request_total", set()), ("up", set())]
    assert selectors('histogram_quantile(0.9, rate(x_bucket{le!="", model=~".*"}[5m]))') == [
        ("x_bucket", {"le", "model"})]
    with pytest.raises(Exception):  # noqa: B017 - the parser's own error type; any is a failure here
        selectors("sum(rate(x[5m])")
