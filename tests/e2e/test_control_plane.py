"""The local control plane is real: kube-scheduler binds GPU pods to KWOK nodes, which run them."""

from __future__ import annotations

import subprocess

import pytest
from kubernetes import client

from kube import Kube, eventually, gpu_pod

pytestmark = pytest.mark.e2e


def test_nodes_carry_gpu_capacity_and_topology(kube: Kube):
    nodes = {n.metadata.name: n for n in kube.core.list_node().items}
    assert sorted(nodes) == ["a100-0", "a100-1", "h100-0", "h100-1", "h100-2", "h100-3"]
    h100 = nodes["h100-0"]
    assert h100.status.capacity["nvidia.com/gpu"] == "8"
    assert h100.status.allocatable["gangshare.io/gpu-share"] == "32"
    assert h100.metadata.labels["gangshare.io/rack"] == "rack-a"
    assert (
        '"nvlinkIslands":[[0,1,2,3],[4,5,6,7]]'
        in h100.metadata.annotations["gangshare.io/gpu-topology"]
    )
    assert all(
        any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
        for n in nodes.values()
    )


def test_kubectl_sees_the_simulated_gpu_nodes(kube: Kube):
    out = subprocess.run(
        kube.kubectl(
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,GPU:.status.capacity.nvidia\\.com/gpu",
        ),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out[:2] == ["NAME", "GPU"]
    assert dict(zip(out[2::2], out[3::2], strict=True))["a100-0"] == "4"


def test_gpu_pod_is_scheduled_by_kube_scheduler_and_runs(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, gpu_pod("two-gpus", 2))

    def running() -> client.V1Pod | None:
        pod = kube.core.read_namespaced_pod("two-gpus", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = eventually(running, what="pod Running")
    node = kube.core.read_node(pod.spec.node_name)
    assert int(node.status.allocatable["nvidia.com/gpu"]) >= 2
    assert pod.status.pod_ip

    def scheduled_event() -> bool:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=two-gpus"
        )
        # kube-scheduler reports through events.k8s.io, which names it as the reporting component.
        return any(
            e.reason == "Scheduled" and e.reporting_component == "default-scheduler"
            for e in events.items
        )

    eventually(scheduled_event, what="Scheduled event from default-scheduler")


def test_pod_larger_than_any_node_stays_pending_with_a_reason(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, gpu_pod("sixteen-gpus", 16))

    def unschedulable() -> str | None:
        pod = kube.core.read_namespaced_pod("sixteen-gpus", namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return str(condition.message)
        return None

    assert "Insufficient nvidia.com/gpu" in eventually(
        unschedulable, what="Unschedulable condition"
    )


@pytest.mark.parametrize(("code", "phase"), [("0", "Succeeded"), ("3", "Failed")])
def test_marked_pods_finish_with_their_exit_code(kube: Kube, namespace: str, code: str, phase: str):
    marker = {"gangshare.io/kwok-exit-code": code, "gangshare.io/kwok-run-for": "1s"}
    kube.core.create_namespaced_pod(namespace, gpu_pod("finisher", 1, annotations=marker))

    def finished() -> client.V1Pod | None:
        pod = kube.core.read_namespaced_pod("finisher", namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = eventually(finished, what=f"pod {phase}")
    assert pod.status.phase == phase
    assert pod.status.container_statuses[0].state.terminated.exit_code == int(code)


def test_deleted_pods_go_away(kube: Kube, namespace: str):
    kube.core.create_namespaced_pod(namespace, gpu_pod("doomed", 1))
    eventually(lambda: kube.core.read_namespaced_pod("doomed", namespace).status.phase == "Running")
    kube.core.delete_namespaced_pod("doomed", namespace)

    def gone() -> bool:
        return all(
            p.metadata.name != "doomed" for p in kube.core.list_namespaced_pod(namespace).items
        )

    eventually(gone, what="pod deleted")
