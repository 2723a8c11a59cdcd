"""The kinds of object gangshare queues through a TrainingJob, by what spec.jobRef names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.batchjob import JOB
from gangshare.kube.jobset import JOBSET
from gangshare.kube.queued import WorkloadKind

KINDS: dict[tuple[str, str], WorkloadKind] = {(k.api_version, k.kind): k for k in (JOB, JOBSET)}


def kind_of(workload: Mapping[str, Any]) -> WorkloadKind | None:
    """The kind a TrainingJob's spec.jobRef names; None for a TrainingJob of its own."""
    ref = (workload.get("spec") or {}).get("jobRef")
    if not isinstance(ref, dict):
        return None
    return KINDS.get((str(ref.get("apiVersion")), str(ref.get("kind"))))
