"""Plain pod groups on the real control plane: pods labelled gangshare.io/queue and
gangshare.io/pod-group, annotated gangshare.io/pod-group-size, queued and admitted as one gang
once all of them exist (kube/podgroup.py). Each test shows the group admitted whole with its
plan honoured pod by pod, held back while incomplete, refused when its pods disagree on its
size, reclaimed (each pod replaced by a gated copy) and resumed whole, and ended by its pods'
own completion; the API server refuses a member made ungated (crds/pod-group-policy.yaml).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from borrowing import reclaimed_and_resumed
from kubernetes.client.exceptions import ApiException
from test_unlike_pod_sets import assert_plan_honoured

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import get, phase_is

pytestmark = pytest.mark.integration


def member(
    name: str,
    group: str,
    size: int,
    pool: NodePool,
    gpus: int = 2,
    queue: str = "default",
    run_for: str = "3s",
    gated: bool = True,
) -> dict[str, Any]:
    resources = (
        {"limits": {"nvidia.com/gpu": str(gpus)}}
        if gpus
        else {"requests": {"cpu": "500m", "memory": "256Mi"}}
    )
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "schedulerName": "gangshare-scheduler",
        "nodeSelector": {"gangshare.io/pool": pool.label},
        "containers": [{"name": "c", "image": "example.invalid/train:1", "resources": resources}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": "gangshare.io/gang"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"gangshare.io/queue": queue, "gangshare.io/pod-group": group},
            "annotations": {
                "gangshare.io/pod-group-size": str(size),
                "gangshare.io/kwok-exit-code": "0",
                "gangshare.io/kwok-run-for": run_for,
            },
        },
        "spec": spec,
    }


def make(kube: Kube, namespace: str, *pods: dict[str, Any]) -> None:
    for pod in pods:
        kube.core.create_namespaced_pod(namespace, pod)


def test_a_pod_group_waits_until_whole_then_runs_as_one_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(2, 4)
    group = "g" + uuid.uuid4().hex[:5]
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        # Two GPU workers of three pods: not queued while its coordinator is missing.
        make(crd, namespace, member("w-0", group, 3, pool), member("w-1", group, 3, pool))
        time.sleep(4)
        with pytest.raises(ApiException) as missing:
            get(crd, namespace, f"podgroup-{group}")
        assert missing.value.status == 404
        make(crd, namespace, member("coord", group, 3, pool, gpus=0))
        done = eventually(
            lambda: phase_is(crd, namespace, f"podgroup-{group}", "Succeeded", "Failed"),
            timeout=120,
            what="the pod group's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        record = get(crd, namespace, f"podgroup-{group}")
        assert (record["spec"]["workers"], record["spec"]["gpusPerWorker"]) == (2, 2)
        assert [(g["replicas"], g["gpus"]) for g in record["spec"]["replicaGroups"]] == [(1, 0)]
        pods = assert_plan_honoured(crd, namespace, f"podgroup-{group}", done)
        ranks = {p.metadata.name: int(p.metadata.labels["gangshare.io/rank"]) for p in pods}
        # The GPU workers first, by name; the CPU-only coordinator after them.
        assert ranks == {"w-0": 0, "w-1": 1, "coord": 2}
    finally:
        operator.stop()


def test_a_pod_group_whose_pods_disagree_on_its_size_is_refused_on_its_pods(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 8)
    group = "bad" + uuid.uuid4().hex[:5]
    make(crd, namespace, member("a", group, 2, pool), member("b", group, 3, pool))
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        note = eventually(
            lambda: crd.core.read_namespaced_pod("a", namespace).metadata.annotations.get(
                "gangshare.io/status"
            ),
            timeout=60,
            what="the refusal noted on the pods",
        )
        assert "gangshare.io/pod-group-size" in note and "disagree" in note, note
        assert "a says 2" in note and "b says 3" in note, note
        # The event is posted after the note (one more request): waited for, not raced.
        eventually(
            lambda: any(
                e.reason == "InvalidSpec"
                for e in crd.core.list_namespaced_event(
                    namespace, field_selector="involvedObject.name=a"
                ).items
            ),
            timeout=30,
            what="an InvalidSpec event on pod a",
        )
        # Refused, nothing runs: both pods still wait behind the gate.
        for name in ("a", "b"):
            gates = crd.core.read_namespaced_pod(name, namespace).spec.scheduling_gates
            assert [g.name for g in gates or []] == ["gangshare.io/gang"]
    finally:
        operator.stop()


def test_a_borrowing_pod_group_is_replaced_by_gated_copies_and_resumed_whole(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    group = "lend" + uuid.uuid4().hex[:4]

    def submit(queue: str) -> None:
        make(
            crd,
            namespace,
            *(member(f"p-{i}", group, 2, pool, gpus=4, queue=queue, run_for="8s") for i in (0, 1)),
        )

    _, last = reclaimed_and_resumed(
        crd, pool, namespace, tmp_path, queues, submit, f"podgroup-{group}"
    )
    # The resumed attempt ran whole, as gated copies of the tenant's pods (new names, each
    # from its original's).
    assert sorted(int(p.metadata.labels["gangshare.io/rank"]) for p in last) == [0, 1]
    originals = sorted(p.metadata.annotations["gangshare.io/pod-group-member"] for p in last)
    assert originals == ["p-0", "p-1"]
    assert all(p.metadata.name.startswith(("p-0-", "p-1-")) for p in last)


def test_the_api_server_refuses_an_ungated_member(crd: Kube, pool: NodePool, namespace: str):
    with pytest.raises(ApiException) as refused:
        crd.core.create_namespaced_pod(namespace, member("eager", "g", 1, pool, gated=False))
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.schedulingGates: a pod of a gangshare pod group" in message
