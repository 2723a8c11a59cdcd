"""The pure scheduling core: no I/O, no Kubernetes, time from an injected clock."""

from gangshare.core.choose import choose_gpus
from gangshare.core.clock import Clock, ManualClock, WallClock
from gangshare.core.cluster import Allocation, AllocationError, Cluster
from gangshare.core.fit import Rejection, filter_worker, worker_capacity
from gangshare.core.gang import GangPlan, Unschedulable, WorkerPlacement, apply_plan, plan_gang
from gangshare.core.gpu import Gpu, GpuState, Tenant
from gangshare.core.job import (
    GangRequest,
    PodSet,
    ServiceClass,
    Topology,
    TopologyPolicy,
    TopologyScope,
    WorkerRequest,
)
from gangshare.core.node import NodeState
from gangshare.core.score import score_worker, to_extender_score

__all__ = [
    "Allocation",
    "AllocationError",
    "Clock",
    "Cluster",
    "GangPlan",
    "GangRequest",
    "Gpu",
    "GpuState",
    "ManualClock",
    "NodeState",
    "PodSet",
    "Rejection",
    "ServiceClass",
    "Tenant",
    "Topology",
    "TopologyPolicy",
    "TopologyScope",
    "Unschedulable",
    "WallClock",
    "WorkerPlacement",
    "WorkerRequest",
    "apply_plan",
    "choose_gpus",
    "filter_worker",
    "plan_gang",
    "score_worker",
    "to_extender_score",
    "worker_capacity",
]
