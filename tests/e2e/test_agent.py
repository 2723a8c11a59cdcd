"""The node agent on a real kubelet: the device plugin's choice is what the container gets, the
kubelet's PodResources and the pod's `gangshare.io/assigned-gpus` agree, health reaches
allocatable, and neither an agent SIGKILL nor a kubelet restart loses an assignment.

The GPUs are the fake NVML backend's (no GPU on this machine); everything else is real:
kubelet v1.35.4, containerd, runc, real containers, real gRPC on the kubelet's sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_process import AgentProcess, allow_privileged_templates, real_node_job
from kubernetes import client

from gangshare.agent.podresources import PodResourcesClient
from gangshare.core.annotations import (
    NODE_UTILIZATION,
    POD_ASSIGNED_GPUS,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    decode_node,
)
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_config import REAL_NODE_LABEL
from gangshare.dev.realnode_image import IMAGE
from kube import Kube, OperatorProcess, eventually

pytestmark = pytest.mark.e2e

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"
MODEL = "Fake-GPU-16GB"


def spec(failures: list[dict[str, Any]] | None = None) -> str:
    """Four fake GPUs; only GPUs 1 and 2 share an NVLink island."""
    pool: dict[str, Any] = {
        "name": "real",
        "gpusPerNode": 4,
        "gpuModel": MODEL,
        "gpuMemoryMiB": 16384,
        "nvlinkIslands": [[1, 2]],
        "fake": {"utilization": [{"at": 0, "gpus": {0: {"sm": 0.3, "memoryUsedMiB": 512}}}]},
    }
    if failures:
        pool["fake"]["failures"] = failures
    return yaml.safe_dump({"nodePools": [pool]})


def allocatable(kube: Kube, node: RealNode) -> dict[str, str]:
    status = kube.core.read_node(node.name).status
    return {r: (status.allocatable or {}).get(r, "0") for r in (GPU, SHARE)}


def node_annotations(kube: Kube, node: RealNode) -> dict[str, str]:
    return kube.core.read_node(node.name).metadata.annotations or {}


@pytest.fixture
def agent(kube: Kube, real_node: RealNode, tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(kube, real_node, tmp_path, spec()).start()
    try:
        eventually(process.registered, timeout=30, what="the agent registered")
        eventually(
            lambda: allocatable(kube, real_node) == {GPU: "4", SHARE: "16"},
            timeout=60,
            what="the agent's GPUs allocatable on the real node",
        )
        yield process
    finally:
        process.stop()
        print(process.logs()[-4000:])


def gpu_pod(
    name: str,
    resource: str,
    count: int,
    script: str,
    annotations: dict[str, str] | None = None,
) -> client.V1Pod:
    """A pod only the real node takes (its taint tolerated, its label selected)."""
    limits = {resource: str(count)}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations or {}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            host_network=True,
            termination_grace_period_seconds=1,
            automount_service_account_token=False,
            node_selector={REAL_NODE_LABEL: "true"},
            tolerations=[client.V1Toleration(key=REAL_NODE_LABEL, operator="Exists")],
            containers=[
                client.V1Container(
                    name="main",
                    image=IMAGE,
                    image_pull_policy="Never",
                    command=["sh", "-c", script],
                    resources=client.V1ResourceRequirements(limits=limits, requests=limits),
                )
            ],
        ),
    )


PRINT_AND_WAIT = 'echo "visible=$NVIDIA_VISIBLE_DEVICES"; exec sleep 600'


def printed(node: RealNode, namespace: str, pod: str) -> str:
    """What the container printed as its visible devices, once it did."""

    def line() -> str | None:
        text = node.container_log(namespace, pod, "main")
        return text.split("visible=", 1)[1].split("\n", 1)[0] if "visible=" in text else None

    result: str = eventually(line, timeout=60, what=f"{pod} printed its visible devices")
    return result


def assigned(kube: Kube, namespace: str, pod: str) -> str:
    def read() -> str | None:
        meta = kube.core.read_namespaced_pod(pod, namespace).metadata
        return (meta.annotations or {}).get(POD_ASSIGNED_GPUS)

    result: str = eventually(read, timeout=30, what=f"{POD_ASSIGNED_GPUS} on {pod}")
    return result


def kubelet_devices(node: RealNode, namespace: str, pod: str) -> dict[str, tuple[str, ...]]:
    held = PodResourcesClient(node.pod_resources_socket).list().get((namespace, pod))
    return dict(held.devices) if held else {}


def uuids(kube: Kube, node: RealNode) -> list[str]:
    annotations = node_annotations(kube, node)
    state = decode_node(node.name, {}, annotations)
    assert state is not None
    return [g.gpu.uuid for g in state.gpus]


def test_the_agent_publishes_its_gpus_and_the_kubelet_offers_them(
    kube: Kube, real_node: RealNode, agent: AgentProcess
):
    node = kube.core.read_node(real_node.name)
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.product"] == MODEL and labels["nvidia.com/gpu.count"] == "4"
    state = decode_node(real_node.name, labels, node.metadata.annotations)
    assert state is not None and state.islands == ((0,), (1, 2), (3,))
    assert [g.gpu.memory_mib for g in state.gpus] == [16384] * 4
    eventually(lambda: NODE_UTILIZATION in node_annotations(kube, real_node), what="utilization")
    # Published utilization reaches the node model the extender and operator use.
    again = decode_node(real_node.name, labels, node_annotations(kube, real_node))
    assert again is not None and again.gpus[0].utilization == pytest.approx(0.3)


def test_a_pod_gets_exactly_the_gpus_the_plugin_preferred_and_all_three_records_agree(
    kube: Kube, real_node: RealNode, agent: AgentProcess, namespace: str
):
    kube.core.create_namespaced_pod(namespace, gpu_pod("two", GPU, 2, PRINT_AND_WAIT))
    visible = printed(real_node, namespace, "two").split(",")
    gpus = uuids(kube, real_node)
    # Only GPUs 1 and 2 share an island: the core's choice, as GetPreferredAllocation said.
    assert agent.preferred(GPU)[-1] == [gpus[1], gpus[2]]
    assert visible == [gpus[1], gpus[2]]
    assert sorted(kubelet_devices(real_node, namespace, "two")[GPU]) == sorted(visible)
    assert assigned(kube, namespace, "two") == "1,2"


def test_share_slots_of_one_pod_land_on_distinct_idle_gpus_of_one_island(
    kube: Kube, real_node: RealNode, agent: AgentProcess, namespace: str
):
    kube.core.create_namespaced_pod(namespace, gpu_pod("shares", SHARE, 2, PRINT_AND_WAIT))
    visible = printed(real_node, namespace, "shares").split(",")
    gpus = uuids(kube, real_node)
    # GPU 0 is the busy one (30 % SM in the fake): the least-loaded pair in one island is 1, 2.
    assert visible == [gpus[1], gpus[2]]
    slots = kubelet_devices(real_node, namespace, "shares")[SHARE]
    assert sorted(s.split("::")[0] for s in slots) == sorted(visible)
    assert assigned(kube, namespace, "shares") == "1,2"


def test_an_assignment_that_differs_from_the_plan_is_recorded_and_named_in_an_event(
    kube: Kube, real_node: RealNode, agent: AgentProcess, namespace: str
):
    kube.core.create_namespaced_pod(namespace, gpu_pod("one", GPU, 1, PRINT_AND_WAIT))
    assert assigned(kube, namespace, "one") == "0"  # the tightest island for one GPU
    # A plan the kubelet can no longer honour (GPU 0 is taken): the truth wins, and says so.
    kube.core.create_namespaced_pod(
        namespace, gpu_pod("planned", GPU, 2, PRINT_AND_WAIT, {POD_PLANNED_GPUS: "0,3"})
    )
    assert assigned(kube, namespace, "planned") == "1,2"

    def mismatch() -> list[Any]:
        events = kube.core.list_namespaced_event(namespace).items
        return [
            e
            for e in events
            if e.reason == "GpuAssignmentDiffersFromPlan" and e.involved_object.name == "planned"
        ]

    [event] = eventually(mismatch, what="GpuAssignmentDiffersFromPlan event")
    assert event.type == "Warning"
    assert "the kubelet assigned GPUs 1,2; the plan recorded 0,3" in event.message


def test_a_bare_pod_takes_the_gpus_a_gang_worker_not_bound_yet_is_planned_on_last(
    kube: Kube, real_node: RealNode, agent: AgentProcess, namespace: str
):
    # An admitted gang's worker, still gated: its plan holds this node's only NVLink pair.
    plan = {POD_PLANNED_NODE: real_node.name, POD_PLANNED_GPUS: "1,2"}
    waiting = gpu_pod("w-worker-0", GPU, 2, PRINT_AND_WAIT, plan)
    waiting.metadata.labels = {
        "gangshare.io/job": "w",
        "gangshare.io/rank": "0",
        "gangshare.io/attempt": "0",
    }
    waiting.spec.scheduling_gates = [client.V1PodSchedulingGate(name="gangshare.io/admission")]
    kube.core.create_namespaced_pod(namespace, waiting)
    # kube-scheduler binds a bare pod beside it; alone, 1,2 would be the core's choice for two
    # GPUs (test_a_pod_gets_exactly_the_gpus_the_plugin_preferred...), so the plan would break.
    kube.core.create_namespaced_pod(namespace, gpu_pod("bare", GPU, 2, PRINT_AND_WAIT))
    assert assigned(kube, namespace, "bare") == "0,3"
    assert kube.core.read_namespaced_pod("w-worker-0", namespace).spec.node_name is None


def test_an_opportunistic_trainingjob_runs_to_succeeded_on_the_real_node(
    crd: Kube, real_node: RealNode, agent: AgentProcess, namespace: str, tmp_path: Path
):
    kube = crd
    allow_privileged_templates(kube, namespace)
    operator = OperatorProcess(kube, tmp_path).start()
    try:
        script = 'echo "visible=$NVIDIA_VISIBLE_DEVICES cap=$GANGSHARE_MEMORY_CAP_MIB"'
        body = real_node_job("opp", "Opportunistic", MODEL, IMAGE, ["sh", "-c", script])
        kube.custom.create_namespaced_custom_object(
            "gangshare.io", "v1alpha1", namespace, "trainingjobs", body
        )

        def phase() -> str | None:
            job = kube.custom.get_namespaced_custom_object(
                "gangshare.io", "v1alpha1", namespace, "trainingjobs", "opp"
            )
            current = (job.get("status") or {}).get("phase")
            return current if current in ("Succeeded", "Failed") else None

        assert eventually(phase, timeout=120, what="TrainingJob opp finished") == "Succeeded"
    finally:
        operator.stop()
    worker = kube.core.read_namespaced_pod("opp-worker-0", namespace)
    assert worker.spec.node_name == real_node.name
    annotations = worker.metadata.annotations
    planned, got = annotations[POD_PLANNED_GPUS], assigned(kube, namespace, "opp-worker-0")
    # The plan steered the kubelet's choice, so plan and truth agree.
    assert got == planned
    line = real_node.container_log(namespace, "opp-worker-0", "main")
    gpus = uuids(kube, real_node)
    assert line.strip() == f"visible={gpus[int(got)]} cap=4096"


def test_a_gpu_that_fails_leaves_allocatable_and_is_published_unhealthy(
    kube: Kube, real_node: RealNode, agent: AgentProcess
):
    agent.rewrite_spec(spec(failures=[{"gpu": 3, "xid": 79}]))
    eventually(
        lambda: allocatable(kube, real_node) == {GPU: "3", SHARE: "12"},
        timeout=30,
        what="GPU 3 out of allocatable",
    )

    # The kubelet's allocatable and the agent's Node annotation are two writers' records; the
    # agent tells the kubelet first (ListAndWatch), then publishes on its next pass.
    def published_health() -> list[bool] | None:
        state = decode_node(real_node.name, {}, node_annotations(kube, real_node))
        return None if state is None else [g.gpu.healthy for g in state.gpus]

    eventually(
        lambda: published_health() == [True, True, True, False],
        timeout=30,
        what="GPU 3 published unhealthy",
    )
    assert "GPU 3 marked unhealthy: XID 79" in agent.logs()


def test_an_agent_killed_mid_run_loses_no_assignment(
    kube: Kube, real_node: RealNode, agent: AgentProcess, namespace: str
):
    kube.core.create_namespaced_pod(namespace, gpu_pod("first", GPU, 1, PRINT_AND_WAIT))
    first = assigned(kube, namespace, "first")
    held = kubelet_devices(real_node, namespace, "first")
    agent.kill()
    # Say the agent died before it could write: the restarted one must rebuild from the kubelet.
    kube.core.patch_namespaced_pod(
        "first", namespace, {"metadata": {"annotations": {POD_ASSIGNED_GPUS: None}}}
    )
    agent.start()
    eventually(agent.registered, timeout=30, what="the restarted agent registered")
    assert assigned(kube, namespace, "first") == first
    # The restarted agent hands out nothing that is still held.
    kube.core.create_namespaced_pod(namespace, gpu_pod("second", GPU, 1, PRINT_AND_WAIT))
    second = assigned(kube, namespace, "second")
    assert second != first
    assert kubelet_devices(real_node, namespace, "first") == held
    assert kube.core.read_namespaced_pod("first", namespace).status.phase == "Running"
    eventually(
        lambda: allocatable(kube, real_node) == {GPU: "4", SHARE: "16"}, what="GPUs offered again"
    )


def test_a_restarted_kubelet_gets_the_plugins_registered_again(
    kube: Kube, real_node: RealNode, agent: AgentProcess
):
    real_node.restart_kubelet()
    # The Node keeps the old allocatable until the new kubelet reports: wait for the agent's
    # second registration first, or a stale status would pass before anything re-registered.
    eventually(
        lambda: agent.logs().count(f"registered {GPU} with the kubelet") >= 2,
        timeout=60,
        what="the agent registered again with the restarted kubelet",
    )
    eventually(
        lambda: allocatable(kube, real_node) == {GPU: "4", SHARE: "16"},
        timeout=60,
        what="GPUs allocatable after the kubelet restarted",
    )
