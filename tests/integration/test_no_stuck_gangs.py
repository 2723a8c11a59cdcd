"""One GPU ledger, and no admitted gang that holds GPUs forever (real control plane, real operator).

Each test reproduces a way today's users and careless tenants got gangs stuck, on nodes of its
own (a GPU model no other node has, selected with spec.gpuModel).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, job_pods, phase_is, status, trainer_status, trainingjob

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(crd: Kube, namespace: str) -> Iterator[NodePool]:
    created = NodePool(crd, namespace)
    yield created
    created.cleanup()


def slow_operator(kube: Kube, tmp_path: Path, *extra: str) -> OperatorProcess:
    """An operator whose pod creation takes seconds: the window between a gang's admission and
    its pods, which another pod can race into."""
    return OperatorProcess(kube, tmp_path, *extra, faults=("--pod-create-delay", "4")).start()


def reasons_of(kube: Kube, namespace: str, name: str) -> set[str]:
    """Reasons of the events about an object (gangshare posts them through events.k8s.io)."""
    listed = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return {e.reason for e in listed.items}


def test_a_bare_pod_bound_past_the_scheduler_displaces_an_unstarted_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    (node,) = pool.nodes(1, 2)
    operator = slow_operator(crd, tmp_path)
    try:
        create(crd, namespace, trainingjob("gang", 1, 2, run_for="2s", gpuModel=pool.model))
        eventually(lambda: phase_is(crd, namespace, "gang", "Admitted"), what="gang admitted")
        # Its worker is not created yet; a pod that skips every scheduler takes the GPUs.
        pool.pod(
            "squatter",
            2,
            node_name=node,
            scheduler="default-scheduler",
            annotations={"gangshare.io/kwok-exit-code": "0", "gangshare.io/kwok-run-for": "4s"},
        )
        requeued = eventually(
            lambda: "GangDisplaced" in reasons_of(crd, namespace, "gang"),
            timeout=30,
            what="the gang released and requeued",
        )
        assert requeued
        done = eventually(
            lambda: phase_is(crd, namespace, "gang", "Succeeded", "Failed"), timeout=90
        )
        assert done["phase"] == "Succeeded" and done["restarts"] == 0
        assert done["attempt"] >= 1  # a new attempt, no retry spent
    finally:
        operator.stop()


def test_a_planned_node_deleted_after_admission_requeues_the_gang_elsewhere(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    first, second = pool.nodes(2, 1)
    operator = slow_operator(crd, tmp_path)
    try:
        create(crd, namespace, trainingjob("moved", 1, 1, run_for="1s", gpuModel=pool.model))
        admitted = eventually(lambda: phase_is(crd, namespace, "moved", "Admitted"))
        planned = admitted["placement"][0]["node"]
        crd.core.delete_node(planned)
        done = eventually(
            lambda: phase_is(crd, namespace, "moved", "Succeeded", "Failed"), timeout=90
        )
        assert done["phase"] == "Succeeded"
        assert done["placement"][0]["node"] == ({first, second} - {planned}).pop()
        assert "GangDisplaced" in reasons_of(crd, namespace, "moved")
    finally:
        operator.stop()


def test_a_worker_that_stays_unschedulable_is_released_within_the_start_deadline(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 2)
    # A long back-off after the release, so the test sees the job waiting in the queue.
    operator = OperatorProcess(
        crd, tmp_path, "--start-timeout", "5", "--backoff-base-seconds", "60"
    ).start()
    try:
        body = trainingjob("needs-volume", 1, 2, exit_code=None, gpuModel=pool.model)
        # A claim that does not exist: nothing the plan can see, kube-scheduler never binds it.
        body["spec"]["template"]["spec"]["volumes"] = [
            {"name": "data", "persistentVolumeClaim": {"claimName": "missing"}}
        ]
        body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "data", "mountPath": "/data"}
        ]
        create(crd, namespace, body)
        eventually(lambda: phase_is(crd, namespace, "needs-volume", "Admitted"))
        started = time.monotonic()

        def released() -> dict[str, Any] | None:
            current = status(crd, namespace, "needs-volume")
            return current if current.get("startFailures") else None

        current = eventually(released, timeout=40, what="the gang released")
        assert time.monotonic() - started < 30
        assert current["phase"] == "Queued" and current.get("placement") is None
        assert "persistentvolumeclaim" in current["message"].lower(), current["message"]
        # The operator writes the status first, deletes the pods, then posts the event.
        eventually(
            lambda: "GangStartTimeout" in reasons_of(crd, namespace, "needs-volume"),
            what="the GangStartTimeout event",
        )
        # Its GPUs are really free: the worker is gone and the node's GPUs are held by nobody.
        eventually(
            lambda: (
                all(p.metadata.deletion_timestamp for p in job_pods(crd, namespace, "needs-volume"))
                or not job_pods(crd, namespace, "needs-volume")
            ),
            what="the stuck worker deleted",
        )
    finally:
        operator.stop()


def test_the_plan_honours_taints_selectors_hostnames_and_cpu(
    crd: Kube, pool: NodePool, namespace: str, operator: OperatorProcess
):
    tainted = pool.nodes(
        1, 2, taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}], suffix="t"
    )[0]
    # Cloud nodes whose hostname label is not the node's name, with CPU for one big worker each.
    small = pool.nodes(2, 2, cpu="8", hostname="ip-10-0-0-7", labels={"zone": "b"}, suffix="s")
    # Tolerates the taint: may land on the tainted node.
    tolerant = trainingjob("tolerant", 1, 2, run_for="1s", gpuModel=pool.model)
    tolerant["spec"]["template"]["spec"].update(
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        nodeSelector={"kubernetes.io/hostname": tainted},
    )
    # Two 6-core workers cannot share an 8-core node: they must go to two nodes.
    heavy = trainingjob("cpu-heavy", 2, 1, run_for="1s", gpuModel=pool.model)
    heavy["spec"]["template"]["spec"]["nodeSelector"] = {"zone": "b"}
    heavy["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "6"}}
    # Without a toleration, the only node it could use is the tainted one: inadmissible.
    intolerant = trainingjob("intolerant", 1, 2, run_for="1s", gpuModel=pool.model)
    intolerant["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": tainted}
    for body in (tolerant, heavy, intolerant):
        create(crd, namespace, body)
    for name in ("tolerant", "cpu-heavy"):
        done = eventually(
            lambda n=name: phase_is(crd, namespace, n, "Succeeded", "Failed"), timeout=60
        )
        assert done["phase"] == "Succeeded", (name, done)
    assert status(crd, namespace, "tolerant")["placement"][0]["node"] == tainted
    nodes = {w["node"] for w in status(crd, namespace, "cpu-heavy")["placement"]}
    assert nodes == set(small)
    waiting = status(crd, namespace, "intolerant")
    assert waiting["phase"] == "Queued"
    inadmissible = next(c for c in waiting["conditions"] if c["type"] == "Inadmissible")
    assert inadmissible["status"] == "True"
    assert "does not tolerate" in inadmissible["message"], inadmissible


def test_an_impossible_job_never_blocks_its_queue_and_priority_is_bounded(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 4)
    operator = OperatorProcess(
        crd, tmp_path, "--ordering", "FIFO", "--max-priority", "*=10"
    ).start()
    try:
        create(crd, namespace, trainingjob("too-wide", 1, 8, gpuModel=pool.model))
        time.sleep(1)  # strictly first in the FIFO lane
        create(crd, namespace, trainingjob("vip", 1, 1, gpuModel=pool.model, priority=50))
        create(crd, namespace, trainingjob("behind", 1, 2, run_for="1s", gpuModel=pool.model))
        done = eventually(lambda: phase_is(crd, namespace, "behind", "Succeeded"), timeout=60)
        assert done
        for name, text in (
            ("too-wide", "can never fit: 1 worker(s) x 8 GPU(s)"),
            ("vip", "spec.priority 50 is above queue default's maximum of 10"),
        ):
            current = status(crd, namespace, name)
            assert current["phase"] == "Queued"
            condition = next(c for c in current["conditions"] if c["type"] == "Inadmissible")
            assert condition["status"] == "True" and text in condition["message"], condition
            assert "Inadmissible" in reasons_of(crd, namespace, name)
        # The cluster grows: the job is judged again and runs.
        pool.nodes(1, 8, suffix="big")
        grown = eventually(
            lambda: phase_is(crd, namespace, "too-wide", "Admitted", "Running", "Succeeded"),
            timeout=30,
        )
        cleared = next(c for c in grown["conditions"] if c["type"] == "Inadmissible")
        assert cleared["status"] == "False"
    finally:
        operator.stop()


def test_a_restart_never_waits_forever_on_pods_stuck_terminating(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    (dead,) = pool.nodes(1, 1, managed=False, suffix="dead")
    operator = OperatorProcess(crd, tmp_path, "--stuck-pod-seconds", "2").start()
    try:
        create(crd, namespace, trainingjob("survivor", 1, 1, run_for="1s", gpuModel=pool.model))
        bound = eventually(
            lambda: next(
                (p for p in job_pods(crd, namespace, "survivor") if p.spec.node_name), None
            ),
            what="worker bound to the node",
        )
        assert bound.spec.node_name == dead
        # Its kubelet starts it, reports once, then the node dies: an admin cordons it.
        crd.core.patch_namespaced_pod_status(
            bound.metadata.name, namespace, {"status": {"phase": "Running"}}
        )
        eventually(lambda: phase_is(crd, namespace, "survivor", "Running"))
        crd.core.patch_node(dead, {"spec": {"unschedulable": True}})
        pool.nodes(1, 1, suffix="fresh")
        # Someone deletes the worker; no kubelet will ever confirm, so it stays Terminating.
        crd.core.delete_namespaced_pod(bound.metadata.name, namespace, grace_period_seconds=1)
        done = eventually(
            lambda: phase_is(crd, namespace, "survivor", "Succeeded", "Failed"), timeout=90
        )
        assert done["phase"] == "Succeeded" and done["restarts"] == 1
        assert done["placement"][0]["node"] != dead
        assert "force-deleted" in operator.logs()
    finally:
        operator.stop()


def test_a_transient_image_pull_error_is_retried_not_failed(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 1, managed=False, suffix="pull")
    operator = OperatorProcess(crd, tmp_path, "--image-pull-grace", "4").start()
    try:
        create(crd, namespace, trainingjob("pulling", 1, 1, gpuModel=pool.model, maxRetries=1))
        bound = eventually(
            lambda: next((p for p in job_pods(crd, namespace, "pulling") if p.spec.node_name), None)
        )
        # What a kubelet reports while the registry times out.
        waiting = {
            "reason": "ErrImagePull",
            "message": "failed to pull image: dial tcp 10.0.0.5:443: i/o timeout",
        }
        crd.core.patch_namespaced_pod_status(
            bound.metadata.name,
            namespace,
            {
                "status": {
                    "phase": "Pending",
                    "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "containerStatuses": [trainer_status({"waiting": waiting})],
                }
            },
        )
        time.sleep(2)  # inside the grace: the kubelet's own retries come first
        assert status(crd, namespace, "pulling")["phase"] == "Admitted"
        restarted = eventually(
            lambda: status(crd, namespace, "pulling").get("lastFailure"), timeout=30
        )
        assert restarted["class"] == "Infrastructure" and restarted["reason"] == "ImagePullFailing"
        assert status(crd, namespace, "pulling")["phase"] in ("Restarting", "Queued", "Admitted")
    finally:
        operator.stop()
