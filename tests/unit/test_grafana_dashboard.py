"""docs/grafana/shardq.json queries only metrics shardq exports, and docs/operations.md lists each."""

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from shardq.worker.metrics import Metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry, multiprocess=False)
    names = set()
    for family in registry.collect():
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_every_metric_the_dashboard_queries_is_exported_and_documented():
    exported = exported_names()
    dashboard = json.loads((DOCS / "grafana" / "shardq.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried.update(re.findall(r"\bshardq_[a-z_]+", target["expr"]))
    for name in queried:
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            base = base.removesuffix(suffix)
        assert name in exported or base in exported, f"the dashboard queries {name}, which shardq does not export"
    assert len(queried) >= 12
    operations = (DOCS / "operations.md").read_text()
    for name in exported:
        assert f"`{name}`" in operations, f"{name} is not listed in docs/operations.md"
