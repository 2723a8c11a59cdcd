"""Queued Jobs hold on every path a TrainingJob's gang does (issue #36 item 2), on the real
control plane: kube-controller-manager's Job controller, kube-scheduler's two profiles, the
admission policies, KWOK nodes and the operator.

- a queued Job may not be resized or moved, nor leave its queue while it runs; one that leaves
  while suspended lets go of its TrainingJob at once;
- a running Job that loses a node (its pod replaced by the Job controller, pinned to the node
  that is gone) is suspended and requeued within seconds, keeping its place, and finishes;
- the default profile preempts other tenants' pods for a pinned pod whose node is full, and
  gangshare's does not: so a queued Job must name gangshare's scheduler;
- a deposed leader's resume or ungate that lands after the new leader wrote is refused.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_batch_jobs import batch_job, job_done, jobs_api, read_job
from test_no_stuck_gangs import reasons_of

from gangshare.core.job import ServiceClass
from gangshare.kube.batchjob import JOB
from gangshare.kube.queued_writes import at_version, resume_body, suspend_patch, ungate_patch
from gangshare.operator.batchapi import BatchApi
from gangshare.operator.kubeapi import Conflict, KubeApi
from kube import Kube, NodePool, OperatorProcess, eventually
from tj import phase_is

pytestmark = pytest.mark.integration


def refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 422, refused.value.body
    return str(json.loads(refused.value.body)["message"])


def test_a_queued_job_keeps_its_shape_and_leaves_its_queue_only_suspended(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
) -> None:
    jobs = jobs_api(crd)
    missing = f"nope-{uuid.uuid4().hex[:5]}"  # no such queue: it waits, queued, for ever
    jobs.create_namespaced_job(namespace, batch_job("held", missing, 2, 1, pool))
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        eventually(
            lambda: phase_is(crd, namespace, "job-held", "Queued"),
            timeout=60,
            what="the Job's TrainingJob queued",
        )
        scale = {"spec": {"parallelism": 4, "completions": 4}}
        message = refusal(lambda: jobs.patch_namespaced_job("held", namespace, scale))
        assert "spec.parallelism: a Job queued by gangshare is one gang of a fixed size" in message
        move = {"spec": {"template": {"spec": {"nodeSelector": {"zone": "elsewhere"}}}}}
        message = refusal(lambda: jobs.patch_namespaced_job("held", namespace, move))
        assert "keeps the nodeSelector, affinity and tolerations it was queued with" in message
        # The label and suspend gone in one update: it would run beside its queue.
        escape = {
            "metadata": {"labels": {"gangshare.io/queue": None}},
            "spec": {"suspend": False},
        }
        message = refusal(lambda: jobs.patch_namespaced_job("held", namespace, escape))
        assert "metadata.labels[gangshare.io/queue]: a Job leaves its gangshare queue only" in (
            message
        )
        assert read_job(crd, namespace, "held").spec.parallelism == 2
        # Leaving while suspended is allowed, and its TrainingJob goes at once.
        left_at = time.monotonic()
        leave = {"metadata": {"labels": {"gangshare.io/queue": None}}}
        jobs.patch_namespaced_job("held", namespace, leave)

        def trainingjob_gone() -> bool:
            try:
                crd.custom.get_namespaced_custom_object(
                    "gangshare.io", "v1alpha1", namespace, "trainingjobs", "job-held"
                )
            except ApiException as err:
                return err.status == 404
            return False

        eventually(trainingjob_gone, timeout=20, what="the TrainingJob of a Job that left")
        print(f"TrainingJob deleted {time.monotonic() - left_at:.1f}s after its Job left")
        assert "LeftQueue" in reasons_of(crd, namespace, "held")
    finally:
        operator.stop()


def test_a_job_that_names_another_scheduler_is_refused_naming_the_field(
    crd: Kube, pool: NodePool, namespace: str
) -> None:
    body = batch_job("default-sched", "default", 1, 1, pool, scheduler=None)
    message = refusal(lambda: jobs_api(crd).create_namespaced_job(namespace, body))
    assert "spec.template.spec.schedulerName: a Job queued by gangshare is placed by " in message
    assert "gangshare-scheduler, which never preempts" in message


def test_a_running_job_that_loses_a_node_is_requeued_within_seconds_and_finishes(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
) -> None:
    nodes = pool.nodes(3, 4)
    jobs = jobs_api(crd)
    jobs.create_namespaced_job(namespace, batch_job("lose", "default", 2, 4, pool, run_for="25s"))
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        eventually(
            lambda: phase_is(crd, namespace, "job-lose", "Running"),
            timeout=60,
            what="the Job running",
        )
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector="gangshare.io/job=job-lose"
        ).items
        victim = next(p for p in pods if p.metadata.labels.get("gangshare.io/rank") == "1")
        lost = victim.spec.node_name
        assert lost in nodes
        # The node is lost: deleted, its pod gone with it (as the pod garbage collector does).
        lost_at = time.monotonic()
        crd.core.delete_node(lost)
        crd.core.delete_namespaced_pod(victim.metadata.name, namespace, grace_period_seconds=0)

        def released() -> str | None:
            found = reasons_of(crd, namespace, "job-lose") & {"GangDisplaced", "GangUnschedulable"}
            return next(iter(found), None)

        reason = eventually(released, timeout=30, what="the broken running gang released")
        took = time.monotonic() - lost_at
        print(f"running Job that lost a node released ({reason}) {took:.1f}s after the loss")
        assert took < 20, took
        # The release is written on the TrainingJob first, the Job suspended just after.
        eventually(
            lambda: read_job(crd, namespace, "lose").spec.suspend is True,
            timeout=10,
            what="the Job suspended",
        )
        done = eventually(
            lambda: phase_is(crd, namespace, "job-lose", "Succeeded", "Failed"),
            timeout=120,
            what="the requeued Job finished",
        )
        assert done["phase"] == "Succeeded", done
        assert done.get("attempt", 0) >= 1
        assert all(w["node"] != lost for w in done["placement"]), done["placement"]
        assert job_done(crd, namespace, "lose") == "Complete"
    finally:
        operator.stop()


def _priority_class(kube: Kube, name: str, value: int) -> None:
    api = client.SchedulingV1Api(kube.core.api_client)
    body = client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value)
    try:
        api.create_priority_class(body)
    except ApiException as err:
        if err.status != 409:
            raise


def _cpu_pod(name: str, node: str, cpu: str, priority: str, scheduler: str) -> dict[str, Any]:
    pinned = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"gangshare.io/kwok-run-for": "600s"},
        },
        "spec": {
            "schedulerName": scheduler,
            "priorityClassName": priority,
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": pinned}
            },
            "containers": [
                {
                    "name": "c",
                    "image": "example.invalid/cpu:1",
                    "resources": {"requests": {"cpu": cpu}},
                }
            ],
        },
    }


def test_the_default_profile_preempts_for_a_pinned_pod_and_gangshares_does_not(
    crd: Kube, pool: NodePool, namespace: str
) -> None:
    """Why a queued Job must name gangshare's scheduler: its pods are pinned to their planned
    node, and a node briefly full makes the default profile evict other tenants' pods."""
    (node,) = pool.nodes(1, 1, cpu="4")
    _priority_class(crd, "gs-test-low", 10)
    _priority_class(crd, "gs-test-high", 1000)
    core = crd.core

    def running(name: str) -> bool:
        pod = core.read_namespaced_pod(name, namespace)
        return pod.status.phase == "Running"

    def filler(name: str) -> None:
        core.create_namespaced_pod(
            namespace, _cpu_pod(name, node, "3", "gs-test-low", "default-scheduler")
        )
        eventually(lambda: running(name), timeout=30, what=f"{name} running on {node}")

    def gone(name: str) -> bool:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            return err.status == 404
        return pod.metadata.deletion_timestamp is not None

    # gangshare's profile: the pinned pod waits, the other tenant's pod runs on.
    filler("tenant-a")
    core.create_namespaced_pod(
        namespace, _cpu_pod("pinned-gs", node, "2", "gs-test-high", "gangshare-scheduler")
    )
    eventually(
        lambda: any(
            c.type == "PodScheduled" and c.status == "False"
            for c in core.read_namespaced_pod("pinned-gs", namespace).status.conditions or []
        ),
        timeout=30,
        what="gangshare's profile refusing the pinned pod",
    )
    time.sleep(3)
    assert not gone("tenant-a") and running("tenant-a")
    core.delete_namespaced_pod("pinned-gs", namespace, grace_period_seconds=0)

    # The default profile: the same pinned pod evicts the other tenant's.
    core.create_namespaced_pod(
        namespace, _cpu_pod("pinned-default", node, "2", "gs-test-high", "default-scheduler")
    )
    eventually(lambda: gone("tenant-a"), timeout=30, what="the default profile preempting")


def test_a_resume_or_ungate_delayed_past_a_takeover_is_refused(
    crd: Kube, pool: NodePool, namespace: str
) -> None:
    """A deposed leader's write that passed its fence and arrives after the new leader wrote
    the object: refused by the API server, since it carries the version it was decided from."""

    jobs = jobs_api(crd)
    jobs.create_namespaced_job(namespace, batch_job("late", "default", 1, 1, pool))
    deposed = BatchApi(KubeApi(crd.core.api_client))
    seen = deposed.get(JOB, namespace, "late")
    assert seen is not None
    # The new leader writes the Job first (it suspends it again, under a note of its own).
    new_leader = BatchApi(KubeApi(crd.core.api_client))
    body = {**suspend_patch(), "metadata": {"annotations": {"gangshare.io/status": "Queued: x"}}}
    new_leader.patch(JOB, namespace, "late", body)
    with pytest.raises(Conflict):
        deposed.patch(JOB, namespace, "late", at_version(resume_body(0), seen))
    assert read_job(crd, namespace, "late").spec.suspend is True

    gated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated"},
        "spec": {
            "schedulerName": "gangshare-scheduler",
            "schedulingGates": [{"name": "gangshare.io/gang"}],
            "containers": [{"name": "c", "image": "example.invalid/x:1"}],
        },
    }
    crd.core.create_namespaced_pod(namespace, gated)
    pod = crd.core.api_client.sanitize_for_serialization(
        crd.core.read_namespaced_pod("gated", namespace)
    )
    crd.core.patch_namespaced_pod("gated", namespace, {"metadata": {"labels": {"seen": "new"}}})
    patch = ungate_patch(pod, 0, 0, (pool.label, [0]), ServiceClass.GUARANTEED, None)
    with pytest.raises(Conflict):
        deposed.patch_pod(namespace, "gated", patch)
    assert crd.core.read_namespaced_pod("gated", namespace).spec.scheduling_gates
