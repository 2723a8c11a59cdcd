"""Per-GPU sharing state: who shares each GPU, at what duty cycle, what the node agent publishes.

The ledger plays the node agent and its local coordinator. After every change
of tenants it recomputes the GPU's speeds, SM utilization and memory
(`sharing.share_gpu`) and publishes utilization and memory use on the core's
GpuState, as the agent's annotations would, so the core's opportunistic
placement (least-loaded GPU, memory lent beside a guaranteed job) sees what
production sees.

The duty cycle follows the coordinator's law (`core.coordinator`, run to rest by
`sharing.Coordinator`). A change of tenants on a GPU that holds a guaranteed job and
opportunistic ones pauses the opportunistic ones (the law's floor duty) for as long as
the law takes to settle with the new tenants (`Settled.periods` decisions of
`ControlParams.period_seconds`); then they run at the settled duty. The law squeezes
at arrival and grows from its lowest step while the guaranteed job's solo step time
is measured and the level found, so pausing for that time keeps the guaranteed job
within tolerance throughout and undercounts opportunistic work by a few seconds per
change. Without a guaranteed tenant nothing is capped (duty 1) from the change on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gangshare.core import Cluster
from gangshare.core.coordinator import ControlParams
from gangshare.core.gpu import GpuState
from gangshare.sim.colocation import ColocationModel
from gangshare.sim.sharing import IDLE, Coordinator, GpuShare, Tenant, share_gpu

GpuId = tuple[str, int]


class GpuLedger:
    def __init__(
        self,
        cluster: Cluster,
        model: ColocationModel,
        workload_of: Callable[[str], int],
        params: ControlParams,
    ) -> None:
        self.model = model
        self._cluster = cluster
        self.coordinator = Coordinator(model, params)
        self._workload_of = workload_of
        self.gpus: dict[GpuId, GpuState] = {
            (node.name, gpu.index): gpu for node in cluster.nodes.values() for gpu in node.gpus
        }
        self.share: dict[GpuId, GpuShare] = dict.fromkeys(self.gpus, IDLE)
        self.duty: dict[GpuId, float] = dict.fromkeys(self.gpus, 1.0)
        # (holds a guaranteed tenant, opportunistic tenants) as last counted in the totals.
        self._held: dict[GpuId, tuple[bool, int]] = dict.fromkeys(self.gpus, (False, 0))
        # GPUs whose coordinator is settling after a change of tenants -> when it has settled.
        self.settling: dict[GpuId, float] = {}
        self.capacity_mib = sum(g.gpu.memory_mib for g in self.gpus.values())
        # Running totals over all GPUs (kept exact by adding each GPU's change).
        self.util_sum = 0.0
        self.memory_sum = 0
        self.busy = 0
        self.guaranteed = 0
        self.slots_used = 0
        # Opportunistic tenants on GPUs that hold a guaranteed job (co-located work).
        self.beside = 0
        # Their speeds (fraction of solo) summed: how fast work beside a guaranteed job goes.
        self.beside_speed = 0.0
        self._beside_speed: dict[GpuId, float] = dict.fromkeys(self.gpus, 0.0)
        self.slots_total = sum(g.share_slots for g in self.gpus.values() if g.gpu.healthy)
        for gpu in self.gpus.values():
            gpu.utilization = 0.0

    def tenants(self, gid: GpuId) -> tuple[Tenant | None, list[Tenant]]:
        gpu = self.gpus[gid]
        held = gpu.guaranteed
        guaranteed = None if held is None else (held.owner, self._workload_of(held.owner))
        return guaranteed, [(t.owner, self._workload_of(t.owner)) for t in gpu.opportunistic]

    def refresh(self, gids: Iterable[GpuId], now: float) -> set[str]:
        """Recompute GPUs after their tenants changed; the owners whose speed may have changed."""
        owners: set[str] = set()
        params = self.coordinator.params
        for gid in gids:
            guaranteed, opportunistic = self.tenants(gid)
            if guaranteed is None or not opportunistic:
                self.duty[gid] = 1.0  # nothing to protect or nothing to cap
                self.settling.pop(gid, None)
            else:
                workloads = [w for _, w in opportunistic]
                settled = self.coordinator.settled(guaranteed[1], workloads)
                self.duty[gid] = params.floor_duty
                self.settling[gid] = now + settled.periods * params.period_seconds
            owners.update(self._apply(gid, guaranteed, opportunistic))
        return owners

    def next_settled(self) -> float | None:
        """When the next settling GPU reaches its settled duty."""
        return min(self.settling.values(), default=None)

    def control(self, now: float) -> set[str]:
        """GPUs whose coordinator has settled by now get the settled duty cycle."""
        owners: set[str] = set()
        for gid in sorted(g for g, when in self.settling.items() if when <= now):
            del self.settling[gid]
            guaranteed, opportunistic = self.tenants(gid)
            self.duty[gid] = self.coordinator.duty(
                None if guaranteed is None else guaranteed[1], [w for _, w in opportunistic]
            )
            owners.update(self._apply(gid, guaranteed, opportunistic))
        return owners

    def _apply(
        self, gid: GpuId, guaranteed: Tenant | None, opportunistic: list[Tenant]
    ) -> Iterable[str]:
        old = self.share[gid]
        new = share_gpu(guaranteed, opportunistic, self.duty[gid], self.model)
        self.share[gid] = new
        had_guaranteed, had_opportunistic = self._held[gid]
        held = (guaranteed is not None, len(opportunistic))
        self._held[gid] = held
        self.util_sum += new.util - old.util
        self.memory_sum += new.memory_mib - old.memory_mib
        self.busy += bool(new.speeds) - bool(old.speeds)
        self.guaranteed += held[0] - had_guaranteed
        self.slots_used += held[1] - had_opportunistic
        self.beside += held[1] * held[0] - had_opportunistic * had_guaranteed
        beside_speed = sum(new.speeds[o] for o, _ in opportunistic) if held[0] else 0.0
        self.beside_speed += beside_speed - self._beside_speed[gid]
        self._beside_speed[gid] = beside_speed
        # What the node agent publishes; no tenants: no memory figure (nothing to lend against).
        gpu = self.gpus[gid]
        utilization, memory = new.util / 100.0, new.memory_mib if new.speeds else None
        if (utilization, memory) != (gpu.utilization, gpu.memory_used_mib):
            gpu.utilization, gpu.memory_used_mib = utilization, memory
            # What the cluster judged of the node (core/verdicts.py) is judged again.
            self._cluster.touch(gid[0])
        return set(old.speeds) | set(new.speeds)

    def speed_of(self, owner: str, gids: Iterable[GpuId]) -> float:
        """A gang moves at its slowest worker's pace (synchronous data-parallel training)."""
        return min(self.share[gid].speeds.get(owner, 1.0) for gid in gids)

    def overfull(self, gid: GpuId) -> bool:
        return self.share[gid].memory_mib > self.gpus[gid].gpu.memory_mib
