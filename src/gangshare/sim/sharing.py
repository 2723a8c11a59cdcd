"""How jobs sharing one GPU progress, and the local coordinator's cap on opportunistic tenants.

s(a|b) is the measured speed of workload a beside workload b (fraction of solo,
from `ColocationModel`). Opportunistic tenants of a GPU run at one duty cycle d
(the share of time the coordinator lets them issue kernels, 0 < d <= 1), and the
model is linear in d, between "not running" (d = 0) and "measured pair" (d = 1):

- guaranteed G:       speed = 1 - d * sum_i (1 - s(G|O_i))
- opportunistic O_i:  speed = d * (1 - (1 - s(O_i|G)) - d * sum_{j != i} (1 - s(O_i|O_j)))
  (interference from several neighbours adds up; floored at MIN_SPEED * d)
- coordinator: d = min(1, tolerance / sum_i (1 - s(G|O_i))), so G keeps at least
  1 - tolerance of its solo speed; with no guaranteed tenant nothing is capped (d = 1).
- SM utilization: the base tenant (G, else the first opportunistic one) at its
  solo utilization, plus d * (pair utilization - base solo utilization) for each
  other tenant when that is positive, capped at 100%.
- memory: the sum of the tenants' solo footprints (the measured pairs' memory is
  that sum within a few hundred MiB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gangshare.sim.colocation import MIN_SPEED, ColocationModel

# An (owner, workload index) pair: who holds the GPU and what it runs.
Tenant = tuple[str, int]


@dataclass(frozen=True)
class GpuShare:
    # Owner -> speed as a fraction of its solo speed.
    speeds: dict[str, float]
    # SM utilization, percent.
    util: float
    memory_mib: int


IDLE = GpuShare({}, 0.0, 0)


def coordinator_duty(
    guaranteed: int | None,
    opportunistic: Sequence[int],
    tolerance: float,
    model: ColocationModel,
) -> float:
    """The duty cycle the coordinator allows opportunistic tenants beside a guaranteed one."""
    if guaranteed is None or not opportunistic:
        return 1.0
    slowdown = sum(1.0 - model.speed(guaranteed, o) for o in opportunistic)
    if slowdown <= tolerance:
        return 1.0
    return tolerance / slowdown


def share_gpu(
    guaranteed: Tenant | None,
    opportunistic: Sequence[Tenant],
    duty: float,
    model: ColocationModel,
) -> GpuShare:
    if guaranteed is None and not opportunistic:
        return IDLE
    workloads = model.workloads
    memory = sum(workloads[w].memory_mib for _, w in opportunistic)
    if not opportunistic:
        assert guaranteed is not None
        owner, work = guaranteed
        return GpuShare({owner: 1.0}, workloads[work].util, workloads[work].memory_mib)
    speeds: dict[str, float] = {}
    if guaranteed is not None:
        g_owner, g_work = guaranteed
        loss = sum(1.0 - model.speed(g_work, w) for _, w in opportunistic)
        speeds[g_owner] = max(MIN_SPEED, 1.0 - duty * loss)
        memory += workloads[g_work].memory_mib
    for i, (owner, work) in enumerate(opportunistic):
        loss = 0.0 if guaranteed is None else 1.0 - model.speed(work, guaranteed[1])
        loss += duty * sum(
            1.0 - model.speed(work, other) for j, (_, other) in enumerate(opportunistic) if j != i
        )
        speeds[owner] = duty * max(MIN_SPEED, 1.0 - loss)
    return GpuShare(speeds, _util(guaranteed, opportunistic, duty, model), memory)


def _util(
    guaranteed: Tenant | None,
    opportunistic: Sequence[Tenant],
    duty: float,
    model: ColocationModel,
) -> float:
    if guaranteed is not None:
        base, base_weight, others = guaranteed[1], 1.0, opportunistic
    else:
        base, base_weight, others = opportunistic[0][1], duty, opportunistic[1:]
    solo = model.workloads[base].util
    util = base_weight * solo
    for _, work in others:
        util += duty * max(0.0, model.pair_util(base, work) - solo)
    return min(100.0, util)
