"""Shape advice on the real control plane (the operator, kube-scheduler with the extender,
KWOK): two 8-GPU nodes, each half held by a job predicted to run four hours. A 1x8 gang
waits for a whole node; its author allows 2x4, which fits now. With spec.reshape: Advise
(the default) the operator only says so (status.forecast.advice, describe, a ShapeAdvised
event); with Admit it takes that shape and the gang runs as two 4-GPU workers, one per node."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import GROUP, PLURAL, VERSION, create, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
FOUR_HOURS = 4 * 3600
SLOT = "gangshare-test/slot"


def holder(name: str, slot: str, queue: str, model: str) -> dict[str, Any]:
    body = trainingjob(
        name, 1, 4, run_for="600s", queue=queue, gpuModel=model, runtimeEstimateSeconds=FOUR_HOURS
    )
    body["spec"]["template"]["spec"]["nodeSelector"] = {SLOT: slot}
    return body


def wide(name: str, queue: str, model: str, reshape: str) -> dict[str, Any]:
    body = trainingjob(
        name, 1, 8, run_for="5s", queue=queue, gpuModel=model, runtimeEstimateSeconds=600
    )
    body["spec"]["shapes"] = [{"workers": 2, "gpusPerWorker": 4}]
    body["spec"]["reshape"] = reshape
    return body


def test_a_gang_is_advised_a_shape_that_starts_now_and_with_the_opt_in_runs_in_it(
    crd: Kube, pool: NodePool, namespace: str, queues: Any, tmp_path: Path
):
    queue = queues("shapes")
    pool.nodes(1, 8, labels={SLOT: "a"})
    pool.nodes(1, 8, labels={SLOT: "b"}, suffix="-b")
    model = pool.model
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        for name, slot in (("hold-a", "a"), ("hold-b", "b")):
            create(crd, namespace, holder(name, slot, queue, model))
        for name in ("hold-a", "hold-b"):
            eventually(lambda n=name: phase_is(crd, namespace, n, "Running"), timeout=60)

        create(crd, namespace, wide("advised", queue, model, "Advise"))

        def advice_of(name: str) -> dict[str, Any] | None:
            return (status(crd, namespace, name).get("forecast") or {}).get("advice")

        told = eventually(lambda: advice_of("advised"), timeout=60, what="shape advice")
        assert (told["workers"], told["gpusPerWorker"]) == (2, 4)
        assert told["message"].startswith("as 2x4 it would start now instead of in about 4 h")
        assert "ShapeAdvised" in reasons_of(crd, namespace, "advised")
        described = subprocess.run(
            crd.kubectl("describe", "trainingjob", "advised", "-n", namespace),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "Advice:" in described and "as 2x4 it would start now" in described
        # Advise never changes the shape: it still waits for a whole node.
        assert phase_is(crd, namespace, "advised", "Queued") is not None
        assert "reshapedTo" not in status(crd, namespace, "advised")
        crd.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "advised")

        create(crd, namespace, wide("taken", queue, model, "Admit"))
        done = eventually(
            lambda: phase_is(crd, namespace, "taken", "Succeeded"),
            timeout=120,
            what="the gang run in the advised shape",
        )
        assert done["reshapedTo"] == {"workers": 2, "gpusPerWorker": 4}
        assert {"Reshaped"} <= reasons_of(crd, namespace, "taken")
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector="gangshare.io/job=taken"
        ).items
        assert len(pods) == 2
        for pod in pods:
            limits = pod.spec.containers[0].resources.limits or {}
            assert limits.get("nvidia.com/gpu") == "4", pod.metadata.name
        # One worker per half-free node: the plan honoured pod by pod.
        assert sorted(p.spec.node_name for p in pods) == sorted(pool.names)
        placed = {(p["rank"], p["node"]) for p in done["placement"]}
        assert placed == {
            (int(p.metadata.labels["gangshare.io/rank"]), p.spec.node_name) for p in pods
        }
        # Its workers ran as 2x4 by the opt-in: once admitted, the author cannot take it back.
        with pytest.raises(ApiException) as refused:
            crd.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "taken", {"spec": {"reshape": "Advise"}}
            )
        assert refused.value.status == 422
        assert "spec.shapes and spec.reshape are immutable" in refused.value.body
    finally:
        operator.stop()
