"""The kubelet device plugin (v1beta1) for one resource, served over a unix socket.

One `DevicePlugin` per resource (`nvidia.com/gpu`, `gangshare.io/gpu-share`). It registers with
the kubelet, streams device health in ListAndWatch, steers the kubelet's choice in
GetPreferredAllocation and answers Allocate from the device IDs it is given. When the kubelet
restarts it removes plugin sockets; the agent notices (`needs_restart`) and serves and
registers again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Protocol

import grpc

from gangshare.agent.allocation import allocate_container
from gangshare.agent.devices import DeviceError, DeviceMap, check_resource
from gangshare.agent.kubeletapi import deviceplugin_pb2 as api
from gangshare.agent.kubeletapi import deviceplugin_pb2_grpc as rpc
from gangshare.agent.plan import Steering
from gangshare.agent.preference import preferred_devices
from gangshare.core.annotations import GPU_RESOURCE
from gangshare.core.node import NodeState

log = logging.getLogger("gangshare.agent")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class NodeView(Protocol):
    """What a plugin asks the agent while the kubelet waits on it."""

    devices: DeviceMap
    socket_dir: str | None
    mps_pipe_dir: str | None

    def unhealthy(self) -> frozenset[int]: ...

    def node_for(self, resource: str) -> NodeState: ...

    def steering_for(self, resource: str, size: int) -> Steering: ...

    def allocated(self) -> None:
        """Called after every Allocate, so the assignment is read back soon."""
        ...


def socket_name(resource: str) -> str:
    return "gangshare-gpu.sock" if resource == GPU_RESOURCE else "gangshare-gpu-share.sock"


class Servicer(rpc.DevicePluginServicer):
    def __init__(self, resource: str, view: NodeView) -> None:
        self.resource = resource
        self.view = view
        self.changed = threading.Condition()
        self.generation = 0
        self.stopping = False

    def notify(self) -> None:
        with self.changed:
            self.generation += 1
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()

    def device_list(self) -> api.ListAndWatchResponse:
        sick = self.view.unhealthy()
        devices = self.view.devices
        return api.ListAndWatchResponse(
            devices=[
                api.Device(
                    ID=device_id,
                    health=UNHEALTHY
                    if devices.gpu_of(self.resource, device_id).index in sick
                    else HEALTHY,
                )
                for device_id in devices.device_ids(self.resource)
            ]
        )

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        with self.changed:
            seen = self.generation
        yield self.device_list()
        while context.is_active():
            with self.changed:
                if self.generation == seen and not self.stopping:
                    self.changed.wait(1.0)
                if self.stopping:
                    return
                if self.generation == seen:
                    continue
                seen = self.generation
            yield self.device_list()

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = []
        try:
            for ask in request.container_requests:
                node = self.view.node_for(self.resource)
                steer = self.view.steering_for(self.resource, ask.allocation_size)
                chosen = preferred_devices(
                    self.resource,
                    self.view.devices,
                    node,
                    list(ask.available_deviceIDs),
                    list(ask.must_include_deviceIDs),
                    ask.allocation_size,
                    steer.plans,
                    steer.avoid,
                )
                log.info(
                    "%s: preferred %s of %d available (plans %s, planned for others %s)",
                    self.resource,
                    ",".join(chosen),
                    len(ask.available_deviceIDs),
                    list(steer.plans),
                    sorted(steer.avoid),
                )
                responses.append(api.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        except DeviceError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return api.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        try:
            for ask in request.container_requests:
                answer = allocate_container(
                    self.resource,
                    self.view.devices,
                    list(ask.devices_ids),
                    self.view.socket_dir,
                    self.view.mps_pipe_dir,
                )
                responses.append(
                    api.ContainerAllocateResponse(
                        envs=answer.envs,
                        mounts=[
                            api.Mount(container_path=c, host_path=h, read_only=ro)
                            for c, h, ro in answer.mounts
                        ],
                        devices=[
                            api.DeviceSpec(container_path=c, host_path=h, permissions=p)
                            for c, h, p in answer.devices
                        ],
                    )
                )
        except DeviceError as err:
            log.error("Allocate refused: %s", err)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        self.view.allocated()
        return api.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api.PreStartContainerResponse()


class DevicePlugin:
    def __init__(self, resource: str, view: NodeView, plugin_dir: Path) -> None:
        self.resource = check_resource(resource)
        self.view = view
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / socket_name(resource)
        self.servicer: Servicer | None = None
        self.server: Any = None
        self._kubelet_identity: tuple[int, int] | None = None

    def start(self) -> None:
        """Serve on the plugin socket and register with the kubelet."""
        self.stop()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self.servicer = Servicer(self.resource, self.view)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        rpc.add_DevicePluginServicer_to_server(self.servicer, self.server)  # type: ignore[no-untyped-call]
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        self._register()

    def _register(self) -> None:
        kubelet = self.plugin_dir / KUBELET_SOCKET
        # Read before registering: a kubelet that restarts during the call leaves a socket
        # newer than this, so the next pass registers again with the new one.
        identity = self._kubelet_socket_identity()
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            rpc.RegistrationStub(channel).Register(  # type: ignore[no-untyped-call]
                api.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource,
                    options=api.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=10,
            )
        self._kubelet_identity = identity
        log.info("registered %s with the kubelet at %s", self.resource, kubelet)

    def _kubelet_socket_identity(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.plugin_dir / KUBELET_SOCKET)
        except OSError:
            return None
        return (stat.st_ino, stat.st_ctime_ns)

    def needs_restart(self) -> bool:
        """The kubelet restarted (its socket is new) or removed ours: serve and register again."""
        if self.server is None:
            return True
        current = self._kubelet_socket_identity()
        return current is not None and (
            current != self._kubelet_identity or not self.socket.exists()
        )

    def notify(self) -> None:
        if self.servicer is not None:
            self.servicer.notify()

    def stop(self) -> None:
        if self.servicer is not None:
            self.servicer.stop()
        if self.server is not None:
            self.server.stop(grace=1).wait(2)
        self.server = self.servicer = None
