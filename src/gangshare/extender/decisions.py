"""Filter, prioritize and bind decisions for one pod, on the extender's cluster cache (pure).

Gang pods (planned by the operator) may go only to their planned node and only
while their planned GPUs are not held by anyone else. Every other GPU pod goes
through the core's own filter, score and GPU choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import (
    JOB_LABEL,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    AnnotationError,
    decode_gpu_indices,
)
from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import Cluster
from gangshare.core.fit import filter_worker
from gangshare.core.job import ServiceClass, TopologyPolicy, WorkerRequest
from gangshare.core.score import score_worker, to_extender_score
from gangshare.kube.snapshot import pod_gpu_request

NOT_A_GPU_NODE = "no GPUs known to gangshare on this node"


class NodeMemo:
    """Per-node answers for one request shape, valid while the node's version is unchanged.

    Between two scheduling requests only the nodes that changed need work again,
    which is what keeps filter and prioritize cheap on thousands of nodes.
    """

    MAX_SHAPES = 64

    def __init__(self) -> None:
        self._tables: dict[tuple[str, WorkerRequest], dict[str, tuple[int, Any]]] = {}

    def table(self, kind: str, request: WorkerRequest) -> dict[str, tuple[int, Any]]:
        key = (kind, request)
        found = self._tables.get(key)
        if found is None:
            if len(self._tables) >= self.MAX_SHAPES:
                self._tables.clear()
            found = self._tables[key] = {}
        return found


class BadPod(ValueError):
    """A pod whose gangshare annotations cannot be read; the message names the annotation."""


@dataclass(frozen=True)
class PodAsk:
    owner: str
    request: WorkerRequest
    planned_node: str | None = None
    planned_gpus: tuple[int, ...] | None = None

    @property
    def gang(self) -> bool:
        return self.planned_node is not None and self.planned_gpus is not None


def pod_owner(namespace: str, name: str) -> str:
    return f"pod:{namespace}/{name}"


def pod_ask(pod: dict[str, Any]) -> PodAsk | None:
    """What a pod asks for; None for a pod that requests no GPUs."""
    asked = pod_gpu_request(pod)
    if asked is None:
        return None
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    memory = annotations.get(POD_GPU_MEMORY)
    try:
        memory_mib = int(memory) if memory else None
    except ValueError:
        raise BadPod(f"{POD_GPU_MEMORY}: expected MiB as an integer, got {memory!r}") from None
    service_class, count = asked
    request = WorkerRequest(
        count,
        service_class,
        gpu_memory_mib=memory_mib if service_class is ServiceClass.OPPORTUNISTIC else None,
        island_policy=TopologyPolicy.PREFERRED,
    )
    owner = pod_owner(meta.get("namespace", "default"), meta.get("name", ""))
    planned_node = annotations.get(POD_PLANNED_NODE)
    if (
        planned_node
        and (meta.get("labels") or {}).get(JOB_LABEL)
        and POD_PLANNED_GPUS in annotations
    ):
        try:
            gpus = decode_gpu_indices(POD_PLANNED_GPUS, annotations[POD_PLANNED_GPUS])
        except AnnotationError as err:
            raise BadPod(str(err)) from None
        if len(gpus) != count:
            raise BadPod(
                f"{POD_PLANNED_GPUS}: plans {len(gpus)} GPU(s) but the pod requests {count}"
            )
        return PodAsk(owner, request, planned_node, gpus)
    return PodAsk(owner, request)


def _planned_gpus_problem(cluster: Cluster, ask: PodAsk) -> str | None:
    node = cluster.node(ask.planned_node or "")
    for index in ask.planned_gpus or ():
        if index >= node.gpu_count:
            return f"planned GPU {index} does not exist on {node.name}"
        gpu = node.gpus[index]
        if not gpu.gpu.healthy:
            return f"planned GPU {index} on {node.name} is unhealthy"
        holder = gpu.guaranteed
        if ask.request.guaranteed and holder is not None and holder.owner != ask.owner:
            return f"planned GPU {index} on {node.name} is held by {holder.worker}"
    return None


def filter_nodes(
    cluster: Cluster, ask: PodAsk, names: list[str], memo: NodeMemo | None = None
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(passed, failed, unresolvable) with a reason for every node that did not pass."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    nodes = cluster.nodes
    if ask.gang:
        planned = ask.planned_node or ""
        elsewhere = f"gang plan places this worker on {planned}"
        for name in names:
            if name != planned:
                unresolvable[name] = elsewhere
            elif name not in nodes:
                unresolvable[name] = NOT_A_GPU_NODE
            elif (problem := _planned_gpus_problem(cluster, ask)) is not None:
                failed[name] = problem
            else:
                passed.append(name)
        return passed, failed, unresolvable
    table = memo.table("filter", ask.request) if memo is not None else None
    for name in names:
        node = nodes.get(name)
        if node is None:
            unresolvable[name] = NOT_A_GPU_NODE
            continue
        hit = table.get(name) if table is not None else None
        if hit is not None and hit[0] == node.version:
            rejection = hit[1]
        else:
            rejection = filter_worker(node, ask.request)
            if table is not None:
                table[name] = (node.version, rejection)
        if rejection is None:
            passed.append(name)
        elif rejection.resolvable:
            failed[name] = rejection.reason
        else:
            unresolvable[name] = rejection.reason
    return passed, failed, unresolvable


def prioritize_nodes(
    cluster: Cluster, ask: PodAsk, names: list[str], memo: NodeMemo | None = None
) -> list[tuple[str, int]]:
    if ask.gang:
        return [(name, 10 if name == ask.planned_node else 0) for name in names]
    nodes = cluster.nodes
    table = memo.table("score", ask.request) if memo is not None else None
    scores = []
    for name in names:
        node = nodes.get(name)
        if node is None:
            scores.append((name, 0))
            continue
        hit = table.get(name) if table is not None else None
        if hit is not None and hit[0] == node.version:
            score = hit[1]
        else:
            score = to_extender_score(score_worker(node, ask.request))
            if table is not None:
                table[name] = (node.version, score)
        scores.append((name, score))
    return scores


def gpus_for_bind(cluster: Cluster, ask: PodAsk, node_name: str) -> tuple[int, ...] | str:
    """The GPU indices the pod gets on the node, or the reason it gets none."""
    if node_name not in cluster.nodes:
        return f"{node_name}: {NOT_A_GPU_NODE}"
    if ask.gang:
        if node_name != ask.planned_node:
            return f"gang plan places this worker on {ask.planned_node}, not {node_name}"
        problem = _planned_gpus_problem(cluster, ask)
        return problem if problem is not None else tuple(ask.planned_gpus or ())
    chosen = choose_gpus(cluster.node(node_name), ask.request)
    if chosen is None:
        rejection = filter_worker(cluster.node(node_name), ask.request)
        return rejection.reason if rejection else f"no GPUs left on {node_name} for this pod"
    return chosen
