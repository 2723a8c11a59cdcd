"""The device plugin over real gRPC on unix sockets, with a test double of the kubelet's
Registration service (the e2e tests use the real kubelet)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_fakes import make_spec

from gangshare.agent.devices import DeviceMap
from gangshare.agent.kubeletapi import deviceplugin_pb2 as api
from gangshare.agent.kubeletapi import deviceplugin_pb2_grpc as rpc
from gangshare.agent.plan import Steering
from gangshare.agent.plugin import DevicePlugin
from gangshare.agent.preference import observed_node
from gangshare.core.node import NodeState

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"


class Registrar(rpc.RegistrationServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Register(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return api.Empty()


class Kubelet:
    """Just the kubelet's registration socket, restartable like the real one."""

    def __init__(self, plugin_dir: Path) -> None:
        self.socket = plugin_dir / "kubelet.sock"
        self.registrar = Registrar()
        self.server: Any = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_RegistrationServicer_to_server(self.registrar, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()
        self.socket.unlink(missing_ok=True)


class View:
    def __init__(self, devices: DeviceMap) -> None:
        self.devices = devices
        self.socket_dir: str | None = "/run/gangshare"
        self.mps_pipe_dir: str | None = None
        self.sick: set[int] = set()
        self.plan: tuple[int, ...] | None = None
        self.allocations = 0

    def unhealthy(self) -> frozenset[int]:
        return frozenset(self.sick)

    def node_for(self, resource: str) -> NodeState:
        return observed_node("real-0", self.devices, self.sick, [], {})

    def steering_for(self, resource: str, size: int) -> Steering:
        return Steering(() if self.plan is None else (self.plan,))

    def allocated(self) -> None:
        self.allocations += 1


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Kubelet, View, DevicePlugin]]:
    kubelet = Kubelet(tmp_path)
    kubelet.start()
    view = View(make_spec().gpus(4).islands([0, 1], [2, 3]).devices(share_slots=2))
    plugin = DevicePlugin(GPU, view, tmp_path)
    plugin.start()
    yield kubelet, view, plugin
    plugin.stop()
    kubelet.stop()


def _stub(plugin: DevicePlugin) -> Any:
    channel = grpc.insecure_channel(f"unix://{plugin.socket}")
    return rpc.DevicePluginStub(channel)


def test_the_plugin_registers_its_resource_with_preferred_allocation(setup: Any) -> None:
    kubelet, _, plugin = setup
    [request] = kubelet.registrar.requests
    assert request.version == "v1beta1"
    assert request.resource_name == GPU
    assert request.endpoint == plugin.socket.name
    assert request.options.get_preferred_allocation_available


def test_list_and_watch_streams_a_health_change(setup: Any) -> None:
    _, view, plugin = setup
    stream = _stub(plugin).ListAndWatch(api.Empty(), timeout=10)
    first = next(stream)
    assert [d.health for d in first.devices] == ["Healthy"] * 4
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.append(next(stream)))
    reader.start()
    view.sick.add(1)
    plugin.notify()
    reader.join(5)
    assert [d.health for d in seen[0].devices] == ["Healthy", "Unhealthy", "Healthy", "Healthy"]
    stream.cancel()


def test_preferred_allocation_and_allocate_over_grpc(setup: Any) -> None:
    _, view, plugin = setup
    stub = _stub(plugin)
    uuids = view.devices.device_ids(GPU)
    preferred = stub.GetPreferredAllocation(
        api.PreferredAllocationRequest(
            container_requests=[
                api.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[uuids[0], uuids[2], uuids[3]], allocation_size=2
                )
            ]
        ),
        timeout=5,
    )
    assert list(preferred.container_responses[0].deviceIDs) == [uuids[2], uuids[3]]
    answer = stub.Allocate(
        api.AllocateRequest(
            container_requests=[api.ContainerAllocateRequest(devices_ids=[uuids[2], uuids[3]])]
        ),
        timeout=5,
    )
    envs = answer.container_responses[0].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[2]},{uuids[3]}"
    assert answer.container_responses[0].mounts[0].host_path == "/run/gangshare"
    assert view.allocations == 1


def test_allocate_refuses_a_device_it_never_offered_with_its_name(setup: Any) -> None:
    _, _, plugin = setup
    with pytest.raises(grpc.RpcError) as caught:
        _stub(plugin).Allocate(
            api.AllocateRequest(
                container_requests=[api.ContainerAllocateRequest(devices_ids=["GPU-forged"])]
            ),
            timeout=5,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "device ID 'GPU-forged' was never offered" in caught.value.details()


def test_a_restarted_kubelet_gets_the_plugin_registered_again(setup: Any) -> None:
    kubelet, _, plugin = setup
    assert not plugin.needs_restart()
    kubelet.stop()
    assert not plugin.needs_restart()  # no kubelet to register with yet
    kubelet.start()
    assert plugin.needs_restart()
    plugin.start()
    assert len(kubelet.registrar.requests) == 2
    assert not plugin.needs_restart()
