"""The node agent: one process per GPU node that keeps the kubelet, the Node and the pods true.

Three loops share one view of the node:
- health: waits on the backend's health events; a failed GPU turns Unhealthy in both device
  plugins (the kubelet drops it from allocatable) and in the Node's topology;
- publish: GPU labels, topology and rate-limited utilization on the Node;
- read back: PodResources → `gangshare.io/assigned-gpus` on each pod, and re-registration
  when the kubelet restarts.
Nothing is kept that cannot be rebuilt: a restarted agent reads PodResources and the API
server again, registers again and republishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gangshare.agent.allocation import SOCKET_NAME
from gangshare.agent.assignments import DIFFERS_FROM_PLAN, detect_assignments, kubelet_keys
from gangshare.agent.backend import GpuBackend, GpuSample
from gangshare.agent.cgroups import pod_uid_of
from gangshare.agent.checkpoint import CheckpointError, DeviceCheckpoint, DevicesByUid
from gangshare.agent.control_loop import ControlLoop
from gangshare.agent.coordinator import Coordinator
from gangshare.agent.devices import RESOURCES, DeviceMap
from gangshare.agent.freezer import CGROUP_ROOT, CgroupFreezer
from gangshare.agent.layers import detect_layers
from gangshare.agent.metrics import AgentMetrics
from gangshare.agent.nodeapi import POD_LIST_TIMEOUT, NodeApi
from gangshare.agent.plan import Steering, steering_for_request
from gangshare.agent.plugin import DevicePlugin
from gangshare.agent.podresources import PodDevices, PodResourcesClient, allocated_devices
from gangshare.agent.preference import observed_node
from gangshare.agent.publish import UtilizationGate, topology_patch
from gangshare.agent.sdkserver import SdkServer
from gangshare.agent.throttle import Throttler
from gangshare.core.annotations import NODE_ENFORCEMENT, encode_gpu_indices
from gangshare.core.coordinator import ControlParams
from gangshare.core.enforcement import EnforcementParams
from gangshare.core.node import NodeState

log = logging.getLogger("gangshare.agent")

RECHECK_SECONDS = 60.0
THROTTLE_STATE = "throttled.json"


@dataclass(frozen=True)
class AgentConfig:
    node: str
    plugin_dir: Path
    socket_dir: Path | None
    share_slots: int
    publish_interval: float
    tick: float = 1.0
    mps_pipe_dir: Path | None = None
    # Node-local state that must outlive a killed agent (the pods it may have stopped).
    state_dir: Path | None = None
    # Where the host's cgroup hierarchies are mounted: throttled pods are frozen there.
    cgroup_root: Path = CGROUP_ROOT
    control: ControlParams = field(default_factory=ControlParams)
    enforcement: EnforcementParams = field(default_factory=EnforcementParams)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: GpuBackend,
        api: NodeApi,
        podresources: PodResourcesClient,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.backend = backend
        self.api = api
        self.podresources = podresources
        self.checkpoint = DeviceCheckpoint(config.plugin_dir)
        self._checkpoint_problem: str | None = None
        self.clock = clock
        self.devices = DeviceMap(backend.inventory(), config.share_slots)
        self.socket_dir = str(config.socket_dir) if config.socket_dir else None
        self.layers = detect_layers(config.socket_dir, config.mps_pipe_dir)
        self.mps_pipe_dir = str(config.mps_pipe_dir) if self.layers.mps else None
        self.metrics = AgentMetrics(config.node)
        self.coordinator = Coordinator(self.devices, config.control, config.enforcement)
        self.sdk = (
            SdkServer(
                config.socket_dir / SOCKET_NAME,
                pod_uid_of,
                self.coordinator.record_steps,
                self.coordinator.caps_of,
            )
            if config.socket_dir
            else None
        )
        self.throttler = (
            Throttler(
                config.enforcement.throttle_period_seconds,
                CgroupFreezer(config.cgroup_root),
                state_file=config.state_dir / THROTTLE_STATE if config.state_dir else None,
            )
            if self.layers.stop_continue
            else None
        )
        self.control = ControlLoop(
            self.coordinator,
            backend,
            api,
            self.kubelet,
            self.sdk,
            self.throttler,
            self.metrics,
        )
        self.plugins = [DevicePlugin(r, self, config.plugin_dir) for r in RESOURCES]
        self.gate = UtilizationGate(config.publish_interval)
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._unhealthy: dict[int, str] = {}
        self._samples: list[GpuSample] = []
        self._kubelet: dict[tuple[str, str], PodDevices] = {}
        self._topology_dirty = True
        # What the kubelet held at the last look whose assigned-gpus is written (or whose pod
        # is gone): (namespace, name, pod UID, devices), see assignments.kubelet_keys.
        self._confirmed: set[tuple[str, str, str, tuple[tuple[str, tuple[str, ...]], ...]]] = set()
        self._checked_at = float("-inf")
        self._topology_at = float("-inf")

    # ----- NodeView, asked by the device plugins ------------------------------------------

    def unhealthy(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._unhealthy)

    def node_for(self, resource: str) -> NodeState:
        with self._lock:
            allocated = allocated_devices(self._kubelet.values())
            samples = list(self._samples)
        return observed_node(self.config.node, self.devices, self.unhealthy(), samples, allocated)

    def steering_for(self, resource: str, size: int) -> Steering:
        try:
            pods = self.api.pods_on_node(POD_LIST_TIMEOUT)
        except Exception as err:  # a slow API server must not fail the kubelet's admission
            log.warning("no plan lookup for %s x%d: %s", resource, size, err)
            return Steering()
        try:
            pods += self.api.gang_pods_not_bound(POD_LIST_TIMEOUT)
        except Exception as err:
            log.warning("no lookup of plans for pods not bound yet: %s", err)
        with self._lock:
            admitted = set(self._kubelet)
        return steering_for_request(pods, admitted, resource, size, self.config.node)

    def allocated(self) -> None:
        self.wake.set()

    def kubelet(self) -> dict[tuple[str, str], PodDevices]:
        with self._lock:
            return dict(self._kubelet)

    # ----- loops --------------------------------------------------------------------------

    def run(self) -> None:
        health = threading.Thread(target=self._health_loop, name="health", daemon=True)
        health.start()
        control = threading.Thread(target=self._control_loop, name="coordinator", daemon=True)
        control.start()
        if self.sdk is not None:
            self.sdk.start()
        if self.throttler is not None:
            self.throttler.start()
        log.info("enforcement layers: %s", self.layers.annotation())
        try:
            while not self.stopping.is_set():
                self.step()
                self.wake.wait(self.config.tick)
                if self.wake.is_set():
                    # An Allocate just happened: PodResources shows it once the container is
                    # created, so look again shortly.
                    self.wake.clear()
                    self.stopping.wait(0.3)
        finally:
            self.stopping.set()
            for plugin in self.plugins:
                plugin.stop()
            if self.sdk is not None:
                self.sdk.stop()
            if self.throttler is not None:
                self.throttler.stop()  # continues everything it stopped
            self.backend.close()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def step(self) -> None:
        """One pass: plugins served and registered, the Node published, assignments read back."""
        for name, action in (
            ("device plugins", self._serve_plugins),
            ("node", self._publish),
            ("assignments", self._read_back),
        ):
            try:
                action()
            except Exception as err:  # one failing part must not stop the others
                log.warning("%s: %s", name, err)

    def _health_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                events = self.backend.health_events(1.0)
            except Exception as err:
                log.warning("health events: %s", err)
                self.stopping.wait(1.0)
                continue
            fresh = False
            with self._lock:
                for event in events:
                    if event.index not in self._unhealthy:
                        self._unhealthy[event.index] = event.reason
                        fresh = True
                        log.error("GPU %d marked unhealthy: %s", event.index, event.reason)
                if fresh:
                    self._topology_dirty = True
            if fresh:
                for plugin in self.plugins:
                    plugin.notify()
                self.wake.set()

    def _control_loop(self) -> None:
        while not self.stopping.wait(self.config.control.period_seconds):
            try:
                self.control.once()
            except Exception as err:  # the next period tries again
                log.warning("coordinator: %s", err)

    def _serve_plugins(self) -> None:
        for plugin in self.plugins:
            if plugin.needs_restart():
                log.info("serving and registering %s", plugin.resource)
                plugin.start()

    def _publish(self) -> None:
        samples = self.backend.samples()
        now = self.clock()
        with self._lock:
            self._samples = samples
            # Also now and then, in case something else rewrote or removed the annotation.
            dirty = self._topology_dirty or now - self._topology_at >= RECHECK_SECONDS
        if dirty:
            node = self.api.read_node()
            meta = node.get("metadata") or {}
            patch = topology_patch(
                self.devices.inventory,
                self.unhealthy(),
                self.config.share_slots,
                meta.get("labels") or {},
                meta.get("annotations") or {},
            )
            layers = self.layers.annotation()
            if (meta.get("annotations") or {}).get(NODE_ENFORCEMENT) != layers:
                patch = patch or {"metadata": {"annotations": {}}}
                patch["metadata"].setdefault("annotations", {})[NODE_ENFORCEMENT] = layers
            if patch is not None:
                self.api.patch_node(patch)
                log.info("published GPU topology on node %s", self.config.node)
            with self._lock:
                self._topology_dirty = False
            self._topology_at = now
        self.metrics.gpus(samples)
        utilization = self.gate.patch_if_due(now, samples)
        if utilization is not None:
            self.api.patch_node(utilization)

    def _read_back(self) -> None:
        kubelet = self.podresources.list()
        by_uid = self._read_checkpoint()
        with self._lock:
            self._kubelet = kubelet
        now = self.clock()
        # Listing pods every pass would cost the API server a request per node per second;
        # ask only when the kubelet holds something not yet confirmed, or to re-check now and
        # then that nobody changed what was written.
        current = kubelet_keys(kubelet, by_uid)
        self._confirmed &= current
        if not current:
            return
        if current <= self._confirmed and now - self._checked_at < RECHECK_SECONDS:
            return
        self._checked_at = now
        pods = self.api.pods_on_node()
        changes = detect_assignments(self.devices, kubelet, pods, by_uid)
        unwritten: set[tuple[str, str]] = set()
        for change in changes:
            indices = encode_gpu_indices(change.indices)
            if not self.api.record_assignment(change.namespace, change.name, change.uid, indices):
                unwritten.add((change.namespace, change.name))
                continue
            log.info("%s/%s: assigned GPUs %s", change.namespace, change.name, indices)
            if change.differs_from_plan:
                self.api.pod_event(
                    change.namespace,
                    change.name,
                    change.uid,
                    "Warning",
                    DIFFERS_FROM_PLAN,
                    change.event_message(),
                )
        self._confirmed = {k for k in current if (k[0], k[1]) not in unwritten}

    def _read_checkpoint(self) -> DevicesByUid | None:
        """The kubelet's devices by pod UID; None (names alone then) when it cannot be read."""
        try:
            by_uid = self.checkpoint.read()
        except CheckpointError as err:
            if self._checkpoint_problem != str(err):
                log.warning("kubelet device checkpoint unreadable (%s): pods matched by name", err)
            self._checkpoint_problem = str(err)
            return None
        self._checkpoint_problem = None
        return by_uid
