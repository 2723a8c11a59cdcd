"""What a pod template in a TrainingJob may not say, checked by the operator as the second line
behind the CRD's rules and the template admission policy (pure); errors name the field."""

from __future__ import annotations

import posixpath
from typing import Any

from gangshare.core.annotations import GROUP, is_reserved_key
from gangshare.kube.scheduling import GPU_RESOURCES, container_gpus


class InvalidSpec(ValueError):
    """A spec the operator cannot run; the message starts with the field path."""


def check_template(template: dict[str, Any], path: str) -> None:
    """What a template may not say: it must not claim gangshare's own bookkeeping (planned
    node and GPUs, assignments, job and rank labels) nor pick its node itself."""
    meta = template.get("metadata") or {}
    for kind in ("labels", "annotations"):
        for key in meta.get(kind) or {}:
            # Only the simulation markers are a tenant's to set, and only as annotations.
            if is_reserved_key(str(key)) or (kind == "labels" and str(key).startswith(GROUP + "/")):
                raise InvalidSpec(
                    f"{path}.metadata.{kind}: {key} is reserved for gangshare "
                    "(keys under gangshare.io/ are written by gangshare itself)"
                )
    pod = template.get("spec") or {}
    if pod.get("nodeName"):
        raise InvalidSpec(
            f"{path}.spec.nodeName: gangshare places every worker; use nodeSelector or "
            "node affinity to restrict where"
        )
    _check_gpus_outside_first_container(pod, path)


def _check_gpus_outside_first_container(pod: dict[str, Any], path: str) -> None:
    """GPUs belong to the first container, which gangshare sets from spec.gpusPerWorker; any
    other container's (a sidecar's above all: the kubelet gives it devices of its own) would
    be GPUs the job holds beyond what it was queued, admitted and planned for."""
    kinds = [
        ("initContainers", pod.get("initContainers") or []),
        ("containers", (pod.get("containers") or [])[1:]),
    ]
    for kind, containers in kinds:
        first = 1 if kind == "containers" else 0
        for position, container in enumerate(containers, start=first):
            if not isinstance(container, dict):
                continue
            for resource in sorted(GPU_RESOURCES):
                if container_gpus(container, resource):
                    raise InvalidSpec(
                        f"{path}.spec.{kind}[{position}].resources: may not ask for "
                        f"{resource}; only the first container gets GPUs, set by gangshare "
                        "from spec.gpusPerWorker (a replica group's from its gpus)"
                    )


# Volumes that die with the pod, or cannot be written: no checkpoint survives on them.
_NO_CHECKPOINT_VOLUMES = {
    "emptyDir": "is deleted with the pod",
    "ephemeral": "is deleted with the pod",
    "configMap": "is read-only",
    "secret": "is read-only",
    "downwardAPI": "is read-only",
    "projected": "is read-only",
}


def checkpoint_path(raw: Any, pod: dict[str, Any]) -> str | None:
    """spec.checkpoint.path, normalised; it must be on a writable volume of the first container
    that outlives the pod, or the next attempt would find nothing there."""
    if raw is None:
        return None
    path = raw.get("path") if isinstance(raw, dict) else None
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidSpec(f"spec.checkpoint.path: must be an absolute path, got {path!r}")
    path = posixpath.normpath(path)
    first = pod["containers"][0] if isinstance(pod["containers"][0], dict) else {}
    mounts = [
        m
        for m in (first.get("volumeMounts") or [])
        if isinstance(m, dict) and isinstance(m.get("mountPath"), str)
    ]
    under = [m for m in mounts if _is_under(path, posixpath.normpath(m["mountPath"]))]
    if not under:
        raise InvalidSpec(
            f"spec.checkpoint.path: {path} is on no volume of the first container "
            "(spec.template.spec.containers[0].volumeMounts); checkpoints must outlive the pod: "
            "mount a PersistentVolumeClaim (or a hostPath on one node) at or above it"
        )
    mount = max(under, key=lambda m: len(posixpath.normpath(m["mountPath"])))
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    volume = volumes.get(mount.get("name")) or {}
    why = "is mounted read-only" if mount.get("readOnly") else None
    why = why or next((w for kind, w in _NO_CHECKPOINT_VOLUMES.items() if kind in volume), None)
    if why is not None:
        raise InvalidSpec(
            f"spec.checkpoint.path: {path} is on volume {mount.get('name')!r}, which {why}; "
            "checkpoints need a writable volume that outlives the pod (a PersistentVolumeClaim, "
            "or a hostPath on one node)"
        )
    return path


def _is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
