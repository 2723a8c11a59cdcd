"""What kube-scheduler reads from a pod and a node, turned into core objects (pure).

A pod's constraints: nodeSelector, required node affinity, tolerations, and its
effective requests (containers summed with sidecars, or the largest init
container; a pod-level request in spec.resources in their stead; plus overhead),
as kube-scheduler's NodeResourcesFit computes them.
A node's side: its taints, and what its allocatable leaves once every live pod
bound to it has taken its requests. GPUs are the core's own model, so the GPU
resources are left out of both; `gpu_devices` counts them apart, by the same rule
(the kubelet's device manager hands out devices that way too: sidecars keep theirs
beside the containers', a plain init container's are reused by the containers).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from decimal import ROUND_CEILING
from typing import Any

from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.core.constraints import (
    PodConstraints,
    Requirement,
    SelectorOperator,
    SelectorTerm,
    Taint,
    Toleration,
)
from gangshare.kube.quantity import QuantityError, to_bytes, to_int

GPU_RESOURCES = frozenset({GPU_RESOURCE, SHARE_RESOURCE})
TERMINAL_POD_PHASES = ("Succeeded", "Failed")
# The scheduling gate a gang's workers are made behind (TrainingJob workers, a queued Job's
# pods); the operator lifts every gate only once the whole gang exists.
GANG_GATE = "gangshare.io/gang"


def quantity(name: str, value: Any) -> int:
    """A resource amount in base units: CPU in millicores, everything else rounded up."""
    amount = to_bytes(value, name)
    if name == "cpu":
        amount *= 1000
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def _amounts(raw: Mapping[str, Any] | None) -> dict[str, int]:
    result: dict[str, int] = {}
    for name, value in (raw or {}).items():
        if name in GPU_RESOURCES:
            continue
        try:
            result[name] = quantity(name, value)
        except QuantityError:
            continue  # the API server refuses such a pod; nothing to count
    return result


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    # A limit without a request defaults the request to the limit (API defaulting).
    return {**_amounts(resources.get("limits")), **_amounts(resources.get("requests"))}


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        into[name] = into.get(name, 0) + amount


def effective_amounts(
    spec: Mapping[str, Any], read: Callable[[Mapping[str, Any]], dict[str, int]]
) -> dict[str, int]:
    """What a pod takes of each resource `read` counts per container, as the scheduler and
    the kubelet count it: the containers and native sidecars (init containers with
    restartPolicy Always) together, or a plain init container (beside the sidecars started
    before it) when that asks for more."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for init in spec.get("initContainers") or []:
        asked = read(init)
        if init.get("restartPolicy") == "Always":
            _add(sidecars, asked)  # native sidecars run beside the app containers
            continue
        # A regular init container runs alone, beside the sidecars started before it.
        for name, amount in asked.items():
            peak[name] = max(peak.get(name, 0), amount + sidecars.get(name, 0))
    for container in spec.get("containers") or []:
        _add(total, read(container))
    _add(total, sidecars)
    for name, amount in peak.items():
        total[name] = max(total.get(name, 0), amount)
    return total


def _pod_level_resource(name: str) -> bool:
    """Whether Kubernetes reads this resource from spec.resources (component-helpers
    IsSupportedPodLevelResource); the API server refuses any other name there, GPUs included."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def _pod_level_amounts(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return {name: n for name, n in _amounts(raw).items() if _pod_level_resource(name)}


def _pod_level_requests(spec: Mapping[str, Any], containers: Mapping[str, int]) -> dict[str, int]:
    """What spec.resources (PodLevelResources, on by default since 1.34) asks of each resource
    it names, given what the containers add up to. A pod-level limit without a request is
    defaulted as the API server does (core/v1 defaults.go defaultPodRequests): to the
    containers' aggregate for cpu or memory they ask for, else to the limit. Templates in our
    own and other custom objects are never defaulted, so this does it for them too."""
    resources = spec.get("resources") or {}
    requests = _pod_level_amounts(resources.get("requests"))
    for name, limit in _pod_level_amounts(resources.get("limits")).items():
        overcommittable = not name.startswith("hugepages-")
        if name not in requests and not (overcommittable and name in containers):
            requests[name] = limit
    return requests


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests of a pod (non-GPU), plus one of the node's pod slots: component-helpers
    resource.PodRequests, which NodeResourcesFit and the kubelet's admission both use."""
    total = effective_amounts(spec, _container_requests)
    # A pod-level request replaces the containers' aggregate for that resource only.
    total.update(_pod_level_requests(spec, total))
    _add(total, _amounts(spec.get("overhead")))  # overhead on top, pod level or not
    total["pods"] = 1
    return {name: amount for name, amount in total.items() if amount > 0}


def container_gpus(container: Mapping[str, Any], resource: str) -> int:
    """How many devices of a GPU resource one container asks for; 0 when unreadable (the API
    server refuses such a pod)."""
    resources = container.get("resources") or {}
    asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    try:
        return to_int(asked.get(resource, 0), resource)
    except QuantityError:
        return 0


def _container_gpu_devices(container: Mapping[str, Any]) -> dict[str, int]:
    return {r: n for r in sorted(GPU_RESOURCES) if (n := container_gpus(container, r)) > 0}


def gpu_devices(spec: Mapping[str, Any]) -> dict[str, int]:
    """GPU resource -> devices the whole pod holds (every container kind, sidecars included):
    the one reader of a pod's GPU request for the ledger, the extender, the agent and the
    operator's manifests."""
    return {r: n for r, n in effective_amounts(spec, _container_gpu_devices).items() if n > 0}


def _requirements(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Requirement, ...]:
    found = []
    for item in raw or []:
        key = str(item.get("key", ""))
        try:
            operator = SelectorOperator(item.get("operator", ""))
        except ValueError:
            # The API server refuses unknown operators; should one slip by, it matches nothing.
            found.append(Requirement(key, SelectorOperator.IN, ()))
            continue
        found.append(Requirement(key, operator, tuple(str(v) for v in item.get("values") or [])))
    return tuple(found)


def pod_constraints(spec: Mapping[str, Any]) -> PodConstraints:
    """The constraints kube-scheduler will apply to a pod with this spec (or template spec)."""
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = tuple(
        SelectorTerm(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
        for t in required.get("nodeSelectorTerms") or []
    )
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or []
    )
    return PodConstraints(
        node_selector=selector,
        affinity=terms,
        tolerations=tolerations,
        resources=tuple(sorted(pod_requests(spec).items())),
    )


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in (node.get("spec") or {}).get("taints") or []
    )


def node_allocatable(node: Mapping[str, Any]) -> dict[str, int]:
    return _amounts(((node.get("status") or {}).get("allocatable")) or {})


def requests_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Requests every live pod bound to a node takes from it (what NodeResourcesFit counts)."""
    by_node: dict[str, dict[str, int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
            continue
        _add(by_node.setdefault(node, {}), pod_requests(pod.get("spec") or {}))
    return by_node


def pin_to_node(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """The template's affinity with the planned node ANDed into every required term."""
    affinity = copy.deepcopy(affinity or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), pin]
    required["nodeSelectorTerms"] = terms
    return affinity


def unpin(affinity: dict[str, Any] | None, node: str) -> dict[str, Any] | None:
    """pin_to_node undone: the affinity as it was before the pin (None when it was none)."""
    if not affinity:
        return None
    affinity = copy.deepcopy(affinity)
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = [f for f in term.get("matchFields") or [] if f != pin]
        kept = {k: v for k, v in term.items() if k != "matchFields"}
        if fields:
            kept["matchFields"] = fields
        if kept:
            terms.append(kept)
    if terms:
        required["nodeSelectorTerms"] = terms
    else:
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if not node_affinity:
        affinity.pop("nodeAffinity", None)
    return affinity or None
