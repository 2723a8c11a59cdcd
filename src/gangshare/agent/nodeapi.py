"""The agent's door to the API server: its own Node, the pods bound to it, their events."""

from __future__ import annotations

import logging
import socket
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.core.annotations import JOB_LABEL, POD_ASSIGNED_GPUS
from gangshare.kube.client import post_event

log = logging.getLogger("gangshare.agent")
REPORTING_CONTROLLER = "gangshare.io/agent"
# Kept short: GetPreferredAllocation reads pods while the kubelet waits on it.
POD_LIST_TIMEOUT = (2.0, 3.0)


class NodeApi:
    def __init__(self, api_client: client.ApiClient, node: str) -> None:
        self.node = node
        self.core = client.CoreV1Api(api_client)
        self.events = client.EventsV1Api(api_client)
        self.instance = f"{node}/{socket.gethostname()}"

    def read_node(self) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            self.core.api_client.sanitize_for_serialization(self.core.read_node(self.node)),
        )

    def patch_node(self, patch: dict[str, Any]) -> None:
        self.core.patch_node(self.node, patch)

    def pods_on_node(self, timeout: tuple[float, float] | None = None) -> list[dict[str, Any]]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", _request_timeout=timeout
        )
        items: list[dict[str, Any]] = self.core.api_client.sanitize_for_serialization(response)[
            "items"
        ]
        return items

    def gang_pods_not_bound(
        self, timeout: tuple[float, float] | None = None
    ) -> list[dict[str, Any]]:
        """Gang workers no node has yet, from the API server's cache: their plans name nodes."""
        response = self.core.list_pod_for_all_namespaces(
            label_selector=JOB_LABEL,
            field_selector="spec.nodeName=",
            resource_version="0",
            _request_timeout=timeout,
        )
        items: list[dict[str, Any]] = self.core.api_client.sanitize_for_serialization(response)[
            "items"
        ]
        return items

    def record_assignment(self, namespace: str, name: str, uid: str, indices: str) -> bool:
        """Write the assigned GPUs on the pod; False when the pod is gone or was replaced."""
        return self.annotate_pod(namespace, name, uid, {POD_ASSIGNED_GPUS: indices})

    def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: dict[str, str]
    ) -> bool:
        """False when the pod is gone or was replaced (the uid precondition)."""
        patch = {"metadata": {"uid": uid, "annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(name, namespace, patch)
        except ApiException as err:
            if err.status in (404, 409, 422):
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> str | None:
        """Delete the pod with this grace (the uid precondition guards a replacement); why
        not, if refused. Not the Eviction API: see control_loop.py."""
        options = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=client.V1Preconditions(uid=uid),
        )
        try:
            self.core.delete_namespaced_pod(name, namespace, body=options)
        except ApiException as err:
            if err.status in (404, 409):
                return None  # gone, or replaced by a new pod: nothing of this one to remove
            return f"{err.status} {err.reason}"
        return None

    def pod_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        kind: str,
        reason: str,
        message: str,
        action: str = "AssignGPUs",
    ) -> None:
        regarding = client.V1ObjectReference(
            api_version="v1", kind="Pod", name=name, namespace=namespace, uid=uid
        )
        post_event(
            self.events,
            regarding,
            kind,
            reason,
            message,
            action,
            REPORTING_CONTROLLER,
            self.instance,
        )
