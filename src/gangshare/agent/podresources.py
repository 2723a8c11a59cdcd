"""The kubelet's PodResources API (v1): which device IDs each running container really got."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gangshare.agent.devices import RESOURCES
from gangshare.agent.kubeletapi import podresources_pb2 as api
from gangshare.agent.kubeletapi import podresources_pb2_grpc as rpc

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources socket did not answer; the message names it."""


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    # resource -> device IDs, over every container of the pod, for gangshare's resources only.
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def devices_by_pod(pods: Iterable[Any]) -> dict[tuple[str, str], PodDevices]:
    """(namespace, name) -> the pod's devices, from a List response's pod_resources."""
    out: dict[tuple[str, str], PodDevices] = {}
    for pod in pods:
        per_resource: dict[str, list[str]] = {}
        for container in pod.containers:
            for entry in container.devices:
                if entry.resource_name in RESOURCES:
                    per_resource.setdefault(entry.resource_name, []).extend(entry.device_ids)
        if per_resource:
            out[(pod.namespace, pod.name)] = PodDevices(
                pod.namespace, pod.name, {r: tuple(ids) for r, ids in per_resource.items()}
            )
    return out


def allocated_devices(pods: Iterable[PodDevices]) -> dict[str, list[str]]:
    """resource -> every device ID the kubelet has handed out on the node."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        for resource, ids in pod.devices.items():
            out.setdefault(resource, []).extend(ids)
    return out


class PodResourcesClient:
    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout

    def list(self) -> dict[tuple[str, str], PodDevices]:
        try:
            with grpc.insecure_channel(f"unix://{self.socket}") as channel:
                response = rpc.PodResourcesListerStub(channel).List(  # type: ignore[no-untyped-call]
                    api.ListPodResourcesRequest(), timeout=self.timeout
                )
        except grpc.RpcError as err:
            raise PodResourcesError(
                f"PodResources at {self.socket}: {err.code().name} {err.details()}"
            ) from None
        return devices_by_pod(response.pod_resources)
