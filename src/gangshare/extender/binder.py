"""The bind step's API calls: read the pod, record its GPUs on it, then create the Binding."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.core.annotations import POD_PLANNED_GPUS, POD_PLANNED_NODE, encode_gpu_indices


class BindError(RuntimeError):
    pass


class Binder:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as err:
            raise BindError(f"cannot read pod {namespace}/{name}: {err.reason}") from None
        pod: dict[str, Any] = json.loads(response.data)  # type: ignore[attr-defined]
        return pod

    def record_and_bind(self, pod: dict[str, Any], node: str, gpus: tuple[int, ...]) -> None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        wanted = {POD_PLANNED_NODE: node, POD_PLANNED_GPUS: encode_gpu_indices(gpus)}
        current = meta.get("annotations") or {}
        try:
            if any(current.get(k) != v for k, v in wanted.items()):
                # Written before the Binding: the node agent reads the plan when the kubelet asks.
                self.core.patch_namespaced_pod(
                    name, namespace, {"metadata": {"annotations": wanted}}
                )
            binding = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name, uid=meta.get("uid")),
                target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
            )
            self.core.create_namespaced_binding(namespace, binding, _preload_content=False)
        except ApiException as err:
            raise BindError(
                f"binding {namespace}/{name} to {node} failed: {err.status} {err.reason}"
            ) from None
