"""Every Grafana dashboard query answered by a real Prometheus scraping the real components.

Prometheus (built from its Go module by scripts/build-k8s.sh) scrapes, every second, the
session cluster's extender, an operator started for the test and a node agent on the fake NVML
backend. A small workload runs to its end: a 2x4 gang that borrows a cohort's idle quota and is
reclaimed (preemption, requeue), the lender's job, and a job that fails with a user error. Then
every expression of every dashboard, as Grafana would send it, must return data.

GANGSHARE_RENDER_PANELS=1 (make panels) also draws the queues dashboard's GPU and pending-jobs
panels over the run into docs/img/queues-panel.png.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_process import PrometheusProcess

import dashboards
from gangshare.dev.processes import free_port
from kube import ChildProcess, Kube, NodePool, OperatorProcess, eventually
from tj import create, status, trainingjob

pytestmark = pytest.mark.e2e
PANEL_PNG = dashboards.ROOT / "docs" / "img" / "queues-panel.png"

# The node agent's coordinator series exist only once it has an opportunistic pod to cap, and it
# learns its pods from the kubelet's PodResources API; the fake agent here has no kubelet (KWOK
# plays the nodes), so these are checked by name only (tests/unit/test_dashboards.py). The
# agent's behaviour behind them runs on a real kubelet in tests/e2e/test_coordinator.py.
NEEDS_A_KUBELET = {
    "gangshare_opportunistic_duty_ratio",
    "gangshare_opportunistic_memory_cap_bytes",
    "gangshare_guaranteed_slowdown_ratio",
    "gangshare_coordinator_changes_total",
    "gangshare_agent_throttles_total",
    "gangshare_agent_evictions_total",
}


class FakeAgentProcess(ChildProcess):
    """`gangshare agent --nvml fake` for a KWOK node: no kubelet, so its device plugins never
    register (it logs that and goes on), but it samples the fake GPUs, publishes them on the
    Node and serves /metrics like on a real node."""

    def __init__(self, kube: Kube, workdir: Path, node: str, spec: dict[str, Any]) -> None:
        self.kube = kube
        self.workdir = workdir
        self.node = node
        self.spec = spec
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FakeAgentProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "plugins").mkdir(exist_ok=True)
        spec = self.workdir / "gpus.yaml"
        spec.write_text(yaml.safe_dump(self.spec))
        argv = [
            sys.executable,
            *("-m", "gangshare.cli", "agent"),
            *("--node-name", self.node, "--kubeconfig", self.kube.state.kubeconfig),
            *("--nvml", "fake", "--fake-spec", str(spec)),
            *("--device-plugin-dir", str(self.workdir / "plugins")),
            *("--pod-resources-socket", str(self.workdir / "no-kubelet.sock")),
            *("--socket-dir", str(self.workdir / "sdk")),
            *("--mps-pipe-dir", str(self.workdir / "mps")),
            *("--publish-interval", "1", "--metrics-port", str(self.metrics_port)),
        ]
        log = (self.workdir / "agent.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        return self

    def logs(self) -> str:
        path = self.workdir / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""


def prometheus_binary(kube: Kube) -> Path:
    binary = kube.bins / "prometheus"
    if not binary.exists():
        # Not a skip: `make test` builds it (the k8s target) before any test runs.
        pytest.fail(f"{binary} is missing: run scripts/build-k8s.sh (make k8s) to build it")
    return binary


def run_workload(kube: Kube, namespace: str, pool: NodePool, lender: str, borrower: str) -> None:
    """Borrow, reclaim, requeue, a user error: until every job has finished."""
    model = pool.model

    def phase(name: str) -> str | None:
        return status(kube, namespace, name).get("phase")

    create(
        kube, namespace, trainingjob("gang", 2, 4, run_for="10s", queue=borrower, gpuModel=model)
    )
    eventually(
        lambda: phase("gang") == "Running",
        timeout=90,
        what="the 2x4 gang running on quota borrowed from the cohort",
    )
    assert status(kube, namespace, "gang").get("borrowed") is True
    create(
        kube, namespace, trainingjob("reclaim", 1, 4, run_for="3s", queue=lender, gpuModel=model)
    )
    eventually(
        lambda: (status(kube, namespace, "gang").get("preemptions") or 0) >= 1,
        timeout=60,
        what="the borrowing gang evicted when the lender needs its quota",
    )
    create(kube, namespace, trainingjob("crash", 1, 1, exit_code="1", queue=lender, gpuModel=model))
    for name, end in (("reclaim", "Succeeded"), ("crash", "Failed"), ("gang", "Succeeded")):
        eventually(
            lambda n=name: phase(n) in ("Succeeded", "Failed"), timeout=120, what=f"{name} done"
        )
        assert phase(name) == end, status(kube, namespace, name)
    failure = status(kube, namespace, "crash").get("lastFailure") or {}
    assert failure.get("class") == "User", failure


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_dashboard_query_returns_data(
    crd: Kube, pool: NodePool, namespace: str, queues: Any, tmp_path: Path
):
    binary = prometheus_binary(crd)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    assert "prometheus, version 3." in version.stdout, version.stdout + version.stderr
    nodes = pool.nodes(2, 4)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=8, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    fake_gpus = {
        "nodePools": [
            {
                "name": pool.label,
                "count": 2,
                "gpusPerNode": 4,
                "gpuModel": pool.model,
                "fake": {
                    "utilization": [
                        {"at": 0, "gpus": {"0": {"sm": 0.6, "memoryUsedMiB": 4096}}},
                    ]
                },
            }
        ]
    }
    operator = OperatorProcess(crd, tmp_path / "operator")
    (tmp_path / "operator").mkdir()
    agent = FakeAgentProcess(crd, tmp_path / "agent", nodes[0], fake_gpus)
    targets = {
        "operator": f"127.0.0.1:{operator.metrics_port}",
        "extender": f"127.0.0.1:{crd.state.ports['extender_metrics']}",
        "agent": f"127.0.0.1:{agent.metrics_port}",
    }
    prometheus = PrometheusProcess(binary, tmp_path / "prometheus", targets)
    (tmp_path / "prometheus").mkdir()
    try:
        operator.start()
        agent.start()
        prometheus.start()
        eventually(
            lambda: prometheus.targets_up() == dict.fromkeys(targets, "up"),
            timeout=60,
            what="prometheus scraping the operator, the extender and the agent",
        )
        start = time.time()
        run_workload(crd, namespace, pool, lender, borrower)
        # The last pass's snapshot (every job finished) must have been scraped.
        done = f'sum(gangshare_trainingjobs{{queue="{borrower}",phase="Succeeded"}})'
        eventually(
            lambda: [float(s["value"][1]) for s in prometheus.query(done, time.time())] == [1.0],
            what="the finished run scraped",
        )
        end = time.time()
        # Every rate and quantile over the whole run, as a dashboard whose range is the run.
        window = f"{math.ceil(end - start) + 15}s"
        checked, excluded, failures = [], [], []
        for query in dashboards.queries():
            if dashboards.metric_names(query.expr) & NEEDS_A_KUBELET:
                excluded.append(query)
                continue
            expr = dashboards.concrete(query.expr, window)
            result = prometheus.query(expr, end)
            checked.append(query)
            if not result or not finite(result):
                failures.append(f"{query.where()}\n    sent {expr}\n    got {result}")
        for name, board in dashboards.load().items():
            for metric, label in dashboards.variable_queries(board):
                if metric in NEEDS_A_KUBELET:
                    continue
                if not prometheus.api(f"label/{label}/values", **{"match[]": metric}):
                    failures.append(f"{name}: variable label_values({metric}, {label}) is empty")
        assert not failures, "\n".join(failures)
        # Only the node-sharing dashboard's coordinator panels are left out, and nothing else.
        assert {q.dashboard for q in excluded} == {"gangshare-node-sharing.json"}
        assert len(checked) + len(excluded) == len(dashboards.queries())
        print(f"{len(checked)} queries returned data; by name only: {[q.panel for q in excluded]}")
        if os.environ.get("GANGSHARE_RENDER_PANELS") == "1":
            from panel_render import render

            board = dashboards.load()["gangshare-queues.json"]
            render(
                prometheus,
                board,
                ["GPUs: nominal vs guaranteed vs borrowed", "Pending jobs"],
                # From just before the first job to now, so the drop to zero shows.
                start - 3,
                time.time(),
                PANEL_PNG,
                variables={"queue": f"{lender}|{borrower}"},
                rename=lambda name: name.replace(lender, "lender").replace(borrower, "borrower"),
                origin=start,
            )
    except BaseException:
        print(operator.logs()[-4000:], agent.logs()[-3000:], prometheus.logs()[-3000:], sep="\n")
        raise
    finally:
        prometheus.stop()
        agent.stop()
        operator.stop()
