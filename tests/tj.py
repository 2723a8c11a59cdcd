"""TrainingJob helpers for integration tests: manifests, reads, and the gang invariant."""

from __future__ import annotations

from typing import Any

from kube import Kube

GROUP, VERSION, PLURAL = "gangshare.io", "v1alpha1", "trainingjobs"


def trainingjob(
    name: str,
    workers: int,
    gpus: int,
    exit_code: str | None = "0",
    run_for: str = "2s",
    **spec: Any,
) -> dict[str, Any]:
    annotations = (
        {}
        if exit_code is None
        else {"gangshare.io/kwok-exit-code": exit_code, "gangshare.io/kwok-run-for": run_for}
    )
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": workers,
            "gpusPerWorker": gpus,
            **spec,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": "trainer", "image": "example.invalid/train:1"}]},
            },
        },
    }


def create(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return job


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return get(kube, namespace, name).get("status") or {}


def phase_is(kube: Kube, namespace: str, name: str, *phases: str) -> dict[str, Any] | None:
    current = status(kube, namespace, name)
    return current if current.get("phase") in phases else None


def job_pods(kube: Kube, namespace: str, job: str) -> list[Any]:
    return kube.core.list_namespaced_pod(namespace, label_selector=f"gangshare.io/job={job}").items


def partial_gangs(kube: Kube, namespace: str, jobs: dict[str, int]) -> list[str]:
    """Gangs holding GPUs while incomplete: a worker bound while another is missing, or gated
    before the operator committed to lifting every gate (its GangScheduled condition, which
    makes the lift finish whatever happens to the operator)."""
    broken = []
    for job, workers in jobs.items():
        pods = job_pods(kube, namespace, job)
        live = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
        bound = [p for p in live if p.spec.node_name]
        gated = [p for p in pods if p.spec.scheduling_gates]
        committed = any(
            c["type"] == "GangScheduled" and c["status"] == "True"
            for c in status(kube, namespace, job).get("conditions") or []
        )
        # A worker that already finished still counts as part of the gang.
        if bound and (len(pods) < workers or (gated and not committed)):
            broken.append(
                f"{job}: {len(bound)} bound, {len(pods)} of {workers} exist, {len(gated)} gated"
            )
    return broken


def gpus_bound_per_node(kube: Kube, namespace: str) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in kube.core.list_namespaced_pod(namespace).items:
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            limits = pod.spec.containers[0].resources.limits or {}
            used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + int(
                limits.get("nvidia.com/gpu", 0)
            )
    return used


def trainer_status(state: dict[str, Any]) -> dict[str, Any]:
    """The status of a worker's `trainer` container, as a kubelet would write it."""
    return {
        "name": "trainer",
        "image": "example.invalid/train:1",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": state,
    }
