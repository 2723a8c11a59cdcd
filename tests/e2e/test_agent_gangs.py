"""Gang workers on a real kubelet: identical siblings each get a planned NVLink island, and the
kubelet's own checkpoint (by pod UID) is what the agent reads the assignment back from.

The GPUs are the fake NVML backend's; the kubelet (v1.35.4), containerd and the containers
are real. The kubelet never says which pod it allocates for: two workers of one gang asking
for the same four GPUs on one node cannot be told apart, and need not be.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_process import AgentProcess
from kubernetes import client
from test_agent import gpu_pod

from gangshare.agent.checkpoint import CHECKPOINT_NAME, parse_device_checkpoint
from gangshare.core.annotations import (
    POD_ASSIGNED_GPUS,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    decode_node,
)
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_image import IMAGE
from kube import Kube, eventually

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
ISLANDS = ((0, 1, 2, 3), (4, 5, 6, 7))


def eight_gpus_one_busy() -> str:
    """Two NVLink islands of four; GPU 1 runs hot (a busy neighbour's, say)."""
    pool: dict[str, Any] = {
        "name": "real",
        "gpusPerNode": 8,
        "gpuModel": "Fake-GPU-80GB",
        "gpuMemoryMiB": 81920,
        "nvlinkIslands": [list(i) for i in ISLANDS],
        "fake": {"utilization": [{"at": 0, "gpus": {1: {"sm": 0.95, "memoryUsedMiB": 40000}}}]},
    }
    return yaml.safe_dump({"nodePools": [pool]})


@pytest.fixture
def agent(crd: Kube, real_node: RealNode, tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(crd, real_node, tmp_path, eight_gpus_one_busy()).start()
    try:
        eventually(process.registered, timeout=30, what="the agent registered")

        def eight() -> bool:
            status = crd.core.read_node(real_node.name).status
            return (status.allocatable or {}).get(GPU) == "8"

        eventually(eight, timeout=60, what="eight GPUs allocatable on the real node")
        yield process
    finally:
        process.stop()
        print(process.logs()[-4000:])


def trainingjob(kube: Kube, namespace: str, name: str) -> str:
    """The TrainingJob the workers belong to (no operator runs: it only owns them, so the
    garbage collector leaves them be). Returns its uid."""
    body = {
        "apiVersion": "gangshare.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": 2,
            "gpusPerWorker": 4,
            "topology": {"policy": "Required", "scope": "NVLink"},
            "template": {"spec": {"containers": [{"name": "main", "image": IMAGE}]}},
        },
    }
    made = kube.custom.create_namespaced_custom_object(
        "gangshare.io", "v1alpha1", namespace, "trainingjobs", body
    )
    return str(made["metadata"]["uid"])


def worker(job: str, uid: str, rank: int, node: str, plan: tuple[int, ...]) -> client.V1Pod:
    """A gang worker as the operator makes it (name, labels, controller, plan), already bound
    to the real node, so the kubelet admits both workers together."""
    annotations = {POD_PLANNED_NODE: node, POD_PLANNED_GPUS: ",".join(map(str, plan))}
    pod = gpu_pod(f"{job}-worker-{rank}", GPU, 4, "exec sleep 600", annotations)
    pod.metadata.labels = {
        "gangshare.io/job": job,
        "gangshare.io/rank": str(rank),
        "gangshare.io/attempt": "0",
    }
    pod.metadata.owner_references = [
        client.V1OwnerReference(
            api_version="gangshare.io/v1alpha1",
            kind="TrainingJob",
            name=job,
            uid=uid,
            controller=True,
        )
    ]
    pod.spec.node_name = node
    return pod


def assigned(kube: Kube, namespace: str, pod: str) -> tuple[int, ...]:
    def read() -> str | None:
        meta = kube.core.read_namespaced_pod(pod, namespace).metadata
        return (meta.annotations or {}).get(POD_ASSIGNED_GPUS)

    raw: str = eventually(read, timeout=60, what=f"{POD_ASSIGNED_GPUS} on {pod}")
    return tuple(sorted(int(i) for i in raw.split(",")))


@pytest.mark.parametrize("run", [1, 2, 3])
def test_two_identical_workers_of_one_gang_each_get_a_whole_nvlink_island(
    crd: Kube, real_node: RealNode, agent: AgentProcess, namespace: str, run: int
):
    kube = crd
    job = f"island-{run}"
    uid = trainingjob(kube, namespace, job)
    for rank, plan in enumerate(ISLANDS):
        kube.core.create_namespaced_pod(namespace, worker(job, uid, rank, real_node.name, plan))
    got = {assigned(kube, namespace, f"{job}-worker-{rank}") for rank in range(2)}
    # Either worker may hold either island; neither is spread over both (by load, the
    # busy GPU 1 would have made one [0, 2, 3, 4]).
    assert got == set(ISLANDS), agent.logs()[-3000:]
    # The kubelet's own record, by pod UID, is what the agent matched the assignment with.
    checkpoint = parse_device_checkpoint(
        (real_node.device_plugin_dir / CHECKPOINT_NAME).read_bytes()
    )
    uuids = agent_uuids(kube, real_node)
    for rank in range(2):
        pod = kube.core.read_namespaced_pod(f"{job}-worker-{rank}", namespace)
        held = checkpoint[pod.metadata.uid][GPU]
        assert held == {uuids[i] for i in assigned(kube, namespace, pod.metadata.name)}
    for rank in range(2):
        kube.core.delete_namespaced_pod(f"{job}-worker-{rank}", namespace)
    eventually(
        lambda: not kube.core.list_namespaced_pod(namespace).items,
        timeout=60,
        what="workers gone",
    )


def agent_uuids(kube: Kube, node: RealNode) -> list[str]:
    annotations = kube.core.read_node(node.name).metadata.annotations or {}
    state = decode_node(node.name, {}, annotations)
    assert state is not None
    return [g.gpu.uuid for g in state.gpus]
