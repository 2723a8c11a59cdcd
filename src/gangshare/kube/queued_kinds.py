"""The kinds of object gangshare queues through a TrainingJob, by what spec.jobRef names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.batchjob import JOB
from gangshare.kube.jobset import JOBSET
from gangshare.kube.ownership import controller_ref
from gangshare.kube.podgroup import PODGROUP
from gangshare.kube.pytorchjob import PYTORCHJOB
from gangshare.kube.queued import WorkloadKind
from gangshare.kube.trainjob import TRAINJOB

KINDS: dict[tuple[str, str], WorkloadKind] = {
    (k.api_version, k.kind): k for k in (JOB, JOBSET, PYTORCHJOB, TRAINJOB, PODGROUP)
}


def kind_of(workload: Mapping[str, Any]) -> WorkloadKind | None:
    """The kind a TrainingJob's spec.jobRef names; None for a TrainingJob of its own."""
    ref = (workload.get("spec") or {}).get("jobRef")
    if not isinstance(ref, dict):
        return None
    return KINDS.get((str(ref.get("apiVersion")), str(ref.get("kind"))))


def parent_of(kind: WorkloadKind, obj: Mapping[str, Any]) -> tuple[WorkloadKind, str] | None:
    """The queued kind that runs `obj` as its child (a TrainJob its JobSet) and the parent's
    name, when its controller is one: such an object is queued through its parent only."""
    ref = controller_ref(obj)
    if ref is None:
        return None
    for parent in KINDS.values():
        if parent.child_kind is kind and (ref.get("apiVersion"), ref.get("kind")) == (
            parent.api_version,
            parent.kind,
        ):
            return parent, str(ref.get("name", ""))
    return None


def workload_kind_name(workload: Mapping[str, Any]) -> str:
    """The kind a TrainingJob record is counted under (the metrics' `kind` label): TrainingJob
    for one of its own (no spec.jobRef), the kind of the object its jobRef names when that is
    one of KINDS (Job, JobSet, PyTorchJob, TrainJob), else Other, so the label's values stay
    that bounded set whatever a jobRef says."""
    if (workload.get("spec") or {}).get("jobRef") is None:
        return "TrainingJob"
    kind = kind_of(workload)
    return kind.kind if kind is not None else "Other"
