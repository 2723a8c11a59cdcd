"""Shared pieces for extender unit tests: recorded requests, node and pod objects, a fake binder."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gangshare.core.clock import ManualClock
from gangshare.extender.cache import ClusterCache
from gangshare.kube.nodes import ready_node_objects as node_objects

RECORDED = Path(__file__).parent / "recorded"


def recorded(verb: str) -> dict[str, Any]:
    """A request body exactly as kube-scheduler v1.35.4 sent it (see recorded/README.md)."""
    data: dict[str, Any] = json.loads((RECORDED / f"{verb}-request.json").read_text())
    return data


def gpu_pod(
    name: str,
    gpus: int = 1,
    resource: str = "nvidia.com/gpu",
    node: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": {
            "schedulerName": "gangshare-scheduler",
            "nodeName": node,
            "containers": [{"name": "t", "resources": {"limits": {resource: str(gpus)}}}],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


def cache_with(spec: dict[str, Any], pods: list[dict[str, Any]] = ()) -> ClusterCache:  # type: ignore[assignment]
    cache = ClusterCache(ManualClock(1000.0), assume_ttl=30)
    cache.replace_nodes(node_objects(spec))
    cache.replace_pods(list(pods))
    cache.replace_jobs([])
    return cache


def trainingjob(
    name: str,
    placement: list[tuple[str, list[int]]],
    attempt: int = 0,
    phase: str = "Admitted",
    namespace: str = "default",
) -> dict[str, Any]:
    """An admitted TrainingJob as the API server returns it: rank i is placed at placement[i]."""
    return {
        "apiVersion": "gangshare.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "workers": len(placement),
            "gpusPerWorker": len(placement[0][1]),
            "template": {"spec": {"containers": [{"name": "t", "image": "t:1"}]}},
        },
        "status": {
            "phase": phase,
            "attempt": attempt,
            "placement": [
                {"rank": rank, "node": node, "gpus": gpus}
                for rank, (node, gpus) in enumerate(placement)
            ],
        },
    }


def worker(
    job: str, rank: int, gpus: int, node: str | None = None, attempt: int = 0, uid: str = ""
) -> dict[str, Any]:
    """A worker pod as the operator creates it: named, labelled, controlled by the job's uid."""
    pod = gpu_pod(
        f"{job}-worker-{rank}",
        gpus,
        node=node,
        labels={
            "gangshare.io/job": job,
            "gangshare.io/rank": str(rank),
            "gangshare.io/attempt": str(attempt),
        },
    )
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "gangshare.io/v1alpha1",
            "kind": "TrainingJob",
            "name": job,
            "uid": uid or f"uid-{job}",
            "controller": True,
        }
    ]
    return pod


class FakeBinder:
    """Records binds instead of calling the API server; can be told to fail."""

    def __init__(
        self, pods: dict[str, dict[str, Any]], jobs: dict[str, dict[str, Any]] | None = None
    ) -> None:
        self.pods = pods
        self.jobs = jobs or {}
        self.job_reads: list[str] = []
        self.bound: list[tuple[str, str, tuple[int, ...]]] = []
        self.fail = False

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.pods[f"{namespace}/{name}"])

    async def read_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.job_reads.append(f"{namespace}/{name}")
        job = self.jobs.get(f"{namespace}/{name}")
        return copy.deepcopy(job) if job is not None else None

    async def record_and_bind(self, pod: dict[str, Any], node: str, gpus: tuple[int, ...]) -> None:
        from gangshare.extender.binder import BindError

        if self.fail:
            raise BindError("binding refused by the test")
        self.bound.append((pod["metadata"]["name"], node, gpus))

    async def close(self) -> None:
        pass
