"""Filter, prioritize and bind decisions for one pod, on the extender's ledger (pure).

A gang worker (a pod the operator created for an admitted TrainingJob, checked
against the job itself) may go only to the node its job's status plans, and only
while the planned GPUs are not held by anyone else. A pod that claims to be a
worker but has no plan behind it is never placed. Every other GPU pod goes
through the core's own filter, score and GPU choice; annotations a pod carries
never reserve anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import POD_GPU_MEMORY
from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import Cluster
from gangshare.core.fit import filter_worker
from gangshare.core.job import ServiceClass, TopologyPolicy, WorkerRequest
from gangshare.core.score import score_worker, to_extender_score
from gangshare.kube.claims import gpu_request, pod_owner, worker_identity
from gangshare.kube.ledger import Ledger

NOT_A_GPU_NODE = "no GPUs known to gangshare on this node"
# Ties at the best score are all equally good to gangshare; a few let kube-scheduler's own
# scores (affinity, spreading) choose among them without a long answer to parse.
MAX_BEST_NODES = 16
# Scores this close to the best are the best (sums of the same terms in another order).
TIE = 1e-9


class BadPod(ValueError):
    """A pod whose gangshare annotations cannot be read; the message names the annotation."""


@dataclass(frozen=True)
class PodAsk:
    owner: str
    request: WorkerRequest
    planned_node: str | None = None
    planned_gpus: tuple[int, ...] | None = None
    # The ledger's owner of the plan (job/rank); a planned GPU it holds is this pod's own.
    holder: str | None = None
    # A pod that says it is a gang worker, with no plan behind it: why it is not placed.
    unplanned: str | None = None

    @property
    def gang(self) -> bool:
        return self.unplanned is not None or (
            self.planned_node is not None and self.planned_gpus is not None
        )


def pod_ask(pod: dict[str, Any], ledger: Ledger) -> PodAsk | None:
    """What a pod asks for; None for a pod that requests no GPUs."""
    asked = gpu_request(pod)
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
    who = worker_identity(pod)
    if who is None:
        return PodAsk(owner, request)
    hold = ledger.current_hold(who)
    plan = hold.plan_of(who.rank) if hold is not None else None
    if hold is None or plan is None:
        return PodAsk(
            owner,
            request,
            unplanned=f"TrainingJob {who.job} holds no plan for worker {who.rank} "
            f"of attempt {who.attempt} (yet)",
        )
    node, gpus = plan
    if len(gpus) != count:
        raise BadPod(f"planned {len(gpus)} GPU(s) for worker {who.rank}, the pod requests {count}")
    return PodAsk(owner, request, node, gpus, hold.rank_owner(who.rank))


def _planned_gpus_problem(cluster: Cluster, ask: PodAsk) -> str | None:
    node = cluster.node(ask.planned_node or "")
    for index in ask.planned_gpus or ():
        if index >= node.gpu_count:
            return f"planned GPU {index} does not exist on {node.name}"
        gpu = node.gpus[index]
        if not gpu.gpu.healthy:
            return f"planned GPU {index} on {node.name} is unhealthy"
        holder = gpu.guaranteed
        if ask.request.guaranteed and holder is not None and holder.owner != ask.holder:
            return f"planned GPU {index} on {node.name} is held by {holder.worker}"
    return None


def filter_nodes(
    cluster: Cluster, ask: PodAsk, names: list[str]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(passed, failed, unresolvable) with a reason for every node that did not pass, judged
    name by name: a gang worker's filter, and the reference for verdicts.ShapeVerdicts."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    nodes = cluster.nodes
    if ask.unplanned is not None:
        return [], dict.fromkeys(names, ask.unplanned), {}
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
    for name in names:
        node = nodes.get(name)
        if node is None:
            unresolvable[name] = NOT_A_GPU_NODE
            continue
        rejection = filter_worker(node, ask.request)
        if rejection is None:
            passed.append(name)
        elif rejection.resolvable:
            failed[name] = rejection.reason
        else:
            unresolvable[name] = rejection.reason
    return passed, failed, unresolvable


def _scores(cluster: Cluster, ask: PodAsk, names: list[str]) -> list[tuple[str, float]]:
    """The core's 0..1 score of each named node (0 for a node gangshare does not know)."""
    nodes = cluster.nodes
    return [
        (name, score_worker(nodes[name], ask.request) if name in nodes else 0.0) for name in names
    ]


def best_nodes(cluster: Cluster, ask: PodAsk, passed: list[str]) -> list[str]:
    """The passed nodes gangshare would pick, so filter alone decides and kube-scheduler
    needs no prioritize call: one HTTP round trip per pod less. A gang worker's one planned
    node stays as it is."""
    if ask.gang or len(passed) <= 1:
        return passed
    scores = _scores(cluster, ask, passed)
    top = max(score for _, score in scores)
    return [name for name, score in scores if score >= top - TIE][:MAX_BEST_NODES]


def first_holding(
    cluster: Cluster, ask: PodAsk, best: list[str]
) -> tuple[str, tuple[int, ...]] | None:
    """The one node (of gangshare's best) a pod gangshare does not plan is handed, with the
    GPUs it is counted on there until its binding comes back; None when none holds it."""
    for name in best:
        gpus = choose_gpus(cluster.node(name), ask.request)
        if gpus is not None:
            return name, gpus
    return None


def prioritize_nodes(cluster: Cluster, ask: PodAsk, names: list[str]) -> list[tuple[str, int]]:
    """0..10 per node, for a scheduler configured with prioritizeVerb (filter's answer is
    already only the best nodes, so the shipped configuration has none)."""
    if ask.gang:
        return [(name, 10 if name == ask.planned_node else 0) for name in names]
    return [(name, to_extender_score(score)) for name, score in _scores(cluster, ask, names)]


def gpus_for_bind(cluster: Cluster, ask: PodAsk, node_name: str) -> tuple[int, ...] | str:
    """The GPU indices the pod gets on the node, or the reason it gets none."""
    if ask.unplanned is not None:
        return ask.unplanned
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
