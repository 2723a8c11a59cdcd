"""The coordinator on a node (agent/coordinator.py, sdkserver.py): tenants from PodResources,
steps from the SDK socket, caps back to the right pod only, memory overruns evicted."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from gangshare.agent.backend import GpuInfo, GpuProcess, Inventory
from gangshare.agent.coordinator import Coordinator, PodInfo, memory_by_pod
from gangshare.agent.devices import DeviceMap
from gangshare.agent.podresources import PodDevices
from gangshare.agent.sdkserver import SdkServer
from gangshare.core.clock import ManualClock
from gangshare.core.coordinator import ControlParams
from gangshare.core.enforcement import EnforcementParams
from gangshare.sdk.wire import WireCaps, encode

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"
INVENTORY = Inventory(
    (GpuInfo(0, "GPU-a", "M", 16384), GpuInfo(1, "GPU-b", "M", 16384)), ((0, 0), (0, 0))
)
PODS = {
    ("t", "g"): PodInfo("uid-g", "t", "g", "t/g"),
    ("t", "o0"): PodInfo("uid-o0", "t", "o0", "t/o"),
    ("t", "o1"): PodInfo("uid-o1", "t", "o1", "t/o"),
}


def kubelet(with_opportunistic: bool) -> dict[tuple[str, str], PodDevices]:
    held = {("t", "g"): PodDevices("t", "g", {GPU: ("GPU-a",)})}
    if with_opportunistic:
        held[("t", "o0")] = PodDevices("t", "o0", {SHARE: ("GPU-a::1",)})
        held[("t", "o1")] = PodDevices("t", "o1", {SHARE: ("GPU-b::0",)})
    return held


def test_caps_go_to_opportunistic_pods_only_and_a_gang_moves_together() -> None:
    clock = ManualClock(100.0)
    coordinator = Coordinator(DeviceMap(INVENTORY, 4), ControlParams(), clock=clock.now)
    for _ in range(3):  # alone: the guaranteed pod's baseline comes for free
        coordinator.record_steps("uid-g", (0.1,) * 5, None)
        coordinator.decide(kubelet(False), PODS, {})
        clock.advance(2)
    coordinator.record_steps("uid-g", (0.1,) * 5, None)
    outcome = coordinator.decide(kubelet(True), PODS, {"uid-g": {0: 6000}})
    assert set(outcome.caps) == {"uid-o0", "uid-o1"}
    # o1's GPU has no guaranteed tenant, but its gang's rank beside one sets the pace.
    assert outcome.caps["uid-o0"].duty == outcome.caps["uid-o1"].duty == 0.05
    assert outcome.caps["uid-o0"].memory_mib == 16384 - 6000 - 1024
    assert outcome.caps["uid-o1"].memory_mib == 16384
    assert {c.generation for c in outcome.changed.values()} == {1, 2}
    # Unchanged caps are not sent again.
    clock.advance(2)
    coordinator.record_steps("uid-g", (0.1,) * 5, None)
    again = coordinator.decide(kubelet(True), PODS, {"uid-g": {0: 6000}})
    assert again.caps["uid-o0"].duty > 0.05 and set(again.changed) == {"uid-o0", "uid-o1"}
    assert coordinator.caps_of("uid-g") is None


def test_a_pod_over_its_memory_cap_past_the_grace_is_to_be_evicted() -> None:
    clock = ManualClock(100.0)
    enforcement = EnforcementParams(memory_grace_seconds=4)
    coordinator = Coordinator(DeviceMap(INVENTORY, 4), enforcement=enforcement, clock=clock.now)
    memory = {"uid-g": {0: 8000}, "uid-o0": {0: 9000}}
    assert coordinator.decide(kubelet(True), PODS, memory).evictions == []
    clock.advance(4)
    evictions = coordinator.decide(kubelet(True), PODS, memory).evictions
    assert [e.uid for e in evictions] == ["uid-o0"]
    assert "9000 MiB of GPU memory against a cap of 7360 MiB" in evictions[0].message


def test_an_opportunistic_pod_without_an_sdk_is_throttled_after_its_grace() -> None:
    clock = ManualClock(100.0)
    coordinator = Coordinator(DeviceMap(INVENTORY, 4), clock=clock.now)
    coordinator.record_steps("uid-g", (0.1,) * 10, None)
    first = coordinator.decide(kubelet(True), PODS, {})
    assert first.throttled == {}  # just capped: its SDK may still be starting
    clock.advance(EnforcementParams().report_timeout_seconds)
    coordinator.record_steps("uid-o1", (0.05,), 7)
    later = coordinator.decide(kubelet(True), PODS, {})
    assert set(later.throttled) == {"uid-o0"} and later.throttled["uid-o0"][0] == "NoSdk"
    # The backstop takes the whole gang on this node, never one rank.
    assert set(later.backstop) == {"uid-o0", "uid-o1"}
    assert coordinator.steps_done("uid-o1") == 7


def test_memory_is_summed_per_pod_and_gpu_from_host_pids() -> None:
    pods = {10: "a", 11: "a", 12: None}
    processes = [GpuProcess(0, 10, 100), GpuProcess(0, 11, 50), GpuProcess(1, 11, 7)]
    processes.append(GpuProcess(0, 12, 999))
    assert memory_by_pod(processes, pods.get) == {"a": {0: 150, 1: 7}}


def test_the_socket_names_the_pod_from_the_kernel_and_sends_caps_to_it_only(
    tmp_path: Path,
) -> None:
    got: list[tuple[str, tuple[float, ...], int | None]] = []
    me = os.getpid()
    server = SdkServer(
        tmp_path / "agent.sock",
        lambda pid: "uid-me" if pid == me else None,
        lambda uid, steps, count: got.append((uid, steps, count)),
        lambda uid: WireCaps(0.5, 1000, 3) if uid == "uid-me" else None,
    )
    server.start()
    try:
        sdk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sdk.connect(str(tmp_path / "agent.sock"))
        sdk.settimeout(5)
        sdk.sendall(encode({"hello": {"sdk": "t"}}) + encode({"steps": [0.2, 0.3], "count": 2}))
        hello_caps = json.loads(sdk.makefile("rb").readline())
        assert hello_caps["caps"] == {"duty": 0.5, "memoryMiB": 1000, "generation": 3}
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [("uid-me", (0.2, 0.3), 2)]
        assert server.connected() == {"uid-me": 1}
        server.push("uid-other", WireCaps(0.1, 1, 4))
        server.push("uid-me", WireCaps(0.9, 2, 5))
        pushed = json.loads(sdk.makefile("rb").readline())
        assert pushed["caps"]["generation"] == 5  # never the other pod's
        sdk.sendall(encode({"steps": [-1]}))
        refused = json.loads(sdk.makefile("rb").readline())
        assert "steps[0]" in refused["error"]
        sdk.close()
    finally:
        server.stop()
