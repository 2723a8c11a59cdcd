"""A requeued gang's worker takes back its name as soon as the old pod is gone.

Worker names are the same across attempts, so the next attempt's worker can be created only
once the old one's deletion is complete. A kubelet ends an evicted pod in two steps: it
reports the pod's final phase (Failed, exit 143), then deletes it for good. The operator's
pod watch follows live pods only, so the first step is the last event it hears; the second
must still wake the gang at once, not at the backstop resync 30 s later.

The old worker runs on a node no kubelet manages, so the test plays its kubelet: it reports
the final phase and completes the deletion when it chooses, and times the new worker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gangshare.core.annotations import POD_EVICTED
from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, status, trainer_status, trainingjob

pytestmark = pytest.mark.integration

WORKER = "relay-worker-0"
GRACE_SECONDS = 30


def _operator_env() -> dict[str, str]:
    # GANGSHARE_OPERATOR_PYTHONPATH runs another tree's operator against this test (how the
    # delay was measured before the fix).
    other = os.environ.get("GANGSHARE_OPERATOR_PYTHONPATH")
    return {"PYTHONPATH": other} if other else {}


def _worker(kube: Kube, namespace: str) -> Any | None:
    try:
        return kube.core.read_namespaced_pod(WORKER, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_the_next_attempts_worker_is_created_within_seconds_of_the_old_ones_deletion(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    [unmanaged] = pool.nodes(1, 1, managed=False)
    operator = OperatorProcess(crd, tmp_path, env=_operator_env()).start()
    try:
        create(crd, namespace, trainingjob("relay", 1, 1, exit_code=None, gpuModel=pool.model))
        first = eventually(
            lambda: (w := _worker(crd, namespace)) is not None and w.spec.node_name and w,
            timeout=60,
            what="the first attempt's worker bound",
        )
        assert first.spec.node_name == unmanaged
        # Room for the next attempt while the old worker still holds its GPU.
        pool.nodes(1, 1, suffix="m")
        # Evicted as the node agent evicts: the reason on the pod, then a DELETE with grace.
        evicted = {POD_EVICTED: json.dumps({"message": "over its GPU memory cap"})}
        crd.core.patch_namespaced_pod(WORKER, namespace, {"metadata": {"annotations": evicted}})
        crd.core.delete_namespaced_pod(WORKER, namespace, grace_period_seconds=GRACE_SECONDS)
        eventually(
            lambda: (
                (s := status(crd, namespace, "relay")).get("attempt") == 1
                and s.get("phase") == "Admitted"
            ),
            timeout=30,
            what="the next attempt admitted",
        )
        time.sleep(1.0)  # its reconciles find the name taken
        # The kubelet's two steps: the final phase (the pod leaves the operator's watch)...
        terminated = {"terminated": {"exitCode": 143, "reason": "Error"}}
        crd.core.patch_namespaced_pod_status(
            WORKER,
            namespace,
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [trainer_status(terminated)],
                }
            },
        )
        time.sleep(1.0)
        old = _worker(crd, namespace)
        assert old is not None and old.metadata.uid == first.metadata.uid, "taken too early"
        # ...then the deletion for good.
        crd.core.delete_namespaced_pod(
            WORKER,
            namespace,
            body={"gracePeriodSeconds": 0, "preconditions": {"uid": first.metadata.uid}},
        )
        gone = time.monotonic()
        assert _worker(crd, namespace) is None, "the old worker outlived its deletion"
        renewed = eventually(
            lambda: (w := _worker(crd, namespace)) is not None and w,
            timeout=60,
            interval=0.05,
            what="the next attempt's worker created",
        )
        delay = time.monotonic() - gone
        print(f"next attempt's worker created {delay:.2f}s after the old one was gone")
        assert renewed.metadata.labels["gangshare.io/attempt"] == "1"
        assert delay < 5.0, f"{delay:.1f}s between the old worker's deletion and the new one"
    finally:
        operator.stop()
    logs = operator.logs()
    assert "scheduling pass failed" not in logs, logs[-3000:]
