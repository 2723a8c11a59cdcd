"""A fluent builder for batch/v1 Jobs queued by gangshare, and their pods (plain dicts)."""

from __future__ import annotations

import copy
from typing import Any

from gangshare.core.annotations import ATTEMPT_LABEL, JOB_LABEL, RANK_LABEL
from gangshare.kube.queued import (
    ATTEMPT_ANNOTATION,
    COMPLETION_INDEX_LABEL,
    QUEUE_LABEL,
    workload_name,
)
from gangshare.kube.scheduling import GANG_GATE

UID = "job-uid-1"


class BatchJobBuilder:
    def __init__(self, name: str) -> None:
        self._job: dict[str, Any] = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": "team",
                "uid": UID,
                "labels": {QUEUE_LABEL: "research"},
                "annotations": {},
                "resourceVersion": "7",
            },
            "spec": {
                "suspend": True,
                "parallelism": 2,
                "completions": 2,
                "completionMode": "Indexed",
                "template": {
                    "metadata": {},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "example.invalid/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": "4", "cpu": "2"}},
                            }
                        ],
                    },
                },
            },
            "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
        }

    def label(self, key: str, value: str) -> BatchJobBuilder:
        self._job["metadata"]["labels"][key] = value
        return self

    def pods(self, count: int, gpus: str = "4") -> BatchJobBuilder:
        self._job["spec"]["parallelism"] = count
        self._job["spec"]["completions"] = count
        limits = self._job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        limits["nvidia.com/gpu"] = gpus
        return self

    def spec(self, **fields: Any) -> BatchJobBuilder:
        self._job["spec"].update(fields)
        return self

    def pod_spec(self, **fields: Any) -> BatchJobBuilder:
        self._job["spec"]["template"]["spec"].update(fields)
        return self

    def template_labels(self, **labels: str) -> BatchJobBuilder:
        self._job["spec"]["template"]["metadata"].setdefault("labels", {}).update(labels)
        return self

    def prepared(self) -> BatchJobBuilder:
        """As gangshare leaves it at its first resume: gated, labelled as its TrainingJob's."""
        template = self._job["spec"]["template"]
        template["metadata"].setdefault("labels", {})[JOB_LABEL] = workload_name(
            self._job["metadata"]["name"], "job-"
        )
        template["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
        return self

    def running(self, attempt: int) -> BatchJobBuilder:
        self.prepared()
        self._job["spec"]["suspend"] = False
        self._job["metadata"]["annotations"][ATTEMPT_ANNOTATION] = str(attempt)
        self._job["status"] = {"startTime": "2026-11-27T10:00:00Z", "active": 2}
        return self

    def started_once(self) -> BatchJobBuilder:
        self._job["status"]["startTime"] = "2026-11-27T10:00:00Z"
        return self

    def condition(self, kind: str) -> BatchJobBuilder:
        self._job["status"].setdefault("conditions", []).append({"type": kind, "status": "True"})
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._job)


def make_batch_job(name: str = "train") -> BatchJobBuilder:
    return BatchJobBuilder(name)


def job_pod(
    job: dict[str, Any],
    index: int,
    *,
    gated: bool = True,
    rank: int | None = None,
    attempt: int | None = None,
    node: str | None = None,
    phase: str = "Pending",
    suffix: str = "abcde",
) -> dict[str, Any]:
    """A pod as the Job controller makes it (then as gangshare ungated it, when `rank`)."""
    name = job["metadata"]["name"]
    labels = {
        JOB_LABEL: workload_name(name, "job-"),
        COMPLETION_INDEX_LABEL: str(index),
        "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
    }
    if rank is not None:
        labels[RANK_LABEL] = str(rank)
    if attempt is not None:
        labels[ATTEMPT_LABEL] = str(attempt)
    spec: dict[str, Any] = {
        "containers": copy.deepcopy(job["spec"]["template"]["spec"]["containers"]),
    }
    if gated:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": f"{name}-{index}-{suffix}",
            "namespace": "team",
            "labels": labels,
            "annotations": {},
            "creationTimestamp": f"2026-11-27T10:00:0{index}Z",
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": phase},
    }
