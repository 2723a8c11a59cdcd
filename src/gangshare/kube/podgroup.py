"""Plain pod groups: any framework's pods queued as one gang (pure; kube/queued.py shares).

Pods that carry the labels `gangshare.io/queue` and `gangshare.io/pod-group: <name>` and the
annotation `gangshare.io/pod-group-size: <N>` are one gang of N pods in that namespace, as
Kueue's pod groups are. They are created behind the `gangshare.io/gang` scheduling gate and name
gangshare's scheduler (crds/pod-group-policy.yaml refuses them otherwise); once all N exist
the operator queues them through one TrainingJob, `podgroup-<name>`.

There is no object above the pods, so the group is read from them (`group_object`: the pods
not being deleted, with the first one's labels and annotations) and the writes a kind makes to
its object are made to every member pod (operator/batchapi.py): the job label and the attempt
on resume, the status note. The gang's pod sets are its pods of one shape each (the same GPUs,
requests and placement constraints); within a set, pods rank by name. Pods cannot be
suspended: a reclaimed group's pods are each replaced by a gated copy of themselves (the same
spec, the planned node's pin taken off, a new name from the original's) and then deleted, so
the group waits whole in its queue again and nothing is lost.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    CLASS_LABEL,
    JOB_LABEL,
    POD_PLANNED_NODE,
    RANK_LABEL,
    SHARE_RESOURCE,
    is_reserved_key,
)
from gangshare.kube.queued import (
    ATTEMPT_ANNOTATION,
    QUEUE_LABEL,
    SERVICE_CLASS_LABEL,
    STATUS_ANNOTATION,
    QueuedJobSpec,
    WorkloadKind,
    gang_pod_gpus,
    queue_ask,
    scheduling_template,
    workload_name,
)
from gangshare.kube.queued_podsets import PodSetAsk, pod_sets_gang, rank_offset
from gangshare.kube.queued_writes import resumed_attempt
from gangshare.kube.scheduling import GANG_GATE, container_gpus, unpin
from gangshare.kube.trainingjob import GROUP, InvalidSpec

API_VERSION = "v1"
KIND = "PodGroup"
PREFIX = "podgroup-"
POD_GROUP_LABEL = f"{GROUP}/pod-group"
POD_GROUP_SIZE_ANNOTATION = f"{GROUP}/pod-group-size"
# The name a member had when its tenant made it: the stem of each gated copy's name.
MEMBER_ANNOTATION = f"{GROUP}/pod-group-member"
# Where group_object keeps the members beside the group's own fields, and the pods a reclaim
# replaced that are not deleted yet.
MEMBERS = "gangshare.io/members"
STALE = "gangshare.io/replaced-members"
# Where pod_rank keeps the members' ranks, worked out once per read of the group.
RANKS = "gangshare.io/ranks"
# The "suspend" a reclaim writes: each member replaced by a gated copy (operator/batchapi.py).
REPLACE_MEMBERS = "gangshare.io/replace-members"
MAX_PODS = 1024


def group_name(pod: Mapping[str, Any]) -> str | None:
    """The pod group a pod joins (its queue and group labels both set), else None."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    group = labels.get(POD_GROUP_LABEL)
    return str(group) if group and QUEUE_LABEL in labels else None


def group_uid(namespace: str, group: str) -> str:
    """The uid a group's pods answer to: one per group name in a namespace."""
    return "podgroup-" + hashlib.sha256(f"{namespace}/{group}".encode()).hexdigest()[:32]


def _deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _original(pod: Mapping[str, Any]) -> str:
    """The name its tenant made the member under (a gated copy records it)."""
    meta = _meta(pod)
    return str((meta.get("annotations") or {}).get(MEMBER_ANNOTATION) or meta.get("name", ""))


def _created(pod: Mapping[str, Any]) -> tuple[str, bool, str]:
    meta = _meta(pod)
    copied = MEMBER_ANNOTATION in (meta.get("annotations") or {})
    return str(meta.get("creationTimestamp", "")), copied, str(meta.get("name", ""))


def group_object(namespace: str, group: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The group as the batch lifecycle reads an object: its members (pods of the group not
    being deleted, by name), the first member's queue labels and annotations, and the attempt
    its members were resumed for. None when no member is left."""
    newest: dict[str, dict[str, Any]] = {}
    stale: list[dict[str, Any]] = []
    for pod in pods:
        if _meta(pod).get("namespace") != namespace or group_name(pod) != group or _deleting(pod):
            continue
        # A reclaim makes a member's gated copy before it deletes the member: the copy (the
        # newer of the two that share an original) is the member from then on, and the other
        # is stale until it is gone (deleted by the next reclaim write if a restart cut in).
        stem = _original(pod)
        held = newest.get(stem)
        if held is None or _created(pod) > _created(held):
            newest[stem] = pod
            if held is not None:
                stale.append(held)
        else:
            stale.append(pod)
    members = sorted(newest.values(), key=lambda p: str(_meta(p).get("name", "")))
    if not members:
        return None
    first = _meta(members[0])
    labels = dict(first.get("labels") or {})
    # A tenant cannot write gangshare's service-class label on a pod: the class is the GPU
    # resource its pods ask (share slots are Opportunistic).
    asks_shares = any(
        container_gpus(c, SHARE_RESOURCE)
        for p in members
        for c in (p.get("spec") or {}).get("containers") or []
    )
    labels[SERVICE_CLASS_LABEL] = "Opportunistic" if asks_shares else "Guaranteed"
    annotations = {
        k: v
        for k, v in (first.get("annotations") or {}).items()
        if k not in (ATTEMPT_ANNOTATION, STATUS_ANNOTATION)
    }
    attempts = {resumed_attempt(p) for p in members} - {None}
    if attempts:
        annotations[ATTEMPT_ANNOTATION] = str(max(a for a in attempts if a is not None))
    notes = {(_meta(p).get("annotations") or {}).get(STATUS_ANNOTATION) for p in members}
    if len(notes) == 1 and None not in notes:
        annotations[STATUS_ANNOTATION] = notes.pop()
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": group,
            "namespace": namespace,
            "uid": group_uid(namespace, group),
            "labels": labels,
            "annotations": annotations,
        },
        MEMBERS: members,
        STALE: stale,
    }


def members(group: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = group.get(MEMBERS)
    return list(found) if isinstance(found, list) else []


def declared_size(group: Mapping[str, Any]) -> int:
    """The size every member states; InvalidSpec naming the annotation when they disagree or
    state none a gang can have."""
    sizes: dict[str, str] = {}
    for pod in members(group):
        raw = (_meta(pod).get("annotations") or {}).get(POD_GROUP_SIZE_ANNOTATION)
        sizes[str(_meta(pod).get("name"))] = str(raw)
    said = sorted(set(sizes.values()))
    field = f"metadata.annotations[{POD_GROUP_SIZE_ANNOTATION}]"
    if len(said) > 1:
        shown = ", ".join(f"{n} says {s}" for n, s in sorted(sizes.items())[:4])
        raise InvalidSpec(f"{field}: the group's pods disagree on its size ({shown})")
    if not said or not said[0].isdigit() or not 1 <= int(said[0]) <= MAX_PODS:
        raise InvalidSpec(f"{field}: the group's size, a whole number from 1 to {MAX_PODS}")
    return int(said[0])


def complete(group: Mapping[str, Any]) -> bool:
    """All the pods its size states exist (a group is queued only then)."""
    try:
        return len(members(group)) >= declared_size(group)
    except InvalidSpec:
        return True  # queued to be refused with the reason


def _as_template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A member as the template it would be made from: its spec without what placing it added
    (its node, the planned node's pin); gangshare's keys and the group's own left out."""
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)
    planned = (_meta(pod).get("annotations") or {}).get(POD_PLANNED_NODE)
    affinity = unpin(spec.get("affinity"), str(planned)) if planned else spec.get("affinity")
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    return {"spec": spec}


def _shapes(group: Mapping[str, Any]) -> list[tuple[dict[str, Any], int, list[str]]]:
    """Its members by shape ((scheduling template, GPUs per pod), member names), in the order
    each shape first appears among them by name."""
    service_class = queue_ask(group).service_class
    own = workload_name(str(_meta(group).get("name", "")), PREFIX)
    shapes: list[tuple[dict[str, Any], int, list[str]]] = []
    for pod in members(group):
        template = _as_template(pod)
        name = str(_meta(pod).get("name"))
        gpus = gang_pod_gpus(template, f"pod {name}", own, service_class, cpu_only=True)
        key = scheduling_template(template)
        same = next((s for s in shapes if (s[0], s[1]) == (key, gpus)), None)
        if same is None:
            shapes.append((key, gpus, [name]))
        else:
            same[2].append(name)
    return shapes


def _asks(shapes: list[tuple[dict[str, Any], int, list[str]]]) -> list[PodSetAsk]:
    return [
        PodSetAsk(f"set{i}", len(names), gpus, key) for i, (key, gpus, names) in enumerate(shapes)
    ]


def parse_pod_group(group: Mapping[str, Any]) -> QueuedJobSpec:
    size = declared_size(group)
    found = len(members(group))
    if found > size:
        raise InvalidSpec(
            f"metadata.annotations[{POD_GROUP_SIZE_ANNOTATION}]: the group states {size} pods "
            f"but {found} carry its label {POD_GROUP_LABEL}={_meta(group).get('name')}"
        )
    return pod_sets_gang(
        group,
        _asks(_shapes(group)),
        "spec.containers[0].resources",
        api_version=API_VERSION,
        kind=KIND,
        prefix=PREFIX,
        owned=False,
    )


def finished(group: Mapping[str, Any]) -> tuple[str, str] | None:
    """Failed once any member failed (a gang runs whole); Succeeded once every one did."""
    phases = {
        str(_meta(p).get("name")): (p.get("status") or {}).get("phase") for p in members(group)
    }
    failed = sorted(n for n, ph in phases.items() if ph == "Failed")
    if failed:
        return "Failed", f"the pod group failed: pod {failed[0]} failed"
    try:
        size = declared_size(group)
    except InvalidSpec:
        return None
    if len(phases) >= size and all(ph == "Succeeded" for ph in phases.values()):
        return "Succeeded", f"all {len(phases)} pods of the group succeeded"
    return None


def stale(group: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = group.get(STALE)
    return list(found) if isinstance(found, list) else []


def resumed(pod: Mapping[str, Any]) -> bool:
    """Given an attempt (and so, maybe, its place): a reclaim replaces it."""
    return resumed_attempt(pod) is not None


def suspended(group: Mapping[str, Any]) -> bool:
    """Not resumed for any attempt (every member waits gated, as its tenant made it) and no
    replaced member left running."""
    return resumed_attempt(group) is None and not stale(group)


def may_resume(group: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    found = members(group)
    return suspended(group) and complete(group) and all(_gated(p) for p in found)


def _gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == GANG_GATE for g in gates)


def prepared(group: Mapping[str, Any], workload_job: str) -> bool:
    return all(
        ((_meta(p).get("labels") or {}).get(JOB_LABEL) == workload_job) for p in members(group)
    )


def never_frozen(group: Mapping[str, Any]) -> bool:
    return False


def resume_patch(group: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    """What every member is given on resume: the job label and the attempt (their gates are
    lifted rank by rank after, each with its place)."""
    return {
        "metadata": {
            "labels": {JOB_LABEL: workload_job},
            "annotations": {ATTEMPT_ANNOTATION: str(attempt)},
        }
    }


def suspend_patch() -> dict[str, Any]:
    return {REPLACE_MEMBERS: True}


def pod_rank(pod: Mapping[str, Any], group: Mapping[str, Any]) -> int | None:
    """Its set's offset plus its place by name among the set's members."""
    ranks = group.get(RANKS)
    if not isinstance(ranks, dict):
        ranks = _ranks(group)
        if isinstance(group, dict):
            # Asked for each member of a group read once: the shapes are judged once per read.
            group[RANKS] = ranks
    return ranks.get(str(_meta(pod).get("name")))


def _ranks(group: Mapping[str, Any]) -> dict[str, int]:
    try:
        shapes = _shapes(group)
    except InvalidSpec:
        return {}
    asks = _asks(shapes)
    ranks: dict[str, int] = {}
    for ask, (_, _, names) in zip(asks, shapes, strict=True):
        found = rank_offset(asks, ask.name)
        if found is not None:
            ranks.update({name: found[0] + i for i, name in enumerate(names)})
    return ranks


def pod_templates(group: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"pod {_meta(p).get('name')}", p) for p in members(group)]


def owns(pod: Mapping[str, Any], group: Mapping[str, Any]) -> bool:
    """A member: a pod of the group's namespace labelled with its name. The label is the
    membership, as Kueue's is; the job label, rank and attempt on it are gangshare's alone."""
    meta = _meta(group)
    return _meta(pod).get("namespace") == meta.get("namespace") and group_name(pod) == meta.get(
        "name"
    )


def gated_copy(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A member as its tenant made it, gated again under a new name from its original: what a
    reclaim leaves in its place (the member itself is deleted)."""
    meta = _meta(pod)
    original = _original(pod)
    gangshares = (RANK_LABEL, ATTEMPT_LABEL, CLASS_LABEL)
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in gangshares}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not is_reserved_key(str(k))
        or k in (POD_GROUP_SIZE_ANNOTATION, MEMBER_ANNOTATION)
        or k.startswith(f"{GROUP}/topology-")
        or k == f"{GROUP}/runtime-estimate-seconds"
    }
    annotations[MEMBER_ANNOTATION] = str(original)
    spec = _as_template(pod)["spec"]
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GANG_GATE]
    spec["schedulingGates"] = [*gates, {"name": GANG_GATE}]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{str(original)[:50]}-",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }
    if meta.get("ownerReferences"):
        body["metadata"]["ownerReferences"] = copy.deepcopy(meta["ownerReferences"])
    return body


PODGROUP = WorkloadKind(
    api_version=API_VERSION,
    kind=KIND,
    group="",
    version="v1",
    plural="pods",
    prefix=PREFIX,
    parse=parse_pod_group,
    finished=finished,
    may_resume=may_resume,
    prepared=prepared,
    frozen=never_frozen,
    resume_patch=resume_patch,
    pod_rank=pod_rank,
    owns=owns,
    pod_templates=pod_templates,
    suspended=suspended,
    suspend_patch=suspend_patch,
    virtual=True,
)
