"""Builders for TrainingJob, Pod and Node objects as the API server returns them (dicts)."""

from __future__ import annotations

import copy
from typing import Any

from gangshare.kube.nodes import ready_node_objects


class JobBuilder:
    def __init__(self, name: str, namespace: str = "team") -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "gangshare.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "generation": 1,
                "resourceVersion": "1",
            },
            "spec": {
                "serviceClass": "Guaranteed",
                "queue": "default",
                "workers": 1,
                "gpusPerWorker": 1,
                "maxRetries": 3,
                "topology": {"policy": "Preferred", "scope": "NVLink"},
                "template": {"spec": {"containers": [{"name": "trainer", "image": "train:1"}]}},
            },
        }

    def spec(self, **fields: Any) -> JobBuilder:
        self.obj["spec"].update(fields)
        return self

    def status(self, **fields: Any) -> JobBuilder:
        self.obj.setdefault("status", {}).update(fields)
        return self

    def condition(self, kind: str, status: bool) -> JobBuilder:
        conditions = self.obj.setdefault("status", {}).setdefault("conditions", [])
        conditions.append(
            {"type": kind, "status": "True" if status else "False", "reason": "X", "message": ""}
        )
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def make_job(name: str = "job", namespace: str = "team") -> JobBuilder:
    return JobBuilder(name, namespace)


def pod(
    job: str,
    rank: int,
    attempt: int = 0,
    phase: str = "Pending",
    gated: bool = False,
    node: str | None = None,
    gpus: int = 1,
    namespace: str = "team",
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job}-worker-{rank}",
            "namespace": namespace,
            "labels": {
                "gangshare.io/job": job,
                "gangshare.io/rank": str(rank),
                "gangshare.io/attempt": str(attempt),
            },
            "annotations": {},
            "ownerReferences": [
                {
                    "apiVersion": "gangshare.io/v1alpha1",
                    "kind": "TrainingJob",
                    "name": job,
                    "uid": f"uid-{job}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "schedulingGates": [{"name": "gangshare.io/gang"}] if gated else [],
            "containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
        "status": {"phase": phase, **status},
    }


# Node objects for a cluster spec, Ready, as the snapshot tests read them.
nodes = ready_node_objects
