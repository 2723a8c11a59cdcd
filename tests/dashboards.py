"""The Grafana dashboards of deploy/grafana/: their PromQL, and the series the code exports.

Shared by tests/unit/test_dashboards.py (every name a query uses is one the code exports) and
tests/e2e/test_prometheus.py (every query returns data from a real Prometheus).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana"

# Series names are gangshare's own: nothing else is scraped by the dashboards.
METRIC = re.compile(r"\bgangshare_[A-Za-z0-9_]+")
# `label_values(metric, label)` in a template variable's query.
LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*(\w+)\s*\)")
# Series a family of each type exposes besides its own name (prometheus_client's exposition).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str

    def where(self) -> str:
        return f"{self.dashboard} / {self.panel}: {self.expr}"


def load() -> dict[str, dict[str, Any]]:
    """Dashboard file name -> its JSON."""
    return {path.name: json.loads(path.read_text()) for path in sorted(GRAFANA.glob("*.json"))}


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in container.get("panels") or []:
        yield panel
        yield from panels(panel)


def queries(boards: dict[str, dict[str, Any]] | None = None) -> list[Query]:
    found = []
    for name, board in (boards or load()).items():
        for panel in panels(board):
            for target in panel.get("targets") or []:
                found.append(Query(name, str(panel.get("title")), str(target["expr"])))
    return found


def variable_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, label) of every `label_values(...)` template variable."""
    found = []
    for variable in (board.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query)
        found += LABEL_VALUES.findall(text)
    return found


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def exported_families() -> dict[str, str]:
    """Every metric family the operator, the extender and the node agent expose -> its type.

    The metric classes are built on fresh registries and read back through `collect()`, so
    this is what a scrape would list, not a copy of the names. The operator's snapshot
    families only exist once a pass has set them, so one empty pass is applied first.
    """
    from gangshare.agent.metrics import AgentMetrics
    from gangshare.extender.metrics import ExtenderMetrics
    from gangshare.operator.metrics import OperatorMetrics

    operator = OperatorMetrics(CollectorRegistry())
    operator.set_trainingjobs([])
    operator.set_queues({}, {})
    operator.set_forecasts([], 0.0)
    registries = [
        operator.registry,
        ExtenderMetrics(CollectorRegistry()).registry,
        AgentMetrics("node", CollectorRegistry()).registry,
    ]
    return {family.name: family.type for registry in registries for family in registry.collect()}


def labelled(label: str) -> set[str]:
    """The operator's families whose series carry `label`: the counters' and histograms'
    label names, and the snapshot gauge's from one job's pass."""
    from gangshare.operator.metrics import OperatorMetrics

    operator = OperatorMetrics(CollectorRegistry())
    operator.set_trainingjobs([{"metadata": {"name": "j"}, "spec": {}}])
    found = {
        family.name
        for family in operator.registry.collect()
        if any(label in sample.labels for sample in family.samples)
    }
    for metric in vars(operator).values():
        # prometheus_client's labelled metrics keep their label names in _labelnames.
        if label in getattr(metric, "_labelnames", ()):
            found |= {family.name for family in metric.describe()}
    return found


# PromQL's aggregation operators: `op by|without (labels) (expr)` or `op (expr) by (labels)`.
AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)
_CALL = re.compile(r"(\w+)\s*(?:\b(?:by|without)\s*\([^()]*\)\s*)?$")


def aggregated(expr: str) -> set[str]:
    """The gangshare series names of `expr` whose every occurrence sits inside an aggregation
    (`sum by (queue) (...)`, within a rate or a quantile or not), so a label its grouping
    leaves out does not split the query's series."""
    # Quoted matcher values ("a|(b)") hold no calls: blanked, the offsets kept.
    expr = re.sub(r'"[^"]*"', lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)
    inside: dict[str, bool] = {}
    for match in METRIC.finditer(expr):
        calls, depth = [], 0
        for at in range(match.start() - 1, -1, -1):
            if expr[at] == ")":
                depth += 1
            elif expr[at] == "(":
                if depth:
                    depth -= 1
                    continue
                call = _CALL.search(expr[:at])
                calls.append(call.group(1) if call else "")
        name = match.group()
        inside[name] = inside.get(name, True) and any(c in AGGREGATIONS for c in calls)
    return {name for name, is_inside in inside.items() if is_inside}


# `sum [by (labels)] (name{matchers})`: a gauge's query, which instant_sum evaluates.
_GAUGE_SUM = re.compile(
    r"sum\s*(?:by\s*\(([^()]*)\)\s*)?\(\s*(gangshare_\w+)\s*(?:\{([^{}]*)\})?\s*\)"
)
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def instant_sum(
    expr: str, series: list[tuple[str, dict[str, str], float]]
) -> dict[tuple[tuple[str, str], ...], float]:
    """What Prometheus answers to `sum [by (labels)] (name{matchers})` over `series` (name,
    labels, value): {the grouping labels: the sum}. Only that shape: a gauge's query."""
    shape = _GAUGE_SUM.fullmatch(expr.strip())
    if shape is None:
        raise ValueError(f"not a sum of one gauge: {expr}")
    by = [label.strip() for label in (shape.group(1) or "").split(",") if label.strip()]
    matchers = _MATCHER.findall(shape.group(3) or "")
    tests = {
        "=": lambda have, want: have == want,
        "!=": lambda have, want: have != want,
        "=~": lambda have, want: re.fullmatch(want, have) is not None,
        "!~": lambda have, want: re.fullmatch(want, have) is None,
    }
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    for name, labels, value in series:
        if name != shape.group(2):
            continue
        if all(tests[op](labels.get(label, ""), want) for label, op, want in matchers):
            group = tuple((label, labels.get(label, "")) for label in by)
            sums[group] = sums.get(group, 0.0) + value
    return sums


def exported_series() -> dict[str, str]:
    """Every series name the operator, the extender and the node agent expose -> its family."""
    return {
        name + suffix: name
        for name, kind in exported_families().items()
        for suffix in SUFFIXES[kind]
    }


def unknown_names(expr: str, exported: dict[str, str]) -> set[str]:
    """Names in `expr` that no component exports (a histogram's or counter's bare family name
    counts as unknown: Prometheus stores only its _bucket/_sum/_count or _total series)."""
    return {name for name in metric_names(expr) if name not in exported}


def concrete(expr: str, window: str, variables: dict[str, str] | None = None) -> str:
    """The expression as Grafana would send it: intervals filled in, each variable its value
    in `variables`, else `.*` (All)."""
    for interval in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(interval, window)
    values = variables or {}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), expr)


def panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in panels(board) if p.get("title") == title)


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A Grafana legendFormat (`{{queue}} nominal`) filled in from a series' labels."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
