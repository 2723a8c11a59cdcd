"""Queues that lend and reclaim, on the real control plane (kube-scheduler + extender, KWOK).

Two queues in a cohort: one idle, the other borrows its GPUs; the idle queue's job arrives,
the borrower's gang is evicted whole and requeued, the lender's job starts, the borrower
finishes later. A job that can never be admitted does not block the queue behind it, and a
job naming a queue that does not exist waits with a condition that says so.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_no_stuck_gangs import reasons_of

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, job_pods, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
GROUP, VERSION = "gangshare.io", "v1alpha1"


def queue_status(kube: Kube, name: str) -> dict[str, Any]:
    obj = kube.custom.get_cluster_custom_object(GROUP, VERSION, "queues", name)
    return obj.get("status") or {}


def condition(current: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in current.get("conditions") or [] if c["type"] == kind), None)


def test_an_idle_queue_lends_and_takes_its_quota_back(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    pool.nodes(1, 8)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=8, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        create(
            crd,
            namespace,
            trainingjob("borrower-job", 1, 8, run_for="15s", queue=borrower, gpuModel=pool.model),
        )
        running = eventually(
            lambda: phase_is(crd, namespace, "borrower-job", "Running"),
            timeout=60,
            what="the borrower's gang running on the idle queue's quota",
        )
        assert running["serviceClass"] == "Opportunistic" and running["borrowed"] is True
        assert "AdmittedBorrowing" in reasons_of(crd, namespace, "borrower-job")
        shown = eventually(
            lambda: queue_status(crd, borrower).get("borrowedGPUs") == 8 or None,
            what="the borrower queue's status counting its borrowed GPUs",
        )
        assert shown
        table = subprocess.run(
            crd.kubectl("get", "queues", borrower), capture_output=True, text=True, check=True
        ).stdout.splitlines()
        at = table[0].index("BORROWED")  # columns by position: "IN USE" holds a space
        assert table[1][at:].split()[0] == "8", table
        pods = job_pods(crd, namespace, "borrower-job")
        limits = pods[0].spec.containers[0].resources.limits
        assert limits.get("gangshare.io/gpu-share") == "8", limits

        create(
            crd,
            namespace,
            trainingjob("lender-job", 1, 8, run_for="3s", queue=lender, gpuModel=pool.model),
        )
        requeued = eventually(
            lambda: (status(crd, namespace, "borrower-job").get("preemptions") or 0) >= 1 or None,
            timeout=60,
            what="the borrower's gang evicted and requeued",
        )
        assert requeued
        # Events are posted after the status write they explain, so they may trail it a little.
        assert eventually(
            lambda: "Preempted" in reasons_of(crd, namespace, "borrower-job") or None,
            what="the borrower's Preempted event",
        )
        lent = eventually(
            lambda: phase_is(crd, namespace, "lender-job", "Running", "Succeeded"),
            timeout=60,
            what="the lender's job started on its own quota",
        )
        assert lent.get("serviceClass") == "Guaranteed" and not lent.get("borrowed")
        done = eventually(
            lambda: phase_is(crd, namespace, "borrower-job", "Succeeded", "Failed"),
            timeout=120,
            what="the borrower finished later",
        )
        assert done["phase"] == "Succeeded" and done["preemptions"] >= 1
        assert done["restarts"] == 0  # a reclaim is not the job's failure
        assert phase_is(crd, namespace, "lender-job", "Succeeded")
    finally:
        operator.stop()


def test_an_inadmissible_job_does_not_block_its_queue_and_a_missing_queue_is_named(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    pool.nodes(1, 4)
    small = queues("small", jobSizes={"maxGPUs": 2})
    operator = OperatorProcess(crd, tmp_path, "--ordering", "FIFO").start()
    try:
        create(crd, namespace, trainingjob("too-big", 1, 4, queue=small, gpuModel=pool.model))
        eventually(
            lambda: phase_is(crd, namespace, "too-big", "Queued"),
            timeout=90,  # the operator's first pass, on a busy machine
            what="the big job queued",
        )
        create(
            crd,
            namespace,
            trainingjob("fits", 1, 2, run_for="1s", queue=small, gpuModel=pool.model),
        )
        create(
            crd, namespace, trainingjob("nowhere", 1, 1, queue="no-such-queue", gpuModel=pool.model)
        )
        assert eventually(
            lambda: phase_is(crd, namespace, "fits", "Succeeded"),
            timeout=60,
            what="the job behind an inadmissible one ran",
        )
        big = status(crd, namespace, "too-big")
        refused = condition(big, "Inadmissible")
        assert big["phase"] == "Queued" and refused and refused["status"] == "True", big
        assert f"queue {small} accepts jobs of at most 2 GPUs" in refused["message"], refused

        def named() -> dict[str, Any] | None:
            found = condition(status(crd, namespace, "nowhere"), "Inadmissible")
            return found if found and found["status"] == "True" else None

        missing = eventually(named, what="the missing queue named in a condition")
        assert missing["reason"] == "QueueNotFound", missing
        assert "queue no-such-queue does not exist" in missing["message"], missing
        assert status(crd, namespace, "nowhere")["phase"] == "Queued"
        head = eventually(
            lambda: queue_status(crd, small).get("headJob") or None,
            what="the small queue's status naming its head",
        )
        assert head == f"{namespace}/too-big"
    finally:
        operator.stop()
