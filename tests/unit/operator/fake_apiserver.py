"""The raw kubernetes-client calls KubeApi makes, answered from memory and recorded.

Put in place of a real KubeApi's `core`, `custom` and `events` clients, it lets a test run the
real KubeApi (its write fence included) and the real Reconciler with no API server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from gangshare.operator.kubeapi import KubeApi

# The calls that change something on the API server.
WRITES = frozenset(
    {
        "patch_namespaced_custom_object_status",
        "create_namespaced_pod",
        "create_namespaced_service",
        "patch_namespaced_pod",
        "delete_namespaced_pod",
        "delete_namespaced_custom_object",
        "create_namespaced_event",
        "create_cluster_custom_object",
        "patch_cluster_custom_object_status",
    }
)


class Raw:
    """A raw response (`_preload_content=False`)."""

    def __init__(self, body: Any = None) -> None:
        self.data = json.dumps(body or {}).encode()

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


class FakeApiServer:
    """One TrainingJob and its pods. `during` runs inside a call (before it is answered), for
    a test to let time pass or the Lease change hands while a write is in flight."""

    def __init__(
        self,
        job: dict[str, Any],
        pods: list[dict[str, Any]],
        queues: list[dict[str, Any]] | None = None,
        others: list[dict[str, Any]] | None = None,
    ) -> None:
        self.job = job
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.queues = queues or []
        # Pods of other owners (listed only cluster-wide, by node).
        self.others = others or []
        self.calls: list[tuple[str, str]] = []
        self.during: dict[str, Callable[[], None]] = {}
        # Refuse a status write whose resourceVersion precondition is stale (409), as the API
        # server does.
        self.conflict_on_stale = False

    def writes(self) -> list[tuple[str, str]]:
        return [call for call in self.calls if call[0] in WRITES]

    def kube_api(self) -> KubeApi:
        from kubernetes import client

        api = KubeApi(client.ApiClient())
        api.core = api.custom = api.events = api.scheduling = self  # type: ignore[assignment]
        return api

    def _call(self, name: str, target: str) -> None:
        self.calls.append((name, target))
        hook = self.during.pop(name, None)
        if hook is not None:
            hook()

    # ----- TrainingJobs ----------------------------------------------------------------------

    def get_namespaced_custom_object(self, *args: Any, **_: Any) -> dict[str, Any]:
        self._call("get_namespaced_custom_object", args[-1])
        return json.loads(json.dumps(self.job))

    def patch_namespaced_custom_object_status(self, *args: Any, **_: Any) -> dict[str, Any]:
        name, body = args[-2], args[-1]
        self._call("patch_namespaced_custom_object_status", name)
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if self.conflict_on_stale and expected != self.job["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.job["status"] = {**(self.job.get("status") or {}), **body["status"]}
        version = int(self.job["metadata"]["resourceVersion"]) + 1
        self.job["metadata"]["resourceVersion"] = str(version)
        return json.loads(json.dumps(self.job))

    def delete_namespaced_custom_object(self, *args: Any, **_: Any) -> None:
        self._call("delete_namespaced_custom_object", args[4])

    # ----- pods, Services, events -------------------------------------------------------------

    def list_namespaced_pod(self, namespace: str, **_: Any) -> Raw:
        self._call("list_namespaced_pod", namespace)
        return Raw({"items": list(self.pods.values())})

    def list_pod_for_all_namespaces(self, field_selector: str = "", **_: Any) -> Raw:
        """Honours spec.nodeName=; every pod held is live."""
        self._call("list_pod_for_all_namespaces", field_selector)
        wanted = dict(
            part.split("=", 1) for part in field_selector.split(",") if "!=" not in part
        ).get("spec.nodeName")
        pods = [*self.pods.values(), *self.others]
        return Raw({"items": [p for p in pods if wanted in (None, p["spec"].get("nodeName"))]})

    def read_namespaced_service(self, name: str, namespace: str, **_: Any) -> None:
        self._call("read_namespaced_service", name)

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Raw:
        self._call("read_namespaced_pod", name)
        if name not in self.pods:
            raise ApiException(status=404)
        return Raw(self.pods[name])

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any], **_: Any) -> Raw:
        self._call("create_namespaced_pod", body["metadata"]["name"])
        if body["metadata"]["name"] in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        self.pods[body["metadata"]["name"]] = body
        return Raw(body)

    def create_namespaced_service(self, namespace: str, body: Any, **_: Any) -> None:
        self._call("create_namespaced_service", body["metadata"]["name"])

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **_: Any) -> Raw:
        self._call("patch_namespaced_pod", name)
        held = self.pods[name]
        if "schedulingGates" in (body.get("spec") or {}):
            held["spec"]["schedulingGates"] = []
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        held["metadata"].setdefault("annotations", {}).update(annotations)
        return Raw(held)

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Raw:
        self._call("delete_namespaced_pod", name)
        return Raw()

    def create_namespaced_event(self, namespace: str, event: Any, **_: Any) -> None:
        self._call("create_namespaced_event", event.reason)

    # ----- Queues and PriorityClasses (a scheduling pass's reads and writes) --------------------

    def list_cluster_custom_object(self, *args: Any, **_: Any) -> dict[str, Any]:
        self._call("list_cluster_custom_object", args[-1])
        return {"items": json.loads(json.dumps(self.queues))}

    def create_cluster_custom_object(self, *args: Any, **_: Any) -> None:
        self._call("create_cluster_custom_object", args[-1]["metadata"]["name"])

    def patch_cluster_custom_object_status(self, *args: Any, **_: Any) -> None:
        self._call("patch_cluster_custom_object_status", args[-2])

    def list_priority_class(self, **_: Any) -> Raw:
        self._call("list_priority_class", "")
        return Raw({"items": []})
