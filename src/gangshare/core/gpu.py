"""One physical GPU and who is using it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gangshare.core.job import ServiceClass

# A guaranteed tenant whose memory use was published may still grow between
# two reports; keep this much of the GPU back for it before lending the rest.
GUARANTEED_HEADROOM_FRACTION = 0.10

# Share slots per GPU for opportunistic tenants (the device plugin advertises as many).
DEFAULT_SHARE_SLOTS = 4


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True)
class Tenant:
    """A worker holding (part of) a GPU. `owner` groups a gang's workers for release."""

    owner: str
    worker: str
    service_class: ServiceClass
    # Declared per-GPU memory; None means unknown (a guaranteed job that did not say).
    memory_mib: int | None = None


@dataclass
class GpuState:
    gpu: Gpu
    guaranteed: Tenant | None = None
    opportunistic: list[Tenant] = field(default_factory=list)
    # Published by the node agent; None until the first report arrives.
    utilization: float | None = None
    memory_used_mib: int | None = None
    share_slots: int = DEFAULT_SHARE_SLOTS

    @property
    def index(self) -> int:
        return self.gpu.index

    @property
    def free_for_guaranteed(self) -> bool:
        return self.gpu.healthy and self.guaranteed is None

    def opportunistic_memory_mib(self) -> int:
        return sum(t.memory_mib or 0 for t in self.opportunistic)

    def guaranteed_reserve_mib(self) -> int:
        """Memory that must stay available to the guaranteed tenant, if any."""
        tenant = self.guaranteed
        if tenant is None:
            return 0
        if tenant.memory_mib is not None:
            return min(tenant.memory_mib, self.gpu.memory_mib)
        if self.memory_used_mib is not None:
            observed = max(0, self.memory_used_mib - self.opportunistic_memory_mib())
            headroom = int(self.gpu.memory_mib * GUARANTEED_HEADROOM_FRACTION)
            return min(self.gpu.memory_mib, observed + headroom)
        # Nothing known about its footprint: lend nothing rather than risk the guarantee.
        return self.gpu.memory_mib

    def spare_memory_mib(self) -> int:
        return max(
            0, self.gpu.memory_mib - self.guaranteed_reserve_mib() - self.opportunistic_memory_mib()
        )

    def free_share_slots(self) -> int:
        return max(0, self.share_slots - len(self.opportunistic))

    def load(self) -> float:
        """How busy the GPU is, 0..1, for least-loaded placement of opportunistic work."""
        if self.utilization is not None:
            return self.utilization
        return 1.0 if self.guaranteed is not None else 0.0

    def tenants(self) -> list[Tenant]:
        return ([self.guaranteed] if self.guaranteed else []) + list(self.opportunistic)
