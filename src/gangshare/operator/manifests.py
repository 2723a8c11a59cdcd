"""Worker pods and the headless Service of an admitted gang (pure: manifests as dicts).

Each pod is created behind a scheduling gate with its planned node and GPUs
recorded on it; the operator lifts every gate only once the whole gang exists.
Required node affinity on the planned node's name (metadata.name, not the
hostname label, which clouds may set differently) makes the plan binding even
for a kube-scheduler profile without gangshare's extender.
"""

from __future__ import annotations

import copy
from typing import Any

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    CLASS_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    RANK_LABEL,
    REPLICA_GROUP_LABEL,
    SHARE_RESOURCE,
    encode_gpu_indices,
)
from gangshare.core.job import ServiceClass
from gangshare.kube.scheduling import GANG_GATE, pin_to_node
from gangshare.kube.trainingjob import (
    API_VERSION,
    KIND,
    OPPORTUNISTIC_MAX_GRACE_SECONDS,
    TrainingJobSpec,
)

# Kubernetes' terminationGracePeriodSeconds when a pod sets none.
KUBERNETES_DEFAULT_GRACE_SECONDS = 30
SCHEDULER_NAME = "gangshare-scheduler"
MASTER_PORT = 29500


def pod_name(job: TrainingJobSpec, rank: int) -> str:
    return job.pod_name(rank)


def owner_reference(job: TrainingJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def rendezvous_env(job: TrainingJobSpec, rank: int) -> dict[str, str]:
    """What torchrun and PyTorch DDP's env:// expect, plus torchrun's own PET_* arguments. A
    gang's master is worker 0 by its headless Service's DNS name; a lone worker (which gets no
    Service) is its own, by the hostname the kubelet writes into its /etc/hosts."""
    master = (
        f"{pod_name(job, 0)}.{job.name}.{job.namespace}.svc"
        if job.pod_count > 1
        else pod_name(job, 0)
    )
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(MASTER_PORT),
        # One process per GPU: the world is every GPU of the gang.
        "WORLD_SIZE": str(job.total_gpus),
        # The global rank of this pod's first process (the pod's rank when it has one GPU).
        "RANK": str(rank * job.gpus_per_worker),
        "NODE_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(job.gpus_per_worker),
        "PET_NNODES": str(job.workers),
        "PET_NPROC_PER_NODE": str(job.gpus_per_worker),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": str(MASTER_PORT),
        "GANGSHARE_JOB": job.key,
        "GANGSHARE_SERVICE_CLASS": job.service_class.value,
    }
    if job.gpu_memory_mib is not None:
        env["GANGSHARE_GPU_MEMORY_MIB"] = str(job.gpu_memory_mib)
    return env


def worker_pod(
    job: TrainingJobSpec,
    rank: int,
    node: str,
    gpus: list[int],
    attempt: int,
    scheduler_name: str = SCHEDULER_NAME,
    resume_step: int | None = None,
) -> dict[str, Any]:
    """The pod of one rank: a worker, or a replica group's pod (its own template and GPUs, a
    CPU-only one with none), all behind the one gang gate."""
    group = job.group_of(rank)
    template = copy.deepcopy(job.template if group is None else group[0].template)
    per_pod = job.gpus_per_worker if group is None else group[0].gpus
    meta = template.get("metadata") or {}
    spec = template["spec"]
    labels = {
        **(meta.get("labels") or {}),
        JOB_LABEL: job.name,
        RANK_LABEL: str(rank),
        CLASS_LABEL: job.service_class.value,
        ATTEMPT_LABEL: str(attempt),
    }
    if group is not None:
        labels[REPLICA_GROUP_LABEL] = group[0].name
    annotations = {**(meta.get("annotations") or {}), POD_PLANNED_NODE: node}
    if per_pod:
        annotations[POD_PLANNED_GPUS] = encode_gpu_indices(gpus)
        if job.gpu_memory_mib is not None:
            annotations[POD_GPU_MEMORY] = str(job.gpu_memory_mib)
    spec["schedulerName"] = scheduler_name
    if job.pod_count > 1:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    else:
        # A lone worker is its whole gang: no sibling to wait for, so no gate to lift (one
        # API request of the seventeen a one-GPU job cost in bench/scale.py).
        spec.pop("schedulingGates", None)
    spec["hostname"] = pod_name(job, rank)
    spec["subdomain"] = job.name
    # A gang restarts as a whole; a container restarting in place would hide the failure.
    spec["restartPolicy"] = "Never"
    spec["affinity"] = pin_to_node(spec.get("affinity"), node)
    resource = GPU_RESOURCE if job.service_class is ServiceClass.GUARANTEED else SHARE_RESOURCE
    if resource == SHARE_RESOURCE and per_pod:
        # A worker removed for GPU memory gives it back within a bound (every gpu-share pod's).
        grace = spec.get("terminationGracePeriodSeconds")
        bound = OPPORTUNISTIC_MAX_GRACE_SECONDS
        spec["terminationGracePeriodSeconds"] = bound if grace is None else min(grace, bound)
    env = rendezvous_env(job, rank)
    if group is not None:
        # The workers' world, as every worker sees it; the group's own place in the gang.
        for key in ("RANK", "NODE_RANK", "PET_NODE_RANK"):
            env.pop(key)
        env["GANGSHARE_REPLICA_GROUP"] = group[0].name
        env["GANGSHARE_REPLICA_INDEX"] = str(group[1])
    if isinstance(resume_step, int) and resume_step > 0:
        # Where the SDK's step count starts (gangshare.sdk.resume_step()).
        env["GANGSHARE_RESUME_STEP"] = str(resume_step)
    env.update(attempt_env(job, attempt, spec.get("terminationGracePeriodSeconds")))
    for position, container in enumerate(spec["containers"]):
        if position == 0:
            resources = container.setdefault("resources", {})
            for kind in ("requests", "limits"):
                amounts = dict(resources.get(kind) or {})
                amounts.pop(GPU_RESOURCE, None)
                amounts.pop(SHARE_RESOURCE, None)
                if per_pod:
                    amounts[resource] = str(per_pod)
                resources[kind] = amounts
        # Unless the template says otherwise, a failed container's log tail becomes its
        # termination message: a GPU out-of-memory error is told from it (core/failures.py).
        container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        own = [e for e in container.get("env") or [] if e.get("name") not in env]
        container["env"] = own + [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job, rank),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def attempt_env(job: TrainingJobSpec, attempt: int, grace: Any) -> dict[str, str]:
    """What checkpoint on notice needs (gangshare.sdk.on_preempt, checkpoint_dir, attempt): the
    attempt, the grace a save on SIGTERM has (the pod's; reclaim and eviction both delete
    with it), and the checkpoint folder, the same for every attempt."""
    given = isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0
    seconds = grace if given else KUBERNETES_DEFAULT_GRACE_SECONDS
    env = {
        "GANGSHARE_ATTEMPT": str(attempt),
        "GANGSHARE_PREEMPT_GRACE_SECONDS": str(seconds),
    }
    if job.checkpoint_path is not None:
        env["GANGSHARE_CHECKPOINT_DIR"] = job.checkpoint_path
    return env


def headless_service(job: TrainingJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {JOB_LABEL: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job.name},
            # Workers must find each other before they report ready.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
        },
    }
