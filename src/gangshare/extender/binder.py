"""The bind step's one API call: a Binding that carries the pod's GPU annotations.

The API server copies a Binding's annotations onto the pod in the same update
that sets its node (BindingREST.setPodNodeAndMetadata), so the GPUs are on the
pod no later than the node is: the node agent can never see one without the other.
"""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gangshare.core.annotations import POD_PLANNED_GPUS, POD_PLANNED_NODE, encode_gpu_indices
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION


class BindError(RuntimeError):
    pass


def _done_with(response: Any) -> bytes:
    """Read an unparsed response to its end and hand its connection back to the pool. Left
    unread, the connection is never reused: the next call opens a new one, and its TLS
    handshake costs more CPU (here and in kube-apiserver) than the call itself."""
    data: bytes = response.data
    response.release_conn()
    return data


class Binder:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Only when the watch has not delivered the pod yet."""
        try:
            response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as err:
            raise BindError(f"cannot read pod {namespace}/{name}: {err.reason}") from None
        except HTTPError as err:  # a timeout or a dropped connection: kube-scheduler retries
            raise BindError(f"cannot read pod {namespace}/{name}: {err}") from None
        pod: dict[str, Any] = json.loads(_done_with(response))
        return pod

    def read_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A gang worker's TrainingJob, when the watch has not delivered its plan yet
        (None: it does not exist)."""
        try:
            response = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise BindError(f"cannot read TrainingJob {namespace}/{name}: {err.reason}") from None
        except HTTPError as err:
            raise BindError(f"cannot read TrainingJob {namespace}/{name}: {err}") from None
        job: dict[str, Any] = json.loads(_done_with(response))
        return job

    def record_and_bind(self, pod: dict[str, Any], node: str, gpus: tuple[int, ...]) -> None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        annotations = (
            {POD_PLANNED_NODE: node, POD_PLANNED_GPUS: encode_gpu_indices(gpus)} if gpus else {}
        )
        # A plain dict: the client's model objects cost more CPU than the call itself.
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": meta.get("uid"), "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            response = self.core.create_namespaced_binding(
                namespace, cast(Any, binding), _preload_content=False
            )
            _done_with(response)
        except ApiException as err:
            raise BindError(
                f"binding {namespace}/{name} to {node} failed: {err.status} {err.reason}"
            ) from None
        except HTTPError as err:
            raise BindError(f"binding {namespace}/{name} to {node} failed: {err}") from None
