"""The agent's Prometheus series: what each GPU really does, and what the coordinator did.

Label values: `gpu` is the GPU's index on the node; `namespace`/`pod` name the pod; `reason`
is the CamelCase reason of the matching event (OpportunisticSqueezed, OpportunisticBackedOff,
OpportunisticProbeFailed; for throttles the backstop's cause: NoSdk, SdkSilent, OverDuty;
for evictions GpuMemoryOverCap, GpuDutyOverrun and GpuMemoryKilled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from gangshare.agent.backend import GpuSample
from gangshare.core.coordinator import Caps, GpuControl

MIB = 1024 * 1024


class AgentMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.sm = Gauge(
            "gangshare_gpu_sm_utilization_ratio",
            "SM utilization of a GPU over NVML's last sample period (0..1).",
            ["node", "gpu"],
            registry=r,
        )
        self.memory = Gauge(
            "gangshare_gpu_memory_used_bytes", "GPU memory in use.", ["node", "gpu"], registry=r
        )
        self.duty = Gauge(
            "gangshare_opportunistic_duty_ratio",
            "SM duty cycle the coordinator allows an opportunistic pod (0..1).",
            ["node", "namespace", "pod"],
            registry=r,
        )
        self.memory_cap = Gauge(
            "gangshare_opportunistic_memory_cap_bytes",
            "GPU memory an opportunistic pod may hold on each of its GPUs.",
            ["node", "namespace", "pod"],
            registry=r,
        )
        self.slowdown = Gauge(
            "gangshare_guaranteed_slowdown_ratio",
            "A guaranteed pod's median step time over its solo baseline, on a shared GPU.",
            ["node", "gpu", "pod_uid"],
            registry=r,
        )
        self.changes = Counter(
            "gangshare_coordinator_changes_total",
            "Squeezes and back-offs of opportunistic pods, by reason.",
            ["node", "reason"],
            registry=r,
        )
        self.throttles = Counter(
            "gangshare_agent_throttles_total",
            "Opportunistic pods put under stop/continue duty-cycling, by reason.",
            ["node", "reason"],
            registry=r,
        )
        self.evictions = Counter(
            "gangshare_agent_evictions_total",
            "Opportunistic pods evicted by the agent, by reason.",
            ["node", "reason"],
            registry=r,
        )

    def gpus(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            self.sm.labels(self.node, str(sample.index)).set(sample.sm)
            self.memory.labels(self.node, str(sample.index)).set(sample.memory_used_mib * MIB)

    def caps(self, caps: Mapping[str, Caps], names: Mapping[str, tuple[str, str]]) -> None:
        self.duty.clear()
        self.memory_cap.clear()
        for uid, cap in caps.items():
            namespace, name = names.get(uid, ("", uid))
            self.duty.labels(self.node, namespace, name).set(cap.duty)
            self.memory_cap.labels(self.node, namespace, name).set(cap.memory_mib * MIB)

    def controls(self, controls: Mapping[int, GpuControl]) -> None:
        self.slowdown.clear()
        for index, control in controls.items():
            if control.slowdown is not None and control.guaranteed is not None:
                self.slowdown.labels(self.node, str(index), control.guaranteed).set(
                    control.slowdown
                )
