"""How jobs sharing one GPU progress, and the duty cycle the local coordinator settles at.

s(a|b) is the measured speed of workload a beside workload b (fraction of solo,
from `ColocationModel`). Opportunistic tenants of a GPU run at one duty cycle d
(the share of time the coordinator lets them issue kernels, 0 <= d <= 1), and the
model is linear in d, between "not running" (d = 0) and "measured pair" (d = 1):

- guaranteed G:       speed = max(MIN_SPEED, 1 - d * sum_i (1 - s(G|O_i)))
- opportunistic O_i:  speed = d * (1 - (1 - s(O_i|G)) - d * sum_{j != i} (1 - s(O_i|O_j)))
  (interference from several neighbours adds up; floored at MIN_SPEED * d)
- coordinator: d is where the shipped control law (`gangshare.core.coordinator`)
  settles when the guaranteed tenant's step time responds as above, i.e.
  `settle(lambda d: 1 / speed_G(d), ControlParams(tolerance=...))`: it grows d in
  steps while G's step time stays within the tolerance of its solo time, so d lies
  on the law's grid (0.05 steps) and is 0 where even its lowest step is too much.
  With no guaranteed tenant nothing is capped (d = 1). `Coordinator` caches the
  outcome per (guaranteed workload, opportunistic workloads).
- SM utilization: the base tenant (G, else the first opportunistic one) at its
  solo utilization, plus d * (pair utilization - base solo utilization) for each
  other tenant when that is positive, capped at 100%.
- memory: the sum of the tenants' solo footprints (the measured pairs' memory is
  that sum within a few hundred MiB).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gangshare.core.coordinator import ControlParams
from gangshare.core.settle import Settled, settle
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


class Coordinator:
    """The duty cycle the local coordinator's law settles at beside a guaranteed tenant."""

    def __init__(self, model: ColocationModel, params: ControlParams) -> None:
        self.model = model
        self.params = params
        self._settled: dict[tuple[int, tuple[int, ...]], Settled] = {}

    def settled(self, guaranteed: int, opportunistic: Sequence[int]) -> Settled:
        """Where the law ends with these tenants, and how many decisions it takes to get there."""
        key = (guaranteed, tuple(sorted(opportunistic)))
        found = self._settled.get(key)
        if found is None:
            loss = guaranteed_loss(self.model, guaranteed, key[1])
            found = settle(lambda duty: 1.0 / guaranteed_speed(loss, duty), self.params)
            self._settled[key] = found
        return found

    def duty(self, guaranteed: int | None, opportunistic: Sequence[int]) -> float:
        if guaranteed is None or not opportunistic:
            return 1.0
        return self.settled(guaranteed, opportunistic).duty


def guaranteed_loss(model: ColocationModel, guaranteed: int, opportunistic: Iterable[int]) -> float:
    """What the guaranteed tenant loses beside these neighbours at full duty: sum of 1 - s(G|O)."""
    return sum(1.0 - model.speed(guaranteed, o) for o in opportunistic)


def guaranteed_speed(loss: float, duty: float) -> float:
    return max(MIN_SPEED, 1.0 - duty * loss)


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
        loss = guaranteed_loss(model, g_work, (w for _, w in opportunistic))
        speeds[g_owner] = guaranteed_speed(loss, duty)
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
