"""The operator's calls for queued objects: the object, its pods' patches, its TrainingJob.
Beside KubeApi (same client, same fence: a replica that lost the lead writes nothing). Every
kind with an object goes through the generic object paths (/apis/<group>/...); a pod group,
which has none, is read from its pods and written to each of them (kube/podgroup.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.kube import podgroup
from gangshare.kube.client import post_event
from gangshare.kube.queued import WorkloadKind
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION
from gangshare.operator.kubeapi import (
    REPORTING_CONTROLLER,
    Conflict,
    Forbidden,
    Invalid,
    KubeApi,
    api_message,
)

MERGE_PATCH = "application/merge-patch+json"


class BatchApi:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def get(self, kind: WorkloadKind, namespace: str, name: str) -> dict[str, Any] | None:
        if kind.virtual:
            pods = self.api.list_labelled_pods(namespace, f"{podgroup.POD_GROUP_LABEL}={name}")
            return podgroup.group_object(namespace, name, pods)
        try:
            found = self.api.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    def _write(self, what: str, call: Callable[[], Any]) -> Any:
        """A fenced write; None when its object is gone, Invalid when refused for good,
        Conflict when it was conditional on a version someone has written over since."""
        self.api.fenced(what)
        try:
            return call()
        except ApiException as err:
            if err.status == 404:
                return None
            if err.status == 422:
                raise Invalid(api_message(err)) from None
            if err.status == 409:
                raise Conflict(f"{what}: {api_message(err)}") from None
            raise

    def patch(self, kind: WorkloadKind, namespace: str, name: str, body: dict[str, Any]) -> None:
        if kind.virtual:
            self._write_members(namespace, name, body)
            return
        self._write(
            f"patch of {kind.kind} {namespace}/{name}",
            lambda: self.api.custom.patch_namespaced_custom_object(
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                body,
                _content_type=MERGE_PATCH,
            ),
        )

    def _write_members(self, namespace: str, group: str, body: dict[str, Any]) -> None:
        """A pod group's write: made to each member (a reclaim's replaces each by a gated copy
        and then deletes it, so the group waits whole in its queue again)."""
        found = self.get(podgroup.PODGROUP, namespace, group)
        members = podgroup.members(found) if found is not None else []
        patch = {k: v for k, v in body.items() if k != podgroup.REPLACE_MEMBERS}
        metadata = {
            k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"
        }
        if body.get(podgroup.REPLACE_MEMBERS):
            for pod in members:
                if podgroup.resumed(pod):
                    self.api.create("Pod", namespace, podgroup.gated_copy(pod))
                    self.api.delete_pod(namespace, str(pod["metadata"]["name"]))
            for pod in podgroup.stale(found) if found is not None else []:
                self.api.delete_pod(namespace, str(pod["metadata"]["name"]))
            return
        for pod in members:
            if metadata:
                self.patch_pod(namespace, str(pod["metadata"]["name"]), {"metadata": metadata})

    def patch_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Forbidden when RBAC or an admission policy refuses it (the gang gate's lift)."""
        try:
            response = self._write(
                f"patch of pod {namespace}/{name}",
                lambda: self.api.core.patch_namespaced_pod(
                    name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
                ),
            )
        except ApiException as err:
            if err.status == 403:
                raise Forbidden(api_message(err)) from None
            raise
        if response is not None:
            self.api.pod_written(response)

    def create_workload(self, body: dict[str, Any]) -> bool:
        """Create a Job's TrainingJob; False when it exists already."""
        meta = body["metadata"]
        self.api.fenced(f"create of TrainingJob {meta['namespace']}/{meta['name']}")
        try:
            self.api.custom.create_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, body
            )
        except ApiException as err:
            if err.status == 409:
                return False
            if err.status == 422:
                raise Invalid(api_message(err)) from None
            raise
        return True

    def patch_workload_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self._write(
            f"spec write of TrainingJob {namespace}/{name}",
            lambda: self.api.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"spec": spec}
            ),
        )

    def post_event(
        self, job: dict[str, Any], kind: str, reason: str, message: str, action: str
    ) -> None:
        """An event about the queued object itself (a pod group's: about its first member):
        `kubectl describe` shows it."""
        if not self.api.fence():
            return
        if job.get("kind") == podgroup.KIND:
            first = next(iter(podgroup.members(job)), None)
            if first is None:
                return
            job = {"apiVersion": "v1", "kind": "Pod", **first}
        meta = job["metadata"]
        regarding = client.V1ObjectReference(
            api_version=job.get("apiVersion"),
            kind=job.get("kind"),
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid"),
            resource_version=meta.get("resourceVersion"),
        )
        post_event(
            self.api.events,
            regarding,
            kind,
            reason,
            message,
            action,
            REPORTING_CONTROLLER,
            self.api.instance,
        )
