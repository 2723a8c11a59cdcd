"""Reservations that hold on every path, on the real control plane (kube-scheduler, extender,
KWOK, the real operator): GPUs a sidecar holds, kube-scheduler's own preemption, priority
classes a template names, partial gangs, and a gang's start through the barrier.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from test_no_stuck_gangs import reasons_of

from gangshare.kube.snapshot import parse_time
from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, job_pods, phase_is, status, trainingjob

pytestmark = pytest.mark.integration


@pytest.fixture
def priority_classes(crd: Kube) -> Iterator[Any]:
    """Creates PriorityClasses with names unique to the test; deletes them after."""
    api = client.SchedulingV1Api(crd.api_client)
    suffix = uuid.uuid4().hex[:5]
    made: list[str] = []

    def make(name: str, value: int) -> str:
        full = f"{name}-{suffix}"
        api.create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name=full), value=value)
        )
        made.append(full)
        return full

    yield make
    for name in made:
        api.delete_priority_class(name)


def bare_pod(
    pool: NodePool,
    name: str,
    gpus: int = 0,
    sidecar_gpus: int = 0,
    priority_class: str | None = None,
    node: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A tenant's own pod on the pool: GPUs on its container, on a native sidecar, or none."""
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": "gangshare-scheduler",
        "nodeSelector": {"gangshare.io/pool": pool.label},
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "i", "resources": {"limits": limits}}],
    }
    if sidecar_gpus:
        spec["initContainers"] = [
            {
                "name": "sidecar",
                "image": "i",
                "restartPolicy": "Always",
                "resources": {"limits": {"nvidia.com/gpu": str(sidecar_gpus)}},
            }
        ]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "labels": labels or {}}
    pool.kube.core.create_namespaced_pod(pool.namespace, {"metadata": meta, "spec": spec})
    return spec


def test_gpus_a_sidecar_holds_are_never_planned_for_a_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    (node,) = pool.nodes(1, 8)
    bare_pod(pool, "with-sidecar", sidecar_gpus=4)
    assert pool.wait_bound(["with-sidecar"])["with-sidecar"][0] == node
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        # Four GPUs are left, and counted as four: the 1x4 gang runs beside the sidecar...
        create(crd, namespace, trainingjob("fits", 1, 4, run_for="1s", gpuModel=pool.model))
        create(crd, namespace, trainingjob("whole", 1, 8, run_for="1s", gpuModel=pool.model))
        eventually(lambda: phase_is(crd, namespace, "fits", "Succeeded"), timeout=60)
        # ...and the 1x8 is never planned onto the sidecar's GPUs (it would fail kube-scheduler's
        # NodeResourcesFit, time out, and be planned there again, forever).
        time.sleep(3)
        waiting = status(crd, namespace, "whole")
        assert waiting["phase"] == "Queued" and not waiting.get("startFailures"), waiting
        assert "GangStartTimeout" not in reasons_of(crd, namespace, "whole")
        crd.core.delete_namespaced_pod("with-sidecar", namespace, grace_period_seconds=0)
        done = eventually(lambda: phase_is(crd, namespace, "whole", "Succeeded"), timeout=60)
        assert done["attempt"] == 0  # admitted once, when the GPUs were really free
    finally:
        operator.stop()


def test_kube_schedulers_own_preemption_never_deletes_a_tenants_pod(
    crd: Kube, pool: NodePool, namespace: str, priority_classes: Any
):
    """A pod whose priorityClassName outranks a running pod that holds the GPUs it needs:
    preemption is the operator's (gang-aware, by queue), never kube-scheduler's."""
    high = priority_classes("gs-high", 1_000_000)
    (node,) = pool.nodes(1, 8)
    bare_pod(pool, "in-quota", gpus=8)
    pool.wait_bound(["in-quota"])
    bare_pod(pool, "urgent", gpus=1, priority_class=high)

    def refused() -> str | None:
        events = crd.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=urgent"
        )
        return next((e.message for e in events.items if e.reason == "FailedScheduling"), None)

    assert "Insufficient nvidia.com/gpu" in eventually(refused, what="urgent refused")
    time.sleep(3)  # kube-scheduler's preemption would have nominated and evicted by now
    victim = crd.core.read_namespaced_pod("in-quota", namespace)
    assert victim.metadata.deletion_timestamp is None and victim.spec.node_name == node
    urgent = crd.core.read_namespaced_pod("urgent", namespace)
    assert urgent.spec.node_name is None and not urgent.status.nominated_node_name


def test_a_templates_priority_class_is_bounded_by_its_queue(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any, priority_classes: Any
):
    pool.nodes(1, 2)
    team = queues("team", maxPriority=1000)
    high, low = priority_classes("gs-high", 1_000_000), priority_classes("gs-low", 100)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        for name, klass in (("above", high), ("missing", "no-such-class"), ("within", low)):
            body = trainingjob(name, 1, 1, run_for="1s", queue=team, gpuModel=pool.model)
            body["spec"]["template"]["spec"]["priorityClassName"] = klass
            create(crd, namespace, body)
        assert eventually(lambda: phase_is(crd, namespace, "within", "Succeeded"), timeout=60)
        for name, text in (
            ("above", f"PriorityClass {high} (value 1000000) is above queue {team}'s maximum"),
            ("missing", "PriorityClass no-such-class does not exist"),
        ):

            def inadmissible(name: str = name) -> dict[str, Any] | None:
                found = [
                    c
                    for c in status(crd, namespace, name).get("conditions") or []
                    if c["type"] == "Inadmissible" and c["status"] == "True"
                ]
                return found[0] if found else None

            condition = eventually(inadmissible, what=f"{name} inadmissible")
            assert "spec.template.spec.priorityClassName" in condition["message"]
            assert text in condition["message"], condition["message"]
            assert job_pods(crd, namespace, name) == []
    finally:
        operator.stop()


def bound_at(pod: Any) -> float | None:
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "True":
            return cond.last_transition_time.timestamp()
    return None


def test_a_partial_gang_is_released_within_seconds(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    """A worker kube-scheduler refuses for a reason the plan does not model (pod anti-affinity
    here) while its sibling is bound and running: the whole gang gives its GPUs back within
    seconds, not at the 120 s start deadline."""
    _first, second = pool.nodes(2, 8)
    marker = f"blocker-{uuid.uuid4().hex[:5]}"
    bare_pod(pool, "blocker", node=second, labels={marker: "yes"})
    body = trainingjob("split", 2, 8, exit_code=None, gpuModel=pool.model)
    body["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {marker: "yes"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    operator = OperatorProcess(crd, tmp_path, "--backoff-base-seconds", "60").start()
    try:
        create(crd, namespace, body)

        def one_bound() -> float | None:
            times = [t for p in job_pods(crd, namespace, "split") if (t := bound_at(p))]
            return min(times) if times else None

        started = eventually(one_bound, timeout=60, what="the first worker bound")

        def released() -> dict[str, Any] | None:
            current = status(crd, namespace, "split")
            return current if current.get("startFailures") else None

        current = eventually(released, timeout=40, what="the partial gang released")
        took = time.time() - started
        assert took < 15, f"released {took:.1f}s after its first worker was bound"
        assert current["phase"] == "Queued" and current.get("placement") is None
        assert "cannot be placed on its planned node" in current["message"], current["message"]
        assert "anti-affinity" in current["message"], current["message"]
        eventually(
            lambda: "GangUnschedulable" in reasons_of(crd, namespace, "split"),
            what="the GangUnschedulable event",
        )
    finally:
        operator.stop()


def test_a_gang_the_barrier_refused_starts_whole_within_seconds(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    """16 one-GPU workers: their gates come off side by side, kube-scheduler filters the first
    ones while siblings are still gated, and the extender refuses them at once; the operator
    nudges each refused worker once every gate is off, and the gang binds in seconds."""
    pool.nodes(2, 8)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        create(crd, namespace, trainingjob("wide", 16, 1, run_for="30s", gpuModel=pool.model))

        def lifted_at() -> float | None:
            for cond in status(crd, namespace, "wide").get("conditions") or []:
                if cond["type"] == "GangScheduled" and cond["status"] == "True":
                    return parse_time(cond["lastTransitionTime"])
            return None

        lifted = eventually(lifted_at, timeout=60, what="the gang's gates lifted")

        def all_bound() -> float | None:
            pods = job_pods(crd, namespace, "wide")
            times = [bound_at(p) for p in pods]
            return max(times) if len(pods) == 16 and all(times) else None  # type: ignore[type-var]

        last = eventually(all_bound, timeout=60, what="every worker bound")
        assert last - lifted < 10, f"the last worker bound {last - lifted:.1f}s after the lift"
        assert phase_is(crd, namespace, "wide", "Admitted", "Running")
    finally:
        operator.stop()
