"""What kube-scheduler will check besides GPUs, so a gang plan never picks a node it refuses.

A plan that ignores these holds GPUs for a worker the scheduler will never bind:
taints the pod does not tolerate, nodeSelector and required node affinity, and
the CPU, memory and other resources the node has left. The semantics follow
kube-scheduler's TaintToleration, NodeAffinity and NodeResourcesFit plugins;
each refusal is a sentence a user reads in the job's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

# Only these taint effects keep new pods off a node; PreferNoSchedule is a hint.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NAME_FIELD = "metadata.name"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # empty with Exists tolerates every taint
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclass(frozen=True)
class Requirement:
    """One matchExpressions (or matchFields) entry of a node selector term."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, found: str | None) -> bool:
        op = self.operator
        if op is SelectorOperator.IN:
            return found is not None and found in self.values
        if op is SelectorOperator.NOT_IN:
            return found is None or found not in self.values
        if op is SelectorOperator.EXISTS:
            return found is not None
        if op is SelectorOperator.DOES_NOT_EXIST:
            return found is None
        # Gt/Lt compare one integer value with the label's integer value.
        try:
            have, bound = int(found or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if op is SelectorOperator.GT else have < bound


@dataclass(frozen=True)
class SelectorTerm:
    """Requirements ANDed together; a node matches the affinity when any term matches."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False  # an empty term matches nothing (as in kube-scheduler)
        return all(r.matches(labels.get(r.key)) for r in self.expressions) and all(
            r.matches(name if r.key == NAME_FIELD else None) for r in self.fields
        )


@dataclass(frozen=True)
class PodConstraints:
    """Everything about one worker pod that decides which nodes may take it, GPUs aside."""

    node_selector: tuple[tuple[str, str], ...] = ()
    # Required node affinity: OR of terms; empty means no constraint.
    affinity: tuple[SelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    # Per-pod requests other than GPUs, in base units (CPU in millicores, memory in bytes),
    # "pods" included: each pod takes one of the node's pod slots.
    resources: tuple[tuple[str, int], ...] = field(default=(("pods", 1),))

    def resource_map(self) -> dict[str, int]:
        return dict(self.resources)


UNCONSTRAINED = PodConstraints(resources=())


def untolerated_taint(
    taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]
) -> Taint | None:
    for taint in taints:
        if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def selector_mismatch(
    name: str, labels: Mapping[str, str], constraints: PodConstraints
) -> str | None:
    """Why the node's labels do not satisfy nodeSelector or required node affinity."""
    for key, value in constraints.node_selector:
        if labels.get(key) != value:
            return f"node does not match nodeSelector {key}={value}"
    if constraints.affinity and not any(t.matches(name, labels) for t in constraints.affinity):
        return "node does not match the pod's required node affinity"
    return None


def resource_room(
    allocatable: Mapping[str, int] | None,
    requested: Mapping[str, int],
    needs: Mapping[str, int],
) -> int | None:
    """How many pods needing `needs` still fit; None when the node's resources are unknown."""
    if allocatable is None or not needs:
        return None
    room: int | None = None
    for name, need in needs.items():
        if need <= 0:
            continue
        left = allocatable.get(name, 0) - requested.get(name, 0)
        fits = max(0, left) // need
        room = fits if room is None else min(room, fits)
    return room


def short_resource(
    allocatable: Mapping[str, int], requested: Mapping[str, int], needs: Mapping[str, int]
) -> str | None:
    """The first resource the node lacks for one more pod, as a sentence."""
    for name, need in sorted(needs.items()):
        left = allocatable.get(name, 0) - requested.get(name, 0)
        if need > 0 and left < need:
            have, want = _amount(name, max(0, left)), _amount(name, need)
            return f"insufficient {name}: {have} left, worker needs {want}"
    return None


def _amount(name: str, value: int) -> str:
    if name == "cpu":
        return f"{value}m"
    if name in ("memory", "ephemeral-storage"):
        return f"{value / 2**30:.1f}Gi"
    return str(value)
