"""GetPreferredAllocation: which of the kubelet's available devices a container should get.

The choice is the core's `choose_gpus`, the function the extender uses, on the node as
the agent sees it (allocations from PodResources, utilization from the backend): the tightest
NVLink island for whole GPUs, the least-loaded GPUs for share slots. A plan the steering
names (plan.py: the one waiting pod's, or any of one gang's interchangeable siblings') wins
when the kubelet can still give it whole, so the plan and the truth agree whenever they can.
Short of one, the core chooses without the GPUs planned for others; short of that too, it
chooses again among all that is left, the GPUs planned for others last, island by island.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gangshare.agent.backend import GpuSample, Inventory
from gangshare.agent.devices import DeviceMap
from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.core.choose import choose_gpus
from gangshare.core.gpu import GpuState, Tenant
from gangshare.core.job import ServiceClass, TopologyPolicy, WorkerRequest
from gangshare.core.node import NodeState


def observed_node(
    name: str,
    devices: DeviceMap,
    unhealthy: Iterable[int],
    samples: Sequence[GpuSample],
    allocated: Mapping[str, Sequence[str]],
) -> NodeState:
    """The node as the core models it: who holds which GPU, per the kubelet's allocations."""
    inventory: Inventory = devices.inventory
    sick = set(unhealthy)
    states = [
        GpuState(g.as_gpu(g.index not in sick), share_slots=devices.share_slots)
        for g in inventory.gpus
    ]
    for device_id in allocated.get(GPU_RESOURCE, ()):
        index = devices.gpu_of(GPU_RESOURCE, device_id).index
        states[index].guaranteed = Tenant(device_id, device_id, ServiceClass.GUARANTEED)
    for device_id in allocated.get(SHARE_RESOURCE, ()):
        index = devices.gpu_of(SHARE_RESOURCE, device_id).index
        states[index].opportunistic.append(
            Tenant(device_id, device_id, ServiceClass.OPPORTUNISTIC, 0)
        )
    for sample in samples:
        if 0 <= sample.index < len(states):
            states[sample.index].utilization = sample.sm
            states[sample.index].memory_used_mib = sample.memory_used_mib
    return NodeState(name, states, inventory.islands())


def preferred_devices(
    resource: str,
    devices: DeviceMap,
    node: NodeState,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    plans: Sequence[tuple[int, ...]] = (),
    avoid: frozenset[int] = frozenset(),
) -> list[str]:
    """Exactly `size` device IDs out of `available` (plus every `must_include`); the GPUs in
    `avoid` (planned for other pods) only when the core finds no choice without them."""
    by_gpu: dict[int, list[str]] = {}
    for device_id in available:
        if device_id not in must_include:
            by_gpu.setdefault(devices.gpu_of(resource, device_id).index, []).append(device_id)
    for ids in by_gpu.values():
        ids.sort()
    chosen = list(must_include)
    taken = {devices.gpu_of(resource, d).index for d in must_include}
    wanted = size - len(chosen)
    if wanted <= 0:
        return chosen[:size]
    order = next(
        (served for plan in plans if (served := _planned(plan, by_gpu, taken, wanted))), []
    ) or _core_choice(resource, node, by_gpu, taken | avoid, wanted)
    # Short of GPUs nobody else waits for: as few planned ones as can be, island by island.
    rest = _fallback(node, by_gpu, taken | set(order), avoid)
    for index in order + rest:
        if len(chosen) == size:
            break
        if by_gpu.get(index):
            chosen.append(by_gpu[index].pop(0))
    # Fewer GPUs with a free device than asked (share slots only): more slots of the same GPUs.
    leftovers = [d for index in sorted(by_gpu) for d in by_gpu[index]]
    chosen.extend(leftovers[: size - len(chosen)])
    return chosen


def _planned(
    plan: tuple[int, ...] | None, by_gpu: Mapping[int, list[str]], taken: set[int], wanted: int
) -> list[int]:
    if plan is None or len(plan) != wanted + len(taken) or not taken <= set(plan):
        return []
    rest = [i for i in plan if i not in taken]
    return rest if all(by_gpu.get(i) for i in rest) else []


def _core_choice(
    resource: str, node: NodeState, by_gpu: Mapping[int, list[str]], taken: set[int], wanted: int
) -> list[int]:
    whole = resource == GPU_RESOURCE
    service_class = ServiceClass.GUARANTEED if whole else ServiceClass.OPPORTUNISTIC
    exclude = frozenset(g.index for g in node.gpus if not by_gpu.get(g.index)) | taken
    request = WorkerRequest(wanted, service_class, island_policy=TopologyPolicy.PREFERRED)
    if whole:
        # The kubelet's available list is the truth for whole GPUs: none of them is held.
        for index in by_gpu:
            node.gpus[index].guaranteed = None
        node.recount()
    picked = choose_gpus(node, request, exclude)
    return list(picked) if picked else []


def _fallback(
    node: NodeState, by_gpu: Mapping[int, list[str]], skip: set[int], avoid: frozenset[int]
) -> list[int]:
    """Every other GPU with a free device: those planned for nobody first, then the planned
    ones; within each, island by island (the one with most such GPUs first), least loaded
    first, so a worker spread by necessity still spans as few islands as it can."""
    island_of = {i: n for n, island in enumerate(node.islands) for i in island}
    candidates = [i for i in by_gpu if i not in skip]

    def order(planned: bool) -> list[int]:
        group = [i for i in candidates if (i in avoid) is planned]
        size: dict[int, int] = {}
        for index in group:
            size[island_of.get(index, -1)] = size.get(island_of.get(index, -1), 0) + 1
        return sorted(
            group,
            key=lambda i: (
                -size[island_of.get(i, -1)],
                island_of.get(i, -1),
                node.gpus[i].load(),
                i,
            ),
        )

    return order(False) + order(True)
