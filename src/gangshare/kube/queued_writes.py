"""The reads and writes every kind of queued object shares (pure: dicts in and out).

Whether it is suspended or finished by its controller's word, the merge patches that suspend,
resume and annotate it, how its templates are gated, and the one patch that makes a gated pod
its rank's worker. Writes whose order matters are made conditional (`at_version`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    CLASS_LABEL,
    JOB_LABEL,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    RANK_LABEL,
    encode_gpu_indices,
)
from gangshare.core.job import ServiceClass
from gangshare.kube.queued import ATTEMPT_ANNOTATION, STATUS_ANNOTATION
from gangshare.kube.scheduling import GANG_GATE, pin_to_node


def suspended(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("suspend"))


def suspended_condition(obj: Mapping[str, Any]) -> bool:
    """Its controller says it is suspended (a Suspended condition that is True)."""
    return any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def finished_by_conditions(
    obj: Mapping[str, Any], complete: str, noun: str
) -> tuple[str, str] | None:
    """("Succeeded" | "Failed", why) once the object's controller sets its `complete` or its
    Failed condition (a Job's is Complete, a JobSet's Completed)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == complete:
            return "Succeeded", f"the {noun} completed"
        if cond.get("type") == "Failed":
            why = cond.get("message") or cond.get("reason") or f"the {noun} failed"
            return "Failed", f"the {noun} failed: {why}"
    return None


def run_left(
    obj: Mapping[str, Any],
    pods: list[dict[str, Any]],
    owns: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
) -> bool:
    """Whether a pod of the object's last run (one gangshare gave an attempt) is still live:
    such a pod still going away would be counted twice beside its successor."""
    return any(
        owns(p, obj)
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and ATTEMPT_LABEL in ((p.get("metadata") or {}).get("labels") or {})
        for p in pods
    )


def resumed_attempt(obj: Mapping[str, Any]) -> int | None:
    """The attempt the object was last resumed for (None: never)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def template_gated(template: Mapping[str, Any], workload_job: str) -> bool:
    """Whether pods made from `template` will be gated and labelled as `workload_job`'s."""
    labels = (template.get("metadata") or {}).get("labels") or {}
    gates = (template.get("spec") or {}).get("schedulingGates") or []
    return labels.get(JOB_LABEL) == workload_job and any(g.get("name") == GANG_GATE for g in gates)


def gated_template(template: Mapping[str, Any], workload_job: str) -> dict[str, Any]:
    """The merge patch that makes `template` gated and labelled as `workload_job`'s."""
    gates = [
        g
        for g in (template.get("spec") or {}).get("schedulingGates") or []
        if g.get("name") != GANG_GATE
    ]
    return {
        "metadata": {"labels": {JOB_LABEL: workload_job}},
        "spec": {"schedulingGates": [*gates, {"name": GANG_GATE}]},
    }


def suspend_patch() -> dict[str, Any]:
    return {"spec": {"suspend": True}}


def resume_attempt_annotation(attempt: int) -> dict[str, Any]:
    """The part of every kind's resume patch that records which attempt it was resumed for."""
    return {"metadata": {"annotations": {ATTEMPT_ANNOTATION: str(attempt)}}}


def resume_body(attempt: int) -> dict[str, Any]:
    """Unsuspend for `attempt` (each kind adds its templates before the first run)."""
    return {**resume_attempt_annotation(attempt), "spec": {"suspend": False}}


def at_version(patch: Mapping[str, Any], seen: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch made conditional on the object's version as it was seen: the API
    server refuses it (409) once anyone else has written the object since."""
    version = (seen.get("metadata") or {}).get("resourceVersion")
    if not version:
        return dict(patch)
    meta = {**(patch.get("metadata") or {}), "resourceVersion": version}
    return {**patch, "metadata": meta}


def status_annotation_patch(message: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {STATUS_ANNOTATION: message}}}


def label_int(pod: Mapping[str, Any], key: str) -> int | None:
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(key)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def ungate_patch(
    pod: Mapping[str, Any],
    rank: int,
    attempt: int,
    placed: tuple[str, list[int]],
    service_class: ServiceClass,
    memory_mib: int | None,
) -> dict[str, Any]:
    """A gated pod made its rank's worker for `attempt`: planned node and GPUs recorded, pinned
    to the node (a gated pod's affinity may still be narrowed), the gang gate lifted. One
    write, refused if the pod changed since it was read."""
    node, gpus = placed
    spec = pod.get("spec") or {}
    annotations = {POD_PLANNED_NODE: node}
    if gpus:  # a CPU-only pod of the gang (a JobSet's driver) is planned a node only
        annotations[POD_PLANNED_GPUS] = encode_gpu_indices(gpus)
        if memory_mib is not None:
            annotations[POD_GPU_MEMORY] = str(memory_mib)
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GANG_GATE]
    patch = {
        "metadata": {
            "labels": {
                RANK_LABEL: str(rank),
                ATTEMPT_LABEL: str(attempt),
                CLASS_LABEL: service_class.value,
            },
            "annotations": annotations,
        },
        "spec": {
            "affinity": pin_to_node(spec.get("affinity"), node),
            "schedulingGates": gates or None,
        },
    }
    # Conditional on the pod as planned from: a deposed leader's late ungate cannot pin a pod
    # the new leader has placed since.
    return at_version(patch, pod)
