"""A simulated replay in the Grafana dashboards: the three commands of docs/simulator.md.

`gangshare simulate --metrics-out` writes a small replay's series (two queues in a cohort, one
borrowing the other's idle quota and reclaimed, opportunistic jobs beside), `promtool tsdb
create-blocks-from openmetrics` backfills them into blocks, and a real Prometheus (both built
from the same Go module by scripts/build-k8s.sh) serves those blocks without scraping anything.
Every dashboard expression the replay's series can answer, as Grafana would send it over the
replay's time range (query_range), must return data; the ones it cannot answer are listed below
with the reason, and the list must be exactly what the series leave out, so it cannot grow
without this file saying why.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_process import PrometheusProcess

import dashboards
from gangshare.dev import binaries
from lucid_inputs import write_lucid

pytestmark = pytest.mark.e2e

STEP = 60
# Grafana's $__rate_interval for a data source scraped every STEP seconds: 4 scrapes.
RATE_WINDOW = f"{4 * STEP}s"

NO_FAILURES = "a replayed job never fails"
NO_START_TIME = "a simulated gang starts the instant it is admitted (no binding, no image pull)"
WALL_CLOCK = (
    "wall-clock pass timings: a replay runs in virtual time and its output is deterministic"
)
NO_EXTENDER = "no kube-scheduler or extender in a replay: placement is the core's plan"
NO_PODS = "the agent's per-pod coordinator state: the simulator models each GPU's settled share"
NO_API = "no API server in a replay: nothing is reconciled, from the stores or otherwise"
NO_WATCHES = (
    "no watches in a replay: its cluster is the simulation's own state, not a snapshot kept"
    " from watch changes, so nothing is audited"
)
NO_FORECAST = (
    "a replay forecasts only in make results' accuracy runs, which score each forecast against"
    " its job's actual start instead of exporting it"
)
# (dashboard, panel) -> why the replay has nothing for it.
UNANSWERED = {
    ("gangshare-jobs.json", "Gang failures by class"): NO_FAILURES,
    ("gangshare-jobs.json", "Gang start time (quantiles)"): NO_START_TIME,
    ("gangshare-scheduler.json", "Scheduling pass duration (quantiles)"): WALL_CLOCK,
    ("gangshare-scheduler.json", "Admission decision (quantiles)"): WALL_CLOCK,
    ("gangshare-scheduler.json", "Extender cache: GPU nodes"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Extender: binds in flight"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Extender requests"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Extender latency (quantiles)"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Extender non-ok ratio"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Filter outcomes"): NO_EXTENDER,
    ("gangshare-scheduler.json", "Operator reconciles by reads"): NO_API,
    ("gangshare-scheduler.json", "Snapshot audits and drift"): NO_WATCHES,
    ("gangshare-queues.json", "Forecast wait"): NO_FORECAST,
    ("gangshare-queues.json", "Not forecast within a week / forecast time"): NO_FORECAST,
    ("gangshare-node-sharing.json", "Opportunistic duty cap"): NO_PODS,
    ("gangshare-node-sharing.json", "Opportunistic memory cap"): NO_PODS,
    ("gangshare-node-sharing.json", "Guaranteed slowdown"): NO_PODS,
    ("gangshare-node-sharing.json", "Coordinator squeezes and back-offs"): NO_PODS,
    ("gangshare-node-sharing.json", "Throttles"): NO_PODS,
    ("gangshare-node-sharing.json", "Evictions"): NO_PODS,
}

CLUSTER = """nodePools:
  - {name: dgx, count: 2, gpusPerNode: 4, gpuMemoryMiB: 16384, nvlinkIslands: [[0, 1, 2, 3]]}
queues:
  - {name: research, quota: 4}
  - {name: prod, quota: 4}
"""


def write_inputs(folder: Path) -> None:
    """Research's 4-GPU gangs overflow onto prod's idle quota until prod's jobs reclaim it;
    opportunistic 1-GPU jobs share GPUs beside them. About three simulated hours."""
    write_lucid(folder)
    (folder / "cluster.yaml").write_text(CLUSTER)
    rows = ["job_id,submit_time,duration,num_gpus,queue,service_class,priority"]
    rows += [f"research-{i},{i * 300},2400,4,research,," for i in range(4)]
    rows += [f"notebook-{i},{600 + i * 400},1500,1,research,opportunistic," for i in range(6)]
    rows += [f"prod-{i},{1500 + i * 900},1800,4,prod,," for i in range(4)]
    (folder / "trace.csv").write_text("\n".join(rows) + "\n")


def tool(name: str) -> Path:
    binary = binaries.bin_dir(build=False) / name
    if not binary.exists():
        # Not a skip: `make test` builds it (the k8s target) before any test runs.
        pytest.fail(f"{binary} is missing: run scripts/build-k8s.sh (make k8s) to build it")
    return binary


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def written(path: Path) -> tuple[set[str], float, float]:
    """Series names in the OpenMetrics file, and its first and last timestamps."""
    names, stamps = set(), []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        names.add(line.split("{", 1)[0].split(" ", 1)[0])
        stamps.append(float(line.rsplit(" ", 1)[1]))
    return names, min(stamps), max(stamps)


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(v)) for series in result for _, v in series["values"])


def test_every_dashboard_query_the_replay_can_answer_returns_data(tmp_path: Path):
    promtool, prometheus_binary = tool("promtool"), tool("prometheus")
    write_inputs(tmp_path)
    metrics = tmp_path / "replay.om"
    simulated = run(
        [
            *(sys.executable, "-m", "gangshare.cli", "simulate"),
            *("--trace", "trace.csv", "--cluster", "cluster.yaml", "--colocation", "lucid"),
            *("--policy", "multi-queue,backfill,antman,cohort", "--no-plots", "--no-progress"),
            *("--out", "sim-out", "--metrics-out", str(metrics), "--metrics-step", str(STEP)),
        ],
        tmp_path,
    )
    names, start, end = written(metrics)
    blocks = tmp_path / "blocks"
    backfilled = run(
        [str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(metrics), str(blocks)],
        tmp_path,
    )
    print(simulated, backfilled, sep="\n")
    prometheus = PrometheusProcess(prometheus_binary, tmp_path / "prometheus", {}, blocks)
    (tmp_path / "prometheus").mkdir()
    try:
        prometheus.start()
        answered, unanswered, failures = 0, set(), []
        for query in dashboards.queries():
            if not dashboards.metric_names(query.expr) <= names:
                unanswered.add((query.dashboard, query.panel))
                continue
            expr = dashboards.concrete(query.expr, RATE_WINDOW)
            result = prometheus.query_range(expr, start, end, f"{STEP}s")
            answered += 1
            if not finite(result):
                failures.append(f"{query.where()}\n    sent {expr}\n    got {result}")
        for name, board in dashboards.load().items():
            for metric, label in dashboards.variable_queries(board):
                found = prometheus.api(
                    f"label/{label}/values",
                    **{"match[]": metric, "start": f"{start:.3f}", "end": f"{end:.3f}"},
                )
                if metric in names and not found:
                    failures.append(f"{name}: variable label_values({metric}, {label}) is empty")
        assert not failures, "\n".join(failures)
        assert unanswered == set(UNANSWERED), sorted(unanswered ^ set(UNANSWERED))
        print(f"{answered} dashboard queries returned data over the replay; unanswered panels:")
        for (board, panel), why in sorted(UNANSWERED.items()):
            print(f"  {board} / {panel}: {why}")
    except BaseException:
        print(prometheus.logs()[-3000:])
        raise
    finally:
        prometheus.stop()
