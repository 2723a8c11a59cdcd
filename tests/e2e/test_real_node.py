"""A real kubelet node beside the control plane runs real containers (host network, local image)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_config import REAL_NODE_LABEL
from gangshare.dev.realnode_image import IMAGE
from gangshare.kube.nodes import KWOK_NODE_ANNOTATION
from kube import Kube, eventually

pytestmark = pytest.mark.e2e


def real_pod(
    name: str, command: list[str], resources: client.V1ResourceRequirements | None = None
) -> client.V1Pod:
    """A pod only the real node takes: it tolerates the node's taint and selects its label."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            host_network=True,
            node_selector={REAL_NODE_LABEL: "true"},
            tolerations=[
                client.V1Toleration(
                    key=REAL_NODE_LABEL, operator="Equal", value="true", effect="NoSchedule"
                )
            ],
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="main",
                    image=IMAGE,
                    image_pull_policy="Never",
                    command=command,
                    resources=resources,
                )
            ],
        ),
    )


def finished(kube: Kube, namespace: str, name: str) -> client.V1Pod:
    def done() -> client.V1Pod | None:
        pod = kube.core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod: client.V1Pod = eventually(done, timeout=60, what=f"pod {name} finished")
    return pod


def test_real_node_is_tainted_labelled_and_not_kwoks(kube: Kube, real_node: RealNode):
    node = kube.core.read_node(real_node.name)
    assert node.metadata.labels[REAL_NODE_LABEL] == "true"
    assert KWOK_NODE_ANNOTATION not in (node.metadata.annotations or {})
    assert any(
        t.key == REAL_NODE_LABEL and t.value == "true" and t.effect == "NoSchedule"
        for t in node.spec.taints or []
    )
    assert node.status.node_info.kubelet_version == "v1.35.4"


def test_pod_runs_a_real_container_and_its_output_is_read_back(
    kube: Kube, real_node: RealNode, namespace: str
):
    kube.core.create_namespaced_pod(
        namespace, real_pod("hello", ["sh", "-c", "echo hello-from-$(hostname)-node"])
    )
    pod = finished(kube, namespace, "hello")
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.spec.node_name == real_node.name
    # Host network: the container sees the machine's own hostname.
    hostname = Path("/proc/sys/kernel/hostname").read_text().strip()
    assert real_node.container_log(namespace, "hello", "main") == f"hello-from-{hostname}-node\n"


def test_the_kubelet_applies_the_pod_memory_limit(kube: Kube, real_node: RealNode, namespace: str):
    limits = {"memory": "64Mi", "cpu": "250m"}
    # cgroup v1: runc mounts the container's own cgroups there.
    files = ["/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"]
    kube.core.create_namespaced_pod(
        namespace,
        real_pod(
            "limited",
            ["cat", *files],
            client.V1ResourceRequirements(requests=limits, limits=limits),
        ),
    )
    pod = finished(kube, namespace, "limited")
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.status.qos_class == "Guaranteed"
    assert real_node.container_log(namespace, "limited", "main").split() == ["67108864", "25000"]
