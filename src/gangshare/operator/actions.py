"""What the lifecycle sees of a job (Observation) and what it asks for (Actions): plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


@dataclass
class Actions:
    status: dict[str, Any] = field(default_factory=dict)
    create_service: dict[str, Any] | None = None
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    lift_gates: list[str] = field(default_factory=list)
    # (pod, the refusal it answers): workers the gang barrier refused, for kube-scheduler to
    # try again now that every gate is lifted (gangshare.io/gang-ready).
    nudge_pods: list[tuple[str, str]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    # Pods long past their deletion deadline (their node is dead): removed without grace.
    force_delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    # Seconds until the job needs another look (back-off, TTL); None when events will wake it.
    requeue_after: float | None = None

    @property
    def empty(self) -> bool:
        return not (
            self.status
            or self.create_service
            or self.create_pods
            or self.lift_gates
            or self.nudge_pods
            or self.delete_pods
            or self.force_delete_pods
            or self.delete_job
            or self.events
        )


@dataclass(frozen=True)
class Displacement:
    """The scheduling pass found this attempt's plan broken (see gangshare.kube.ledger)."""

    attempt: int
    reason: str
    # A borrower reclaimed by its cohort's lenders: evicted whole even while running.
    preempted: bool = False
    # A gang that requires one NVLink island per worker and was given GPUs across islands:
    # released whole even while running.
    off_island: bool = False


@dataclass(frozen=True)
class Observation:
    job: dict[str, Any]
    pods: list[dict[str, Any]]
    has_service: bool
    now: float
    displaced: Displacement | None = None
    # Other pods bound to the nodes of the job's failed workers, looked up only when a worker
    # failed: an opportunistic one among them can make a GPU out-of-memory error not the
    # job's own (pod_failures.py).
    neighbours: tuple[dict[str, Any], ...] = ()

    def displaced_now(self, status: Mapping[str, Any]) -> Displacement | None:
        """The displacement the pass found for the job's current attempt, if any (one found
        for an attempt already released says nothing about this one)."""
        displaced = self.displaced
        if displaced is None or displaced.attempt != int(status.get("attempt", 0)):
            return None
        return displaced
