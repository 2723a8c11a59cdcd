"""The extender behind the real kube-scheduler (gangshare-scheduler) on KWOK GPU nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gangshare.core.annotations import NODE_UTILIZATION, encode_utilization
from gangshare.core.spec import parse_cluster_spec
from gangshare.kube.nodes import node_manifest
from kube import Kube, eventually, gpu_pod

pytestmark = pytest.mark.e2e


class Pool:
    """Fresh KWOK GPU nodes that only this test's pods can land on (nodeSelector on the pool)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.names: list[str] = []
        self.label = f"p{uuid.uuid4().hex[:6]}"

    def nodes(self, count: int, gpus: int, islands: list[list[int]] | None = None) -> list[str]:
        spec = {
            "nodePools": [
                {
                    "name": self.label,
                    "count": count,
                    "gpusPerNode": gpus,
                    "nvlinkIslands": islands or [],
                }
            ]
        }
        created = []
        for node in parse_cluster_spec(spec):
            if node.name in self.names:
                continue
            self.kube.core.create_node(node_manifest(node))
            created.append(node.name)
        self.names += created
        for name in created:
            eventually(
                lambda n=name: any(
                    c.type == "Ready" and c.status == "True"
                    for c in self.kube.core.read_node(n).status.conditions or []
                ),
                what=f"{name} Ready",
            )
        return created

    def occupy(self, node: str, gpus: list[int]) -> None:
        """A running pod already holding these GPUs (bound directly, with its GPUs recorded)."""
        name = f"holder-{node}-{'-'.join(map(str, gpus))}"
        self.pod(
            name,
            len(gpus),
            node_name=node,
            annotations={"gangshare.io/planned-gpus": ",".join(map(str, gpus))},
        )
        eventually(
            lambda: (
                self.kube.core.read_namespaced_pod(name, self.namespace).status.phase == "Running"
            )
        )

    def pod(
        self,
        name: str,
        gpus: int,
        resource: str = "nvidia.com/gpu",
        node_name: str | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        body = gpu_pod(
            name,
            gpus,
            resource,
            annotations,
            labels,
            scheduler="gangshare-scheduler",
            node_name=node_name,
            node_selector={"gangshare.io/pool": self.label},
        )
        self.kube.core.create_namespaced_pod(self.namespace, body)

    def placements(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """pod -> (node, GPUs) for every bound pod of this test."""
        result = {}
        for pod in self.kube.core.list_namespaced_pod(self.namespace).items:
            planned = (pod.metadata.annotations or {}).get("gangshare.io/planned-gpus")
            if pod.spec.node_name and planned is not None:
                result[pod.metadata.name] = (
                    pod.spec.node_name,
                    tuple(int(g) for g in planned.split(",") if g),
                )
        return result

    def wait_bound(
        self, names: list[str], timeout: float = 60
    ) -> dict[str, tuple[str, tuple[int, ...]]]:
        def all_bound() -> dict[str, tuple[str, tuple[int, ...]]] | None:
            placed = self.placements()
            return placed if all(n in placed for n in names) else None

        return eventually(
            all_bound, timeout=timeout, what=f"{len(names)} pods bound with GPUs recorded"
        )

    def cleanup(self) -> None:
        # Pods first, while KWOK still manages their nodes and finishes their deletion at once.
        self.kube.core.delete_collection_namespaced_pod(self.namespace)
        eventually(
            lambda: not self.kube.core.list_namespaced_pod(self.namespace).items, what="pods gone"
        )
        for name in self.names:
            self.kube.core.delete_node(name)


@pytest.fixture
def pool(kube: Kube, namespace: str) -> Iterator[Pool]:
    created = Pool(kube, namespace)
    yield created
    created.cleanup()


def test_one_gpu_pods_are_packed_best_fit(pool: Pool):
    a, b, c, _d, _e = pool.nodes(5, 4)
    pool.occupy(a, [0])  # 3 free
    pool.occupy(b, [0, 1])  # 2 free
    pool.occupy(c, [3])  # 3 free
    names = [f"one-{i}" for i in range(8)]
    for name in names:
        pool.pod(name, 1)
    placed = pool.wait_bound(names)
    touched = {placed[n][0] for n in names}
    # The 8 pods fill the partly used nodes exactly; both free nodes stay whole.
    assert touched == {a, b, c}
    used = sorted((node, g) for node, gpus in placed.values() for g in gpus)
    assert len(used) == len(set(used)) == 8 + 4


def test_a_four_gpu_pod_gets_one_whole_nvlink_island(pool: Pool):
    x, _y = pool.nodes(2, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    pool.occupy(x, [0])
    pool.pod("island", 4)
    placed = pool.wait_bound(["island"])
    assert placed["island"] == (x, (4, 5, 6, 7))  # best-fit node, the island nobody touched


def test_opportunistic_pods_go_to_the_least_utilized_gpus(pool: Pool, kube: Kube):
    busy, calm = pool.nodes(2, 2)
    for node, report in (
        (busy, {0: (0.9, 20000), 1: (0.8, 20000)}),
        (calm, {0: (0.1, 4000), 1: (0.7, 9000)}),
    ):
        kube.core.patch_node(
            node, {"metadata": {"annotations": {NODE_UTILIZATION: encode_utilization(report, 1)}}}
        )
    memory = {"gangshare.io/gpu-memory-mib": "4096"}
    pool.pod("opp-1", 1, resource="gangshare.io/gpu-share", annotations=memory)
    assert pool.wait_bound(["opp-1"])["opp-1"] == (calm, (0,))
    # The node agent publishes a new picture: now GPU 1 of the calm node is the idlest.
    report = encode_utilization({0: (0.95, 30000), 1: (0.05, 2000)}, 2)
    kube.core.patch_node(calm, {"metadata": {"annotations": {NODE_UTILIZATION: report}}})
    eventually(lambda: kube.core.read_node(calm).metadata.annotations[NODE_UTILIZATION] == report)
    pool.pod("opp-2", 1, resource="gangshare.io/gpu-share", annotations=memory)
    assert pool.wait_bound(["opp-2"])["opp-2"] == (calm, (1,))


def test_fifty_pods_at_once_on_exactly_fifty_free_gpus(pool: Pool):
    pool.nodes(6, 8)
    pool.nodes(7, 2)  # one more node (the 7th) with 2 GPUs: 50 in all
    names = [f"burst-{i}" for i in range(50)]
    for name in names:
        pool.pod(name, 1)
    placed = pool.wait_bound(names, timeout=120)
    used = [(node, gpu) for node, gpus in placed.values() for gpu in gpus]
    assert len(used) == 50 and len(set(used)) == 50, "a GPU index was handed out twice"


def test_rejection_reasons_reach_the_pods_events(pool: Pool, kube: Kube, namespace: str):
    x, _y = pool.nodes(2, 4)
    pool.occupy(x, [0])
    gang = {"gangshare.io/planned-node": x, "gangshare.io/planned-gpus": "0,1"}
    pool.pod("stuck-worker", 2, annotations=gang, labels={"gangshare.io/job": "stuck"})

    def failed_scheduling() -> Any:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=stuck-worker"
        )
        return next((e.message for e in events.items if e.reason == "FailedScheduling"), None)

    message = eventually(failed_scheduling, what="FailedScheduling event")
    assert f"planned GPU 0 on {x} is held by pod:{namespace}/holder-{x}-0" in message
    assert f"gang plan places this worker on {x}" in message
