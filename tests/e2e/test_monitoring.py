"""deploy/monitoring uses only series the running services export.

Starts the real training server, a prediction replica and the coalescer, drives predictions,
samples (through the relay) and a retrain, scrapes each /metrics and checks every metric name
in the Grafana dashboard and the Prometheus rules; checks the ServiceMonitor selects the
Kubernetes Services on their metrics port.
"""

from __future__ import annotations

import json
import lzma
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.procs import REPO_ROOT, RunningService, start_service, wait_until

pytestmark = pytest.mark.e2e

MONITORING = REPO_ROOT / "deploy" / "monitoring"
TRACE = Path("/work/shared/data/llmd-h200-traces/sharegpt-h200.jsonl.xz")
if (REPO_ROOT.parent / "shared" / "data").is_dir():
    TRACE = REPO_ROOT.parent / "shared" / "data" / "llmd-h200-traces" / "sharegpt-h200.jsonl.xz"
METRIC = re.compile(r"\b(?:training|prediction|coalescer)_[a-z0-9_]+\b")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_exprs() -> list[str]:
    (doc,) = [d for d in yaml.safe_load_all((MONITORING / "prometheus-rules.yaml").read_text()) if d]
    assert doc["kind"] == "PrometheusRule"
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    alerts = {r["alert"] for r in rules}
    for needed in ("CoverageDrift", "Stale", "Shedding", "RelayDropping"):
        assert any(needed in a for a in alerts), f"no alert for {needed}: {alerts}"
    assert all(r.get("for") and r["annotations"]["summary"] for r in rules)
    return [r["expr"] for r in rules]


def exported(text: str) -> tuple[set[str], set[str]]:
    """Names with a sample, and names a family declares (histograms: _bucket/_sum/_count)."""
    sampled = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            declared.add(name)
            if kind == "histogram":
                declared |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return sampled, declared | sampled


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningService]]:
    tmp = tmp_path_factory.mktemp("monitoring")
    logs = tmp / "logs"
    training = start_service(
        "training_server",
        [
            "--data-dir",
            str(tmp / "data"),
            "--min-train-samples",
            "100",
            "--min-train-samples-tpot",
            "100",
            "--n-estimators",
            "20",
        ],
        log_dir=logs,
    )
    running = [training]
    try:
        replica = start_service(
            "prediction_server", ["--store", str(tmp / "data" / "models")], log_dir=logs, ready_path="/readyz"
        )
        running.append(replica)
        coalescer = start_service(
            "coalescer",
            ["--prediction-urls", replica.url, "--training-url", training.url],
            log_dir=logs,
            ready_path="/readyz",
        )
        running.append(coalescer)
        yield running
    finally:
        for svc in reversed(running):
            svc.stop()


def _drive(training: RunningService, coalescer: RunningService) -> None:
    with lzma.open(TRACE, "rt") as f:
        entries = [json.loads(line) for _, line in zip(range(2000), f, strict=False)]
    features = [{k: v for k, v in e.items() if not k.startswith("actual_")} for e in entries[:8]]
    for _ in range(5):
        assert (
            httpx.post(coalescer.url + "/predict/bulk/strict", json={"requests": features}).status_code == 200
        )
    assert httpx.post(coalescer.url + "/predict/bulk/strict", content=b"{").status_code == 422  # a rejection
    assert httpx.post(coalescer.url + "/add_training_data_bulk", json={"entries": entries}).status_code == 202
    wait_until(
        lambda: httpx.get(training.url + "/status").json()["window"]["samples"] >= len(entries),
        "relayed samples in the window",
        timeout_s=60,
    )
    done = httpx.post(training.url + "/retrain?wait=true", timeout=120).json()
    assert done["outcome"] == "published", done


def test_every_series_in_the_dashboard_and_rules_exists(services: list[RunningService]) -> None:
    training, replica, coalescer = services
    _drive(training, coalescer)
    wait_until(  # the replica picks the new version up on its next poll
        lambda: httpx.get(replica.url + "/status").json()["model_kind"] == "trained", "a trained model served"
    )
    sampled: set[str] = set()
    declared: set[str] = set()
    texts = []
    for svc in services:
        text = httpx.get(svc.url + "/metrics").text
        texts.append(text)
        s, d = exported(text)
        sampled |= s
        declared |= d
    used: dict[str, str] = {}
    for expr in dashboard_exprs() + rule_exprs():
        for name in METRIC.findall(expr):
            used.setdefault(name, expr)
    assert len(used) >= 25, sorted(used)
    missing = {name: expr for name, expr in used.items() if name not in declared}
    assert not missing, f"not exported by any service: {missing}"
    # Series whose labels the dashboard and rules select on carry those labels.
    all_text = "\n".join(texts)
    assert re.search(r'^training_model_coverage\{[^}]*role="current"', all_text, re.M)
    assert re.search(r'^coalescer_rejections_total\{reason="invalid_input"\}', all_text, re.M)
    assert re.search(r"^prediction_model_is_prior(\{[^}]*\})? 0", all_text, re.M)


def test_service_monitor_scrapes_every_service_on_its_metrics_port() -> None:
    (monitor,) = [d for d in yaml.safe_load_all((MONITORING / "service-monitor.yaml").read_text()) if d]
    assert monitor["kind"] == "ServiceMonitor"
    selector = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    services: list[dict[str, Any]] = []
    for path in (REPO_ROOT / "deploy" / "k8s").glob("*.yaml"):
        services += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Service"]
    selected = {
        s["metadata"]["name"] for s in services if selector.items() <= s["metadata"]["labels"].items()
    }
    assert selected == {s["metadata"]["name"] for s in services} and len(selected) == 3
    for s in services:
        assert ports <= {p["name"] for p in s["spec"]["ports"]}, s["metadata"]["name"]
