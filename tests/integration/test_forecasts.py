"""Start-time forecasts on the real control plane (the operator, kube-scheduler with the
extender, KWOK): a queue of whole-node gangs behind a running one gets forecasts that follow
the predicted run times, shown in status.forecast, `kubectl get` and `describe`, on a queued
batch/v1 Job's status annotation, in the operator's metrics and by `gangshare queue`."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_batch_jobs import batch_job, jobs_api, note

from gangshare.kube.snapshot import parse_time
from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, phase_is, status, trainingjob

pytestmark = pytest.mark.integration


def forecast_of(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    found = status(kube, namespace, name).get("forecast")
    return found if found and found.get("startTime") else None


def test_a_queue_behind_a_running_gang_is_forecast_from_its_predicted_run_times(
    crd: Kube, pool: NodePool, namespace: str, queues: Any, tmp_path: Path
):
    cohort = f"lab-{uuid.uuid4().hex[:5]}"
    queue = queues("fc", cohort=cohort)
    pool.nodes(1, 8)
    model = pool.model
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        create(
            crd,
            namespace,
            trainingjob(
                "first",
                1,
                8,
                run_for="120s",
                queue=queue,
                gpuModel=model,
                runtimeEstimateSeconds=120,
            ),
        )
        running = eventually(lambda: phase_is(crd, namespace, "first", "Running"), timeout=60)
        create(
            crd,
            namespace,
            trainingjob(
                "second",
                1,
                8,
                run_for="5s",
                queue=queue,
                gpuModel=model,
                runtimeEstimateSeconds=600,
            ),
        )
        # Queued in this order (each kind is queued by its own reconcile), a second apart:
        # status.queuedAt is told to the second, and a tie goes to the name.
        eventually(lambda: phase_is(crd, namespace, "second", "Queued"), timeout=30)
        time.sleep(1.1)
        body = batch_job("third", queue, 1, 8, pool, run_for="5s")
        body["metadata"]["annotations"] = {"gangshare.io/runtime-estimate-seconds": "300"}
        jobs_api(crd).create_namespaced_job(namespace, body)

        def both() -> tuple[dict[str, Any], dict[str, Any]] | None:
            second = forecast_of(crd, namespace, "second")
            third = forecast_of(crd, namespace, "job-third")
            if second is None or third is None or third["queueLength"] != 2:
                return None
            return second, third

        # Both forecast, from a pass that saw both waiting.
        second, third = eventually(both, timeout=60)
        # The running gang ends at its start plus its predicted 120 s; the next starts then.
        began = parse_time(running.get("startedAt")) or parse_time(running["admittedAt"])
        assert began is not None
        first_end = began + 120
        second_start = parse_time(second["startTime"])
        third_start = parse_time(third["startTime"])
        assert second_start is not None and third_start is not None
        assert abs(second_start - first_end) <= 15, (second, running)
        # ...and the batch Job after it, at the second's start plus its predicted 600 s.
        assert abs(third_start - (second_start + 600)) <= 15, (third, second)
        assert (second["positionInQueue"], third["positionInQueue"]) == (1, 2)
        assert third["queueLength"] == 2 and third["cohort"] == cohort
        assert third["positionInCohort"] == 2
        assert "second" in third["blockedBy"] or "GPU" in third["blockedBy"], third
        assert parse_time(third["earliest"]) <= third_start <= parse_time(third["latest"])

        # kubectl get: the Forecast column; describe: the forecast with what blocks it.
        table = subprocess.run(
            crd.kubectl("get", "trainingjobs", "-n", namespace, "-o", "wide"),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        header, *rows = table.splitlines()
        assert "FORECAST" in header and "POSITION" in header
        row = next(r for r in rows if r.startswith("second "))
        assert second["startTime"] in row
        described = subprocess.run(
            crd.kubectl("describe", "trainingjob", "second", "-n", namespace),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "Forecast:" in described and "Blocked By:" in described
        assert "Start Time:" in described

        # The queued Job carries it on the annotation it already has.
        eventually(lambda: "forecast start" in note(crd, namespace, "third"), timeout=60)
        assert "2 of 2 in its queue" in note(crd, namespace, "third")

        # The gauge, per queue.
        url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        line = next(
            entry
            for entry in text.splitlines()
            if entry.startswith("gangshare_forecast_wait_seconds{")
            and f'queue="{queue}"' in entry
            and 'position="last"' in entry
        )
        assert float(line.rsplit(" ", 1)[1]) > 600

        # `gangshare queue` lists them in order, from the kubeconfig.
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "gangshare.cli",
                "queue",
                queue,
                "--kubeconfig",
                crd.state.kubeconfig,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert shown[0].split()[:3] == ["POS", "QUEUE", "WORKLOAD"]
        assert [line.split()[2] for line in shown[1:]] == [
            f"{namespace}/second",
            f"{namespace}/job-third",
        ]
        assert shown[2].split()[3] == "Job"
        by_cohort = subprocess.run(
            [
                sys.executable,
                "-m",
                "gangshare.cli",
                "queue",
                cohort,
                "--cohort",
                "--kubeconfig",
                crd.state.kubeconfig,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"{namespace}/job-third" in by_cohort

        # Once admitted, the forecast is gone from its status.
        admitted = eventually(
            lambda: phase_is(crd, namespace, "second", "Admitted", "Running", "Succeeded"),
            timeout=180,
        )
        assert "forecast" not in admitted
    finally:
        operator.stop()
