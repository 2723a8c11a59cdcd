"""A queued object made of pod sets (a JobSet's replicated jobs, a PyTorchJob's replica types) read
into one gang (pure): its workers are the sets alike with the first that asks GPUs, every other
set is a replica group of the same gang, ranked after them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.kube.queued import QueuedJobSpec, queue_ask, scheduling_template
from gangshare.kube.trainingjob import InvalidSpec, ReplicaGroup


@dataclass(frozen=True)
class PodSetAsk:
    """Pods of one template in a queued object (a replicated job, a replica type)."""

    name: str
    pods: int
    gpus: int  # per pod, in its first container (0: a CPU-only pod)
    template: dict[str, Any]  # the object's own pod template

    @property
    def placed(self) -> dict[str, Any]:
        return scheduling_template(self.template)


def rank_order(asks: list[PodSetAsk]) -> tuple[list[int], list[int]]:
    """(the workers' pod sets, the others), as positions: the workers are every set alike with
    the first that asks GPUs (the same GPUs, requests and placement constraints); each other
    one is a pod set of its own, ranked after them in listed order."""
    first = next((a for a in asks if a.gpus > 0), None)
    if first is None:
        return [], list(range(len(asks)))
    key = (first.placed, first.gpus)
    alike = [i for i, a in enumerate(asks) if (a.placed, a.gpus) == key]
    return alike, [i for i in range(len(asks)) if i not in alike]


def rank_offset(asks: list[PodSetAsk], name: str) -> tuple[int, PodSetAsk] | None:
    """Where the pod set named `name` starts in the gang's ranks (rank_order's order)."""
    workers_at, others_at = rank_order(asks)
    offset = 0
    for position in workers_at + others_at:
        if asks[position].name == name:
            return offset, asks[position]
        offset += asks[position].pods
    return None


def pod_sets_gang(
    obj: Mapping[str, Any], asks: list[PodSetAsk], where: str, **kind: Any
) -> QueuedJobSpec:
    """The gang of an object made of pod sets: its workers and the others as replica groups;
    `where` names the object's field that lists them (for the error); `kind`: QueuedJobSpec's
    api_version, kind and prefix."""
    meta = obj.get("metadata") or {}
    ask = queue_ask(obj)
    workers_at, others_at = rank_order(asks)
    if not workers_at:
        raise InvalidSpec(
            f"{where}: a queued {kind.get('kind')} asks for GPUs in the first container of at "
            "least one of its pod templates"
        )
    total = sum(a.pods for a in asks)
    if total > 1024:
        raise InvalidSpec(f"{where}: a gang has at most 1024 pods, this has {total}")
    first = asks[workers_at[0]]
    groups = tuple(
        ReplicaGroup(asks[i].name, asks[i].pods, asks[i].gpus, asks[i].template) for i in others_at
    )
    return QueuedJobSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        queue=ask.queue,
        service_class=ask.service_class,
        priority=ask.priority,
        workers=sum(asks[i].pods for i in workers_at),
        gpus_per_worker=first.gpus,
        indexed=True,
        topology=ask.topology,
        runtime_estimate_seconds=ask.runtime_estimate_seconds,
        template=first.template,
        groups=groups,
        **kind,
    )
