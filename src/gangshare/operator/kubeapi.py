"""The operator's only door to the API server: plain dicts in and out, errors sorted by kind.

Temporary errors (conflicts, timeouts, 5xx) are retried by the caller's next pass;
permanent ones (422 on a pod we built from the user's template) end the job.

Every write first asks `fence` whether this replica may still write (with leader election,
whether it still holds the Lease: operator/leader.py). A replica that lost the lead in the
middle of a reconcile or a pass makes no further write: the call raises LeadershipLost and
the work under way is abandoned; the new leader redoes it from what it reads.
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gangshare.core.annotations import JOB_LABEL, POD_GANG_READY
from gangshare.kube.client import LEASE_TIMEOUT, post_event
from gangshare.kube.queue import QUEUE_PLURAL
from gangshare.kube.trainingjob import API_VERSION, GROUP, KIND, PLURAL, VERSION

log = logging.getLogger("gangshare.operator")
REPORTING_CONTROLLER = "gangshare.io/operator"


class Conflict(Exception):
    """The object changed since it was read; reconcile again from a fresh read."""


class Invalid(Exception):
    """The API server refused an object as invalid (HTTP 422): retrying cannot help."""


class Forbidden(Exception):
    """The API server refused a write for who made it (HTTP 403: RBAC or an admission policy);
    only an administrator's change to either can make a retry succeed."""


class LeadershipLost(Exception):
    """This replica no longer leads: the write was not made and the work under way stops."""


class KubeApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.events = client.EventsV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.instance = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        # Told every TrainingJob as a status write returned it (the informers assume it).
        self.on_job_written: Callable[[dict[str, Any]], None] | None = None
        # Told each pod this operator created or ungated, as the API server answered.
        self.on_pod_written: Callable[[dict[str, Any]], None] | None = None
        # Whether this replica may write now; asked before every write (the leader Lease's
        # own calls aside). Without leader election it always may.
        self.fence: Callable[[], bool] = lambda: True

    def fenced(self, what: str) -> None:
        """Raises LeadershipLost instead of letting a replica that lost the lead write."""
        if not self.fence():
            raise LeadershipLost(f"{what} not made: this replica no longer holds the leader Lease")

    # ----- reads ------------------------------------------------------------------

    @staticmethod
    def _items(response: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(response.data)["items"]
        return items

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._items(self.core.list_node(_preload_content=False))

    def list_live_pods(self) -> list[dict[str, Any]]:
        selector = "status.phase!=Succeeded,status.phase!=Failed"
        return self._items(
            self.core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
        )

    def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list_labelled_pods(namespace, f"{JOB_LABEL}={job}")

    def list_labelled_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._items(
            self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
        )

    def list_node_pods(self, node: str) -> list[dict[str, Any]]:
        """The live pods bound to a node."""
        selector = f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
        return self._items(
            self.core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
        )

    def has_service(self, namespace: str, name: str) -> bool:
        try:
            self.core.read_namespaced_service(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def list_jobs(self) -> list[dict[str, Any]]:
        result = cast(
            dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        )
        items: list[dict[str, Any]] = result["items"]
        return items

    def list_queues(self) -> list[dict[str, Any]] | None:
        """Every Queue; None when the Queue CRD is not installed (flags alone then decide)."""
        try:
            result = cast(
                dict[str, Any],
                self.custom.list_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL),
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        items: list[dict[str, Any]] = result["items"]
        return items

    def list_priority_classes(self) -> dict[str, int] | None:
        """PriorityClass name -> value; None when they may not be read (templates' classes
        then go unjudged, with a warning, rather than every job waiting)."""
        try:
            response = self.scheduling.list_priority_class(_preload_content=False)
        except ApiException as err:
            if err.status in (401, 403):
                log.warning(
                    "PriorityClasses may not be read (%s): templates' classes unjudged", err.reason
                )
                return None
            raise
        return {
            str(item["metadata"]["name"]): int(item.get("value", 0))
            for item in self._items(response)
        }

    def create_queue(self, body: dict[str, Any]) -> bool:
        """Create a Queue; False when it exists already."""
        self.fenced(f"create of Queue {(body.get('metadata') or {}).get('name')}")
        try:
            self.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, body)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def patch_queue_status(self, name: str, status: dict[str, Any]) -> None:
        self.fenced(f"status write of Queue {name}")
        try:
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, QUEUE_PLURAL, name, {"status": status}
            )
        except ApiException as err:
            if err.status != 404:  # deleted meanwhile: nothing to report on
                raise

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job = cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return job

    # ----- the leader Lease (operator/leader.py) ------------------------------------

    def get_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        try:
            return self.coordination.read_namespaced_lease(
                name, namespace, _request_timeout=LEASE_TIMEOUT
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, lease: client.V1Lease) -> bool:
        """Create the Lease; False when another replica created it first."""
        try:
            self.coordination.create_namespaced_lease(
                namespace, lease, _request_timeout=LEASE_TIMEOUT
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def replace_lease(self, namespace: str, name: str, lease: client.V1Lease) -> bool:
        """Replace the Lease if it is still at the resourceVersion read; False: someone else
        wrote it meanwhile (lost the race)."""
        try:
            self.coordination.replace_namespaced_lease(
                name, namespace, lease, _request_timeout=LEASE_TIMEOUT
            )
        except ApiException as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    # ----- writes ------------------------------------------------------------------

    def patch_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch status, conditional on the resourceVersion the decision was made from."""
        meta = job["metadata"]
        self.fenced(f"status write of {meta['namespace']}/{meta['name']}")
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        try:
            patched = cast(
                dict[str, Any],
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body
                ),
            )
        except ApiException as err:
            if err.status in (404, 409):
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed; will retry") from None
            raise
        if self.on_job_written is not None:
            self.on_job_written(patched)
        return patched

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> bool:
        """Create a Pod or Service; False when it already exists (creation is idempotent)."""
        self.fenced(f"create of {kind} {namespace}/{(body.get('metadata') or {}).get('name')}")
        try:
            if kind == "Pod":
                self.pod_written(
                    self.core.create_namespaced_pod(
                        namespace, cast(Any, body), _preload_content=False
                    )
                )
            else:
                self.core.create_namespaced_service(namespace, cast(Any, body))
        except ApiException as err:
            if err.status == 409:
                return False
            if err.status == 422:
                raise Invalid(api_message(err)) from None
            raise
        except ValidationError as err:
            # The client checks field types before sending: as permanent as a 422.
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"][1:])  # drop the argument position
            raise Invalid(f"{where}: {first['msg']}") from None
        return True

    def lift_gate(self, namespace: str, pod: str) -> None:
        self.fenced(f"gate lift of pod {namespace}/{pod}")
        try:
            self.pod_written(
                self.core.patch_namespaced_pod(
                    pod, namespace, {"spec": {"schedulingGates": None}}, _preload_content=False
                )
            )
        except ApiException as err:
            if err.status == 403:
                raise Forbidden(api_message(err)) from None
            if err.status != 404:
                raise

    def nudge_pod(self, namespace: str, pod: str, mark: str) -> None:
        """A change to the pod itself, which is what makes kube-scheduler try it again."""
        self.fenced(f"nudge of pod {namespace}/{pod}")
        body = {"metadata": {"annotations": {POD_GANG_READY: mark}}}
        try:
            drain(self.core.patch_namespaced_pod(pod, namespace, body, _preload_content=False))
        except ApiException as err:
            if err.status != 404:
                raise

    def delete_pod(self, namespace: str, pod: str, force: bool = False) -> None:
        """Delete a pod; `force` removes it at once, for a pod whose kubelet is gone."""
        self.fenced(f"delete of pod {namespace}/{pod}")
        try:
            grace = 0 if force else None
            drain(
                self.core.delete_namespaced_pod(
                    pod, namespace, grace_period_seconds=grace, _preload_content=False
                )
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def pod_written(self, response: Any) -> None:
        """Hand a pod this operator wrote to `on_pod_written` (the pod store assumes it, so
        the next reconcile's view already has it); otherwise only drain the answer."""
        if self.on_pod_written is None:
            drain(response)
            return
        data = response.read()
        response.release_conn()
        self.on_pod_written(json.loads(data))

    def pod_controller_uid(self, namespace: str, pod: str) -> str | None:
        """The uid of the pod's controller ("" when it has none); None when there is no pod."""
        try:
            response = self.core.read_namespaced_pod(pod, namespace, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        meta = json.loads(response.data).get("metadata") or {}  # type: ignore[attr-defined]
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        return str(refs[0].get("uid", "")) if refs else ""

    def delete_job(self, namespace: str, name: str) -> None:
        self.fenced(f"delete of {namespace}/{name}")
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def post_event(
        self, job: dict[str, Any], kind: str, reason: str, message: str, action: str
    ) -> None:
        meta = job["metadata"]
        if not self.fence():
            return  # a courtesy, as ever never the caller's failure; the writes around it raise
        regarding = client.V1ObjectReference(
            api_version=API_VERSION,
            kind=KIND,
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid"),
            resource_version=meta.get("resourceVersion"),
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


def drain(response: Any) -> None:
    """Read and let go of a raw response whose body nobody needs: turning each answer into the
    client's model objects was most of the operator's CPU while it created a large gang."""
    response.read()
    response.release_conn()


def api_message(err: ApiException) -> str:
    try:
        message: str = json.loads(err.body or "{}").get("message") or str(err.reason)
    except (ValueError, AttributeError):
        message = str(err.reason)
    return message
