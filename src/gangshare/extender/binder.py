"""The verbs' API calls, made on the extender's event loop: the Binding and two read-throughs.

The bind step's one write is a Binding that carries the pod's GPU annotations. The API
server copies a Binding's annotations onto the pod in the same update that sets its node
(BindingREST.setPodNodeAndMetadata), so the GPUs are on the pod no later than the node is:
the node agent can never see one without the other.

Why not the kubernetes client: it blocks, so every bind needed a thread, and handing each
bind to a thread and its answer back to the loop (with the GIL between them and the
watches) cost more CPU than the bind itself. In bench/extender.py the bind verb took about
1 ms of extender CPU per pod that way (filter alone: 0.44 ms). Here a keep-alive aiohttp
pool on the loop writes the request and reads the answer in place. Credentials come from the
client's own Configuration (kubeconfig or in-cluster), re-read every few seconds so a rotated
token is picked up.
"""

from __future__ import annotations

import json
import ssl
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes import client

from gangshare.core.annotations import POD_PLANNED_GPUS, POD_PLANNED_NODE, encode_gpu_indices
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION

# Connections kept open to the API server: a bind that finds none idle opens one, and a TLS
# handshake costs more CPU (here and in kube-apiserver) than the whole bind otherwise does.
CONNECTIONS = 32
# A call on the wire ends within this, so a bind (after at most the gang barrier's 2 s)
# answers within kube-scheduler's 5 s extender httpTimeout, and a hung API server is a bind
# error the scheduler retries, not a verb that never answers. The wait for a free connection
# is not counted: kube-scheduler binds without limit, so a backlog of a thousand pods queues
# here, and counting the queue failed healthy binds (one 1,000-pod run: 413 of them).
CONNECT_SECONDS = 1.0
CALL_SECONDS = 2.5
# How long the credentials read from the Configuration are reused: reading them runs the
# client's refresh hook (a rotated in-cluster token, an exec plugin's), too dear per call.
CREDENTIALS_SECONDS = 10.0


class BindError(RuntimeError):
    pass


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
    """TLS as the client's Configuration says: its CA, its client certificate, or no checks."""
    if not str(configuration.host).startswith("https"):
        return False
    if not configuration.verify_ssl:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


def api_error(status: int, body: bytes) -> str:
    """The API server's Status message when it sent one, else the HTTP status."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{status} {message}" if message else str(status)


def seg(name: str) -> str:
    """One path segment: a name from the request can never reach another path."""
    return quote(name, safe="")


class Binder:
    def __init__(self, configuration: client.Configuration, connections: int = CONNECTIONS):
        self.configuration = configuration
        self.base = str(configuration.host).rstrip("/")
        self.ssl = ssl_context(configuration)
        self.server_hostname = getattr(configuration, "tls_server_name", None) or None
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._credentials: tuple[float, dict[str, str]] = (-CREDENTIALS_SECONDS, {})

    def credentials(self) -> dict[str, str]:
        """The headers that authenticate a call, as the client's own auth settings give them."""
        read_at, headers = self._credentials
        now = time.monotonic()
        if now - read_at >= CREDENTIALS_SECONDS:
            settings: dict[str, Any] = dict(self.configuration.auth_settings())
            headers = {
                str(auth["key"]): str(auth["value"])
                for auth in settings.values()
                if auth.get("in") == "header" and auth.get("value")
            }
            self._credentials = (now, headers)
        return headers

    def session(self) -> aiohttp.ClientSession:
        """Made on first use: a session belongs to the loop that runs the verbs."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.connections, ssl=self.ssl, keepalive_timeout=120
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=CONNECT_SECONDS, sock_read=CALL_SECONDS
                ),
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "gangshare-extender"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self, failed: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, bytes]:
        """(status, body bytes) of one call; a network failure or timeout is a BindError
        that starts with `failed`."""
        headers = {"Accept": "application/json", **self.credentials()}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        try:
            async with self.session().request(
                method,
                self.base + path,
                data=data,
                headers=headers,
                server_hostname=self.server_hostname,
            ) as response:
                return response.status, await response.read()
        except TimeoutError:  # aiohttp's own timeouts are this as well
            raise BindError(
                f"{failed}: timed out (no connection within {CONNECT_SECONDS:g} s "
                f"or no answer within {CALL_SECONDS:g} s)"
            ) from None
        except aiohttp.ClientError as err:
            raise BindError(f"{failed}: {str(err) or type(err).__name__}") from None

    async def _get(self, what: str, path: str) -> dict[str, Any] | None:
        status, body = await self.call(f"cannot read {what}", "GET", path)
        if status == 404:
            return None
        if status >= 300:
            raise BindError(f"cannot read {what}: {api_error(status, body)}")
        found: dict[str, Any] = json.loads(body)
        return found

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Only when the watch has not delivered the pod yet."""
        what = f"pod {namespace}/{name}"
        pod = await self._get(what, f"/api/v1/namespaces/{seg(namespace)}/pods/{seg(name)}")
        if pod is None:
            raise BindError(f"cannot read {what}: it does not exist")
        return pod

    async def read_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A gang worker's TrainingJob, when the watch has not delivered its plan yet
        (None: it does not exist)."""
        return await self._get(
            f"TrainingJob {namespace}/{name}",
            f"/apis/{GROUP}/{VERSION}/namespaces/{seg(namespace)}/{PLURAL}/{seg(name)}",
        )

    async def record_and_bind(self, pod: dict[str, Any], node: str, gpus: tuple[int, ...]) -> None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        annotations = (
            {POD_PLANNED_NODE: node, POD_PLANNED_GPUS: encode_gpu_indices(gpus)} if gpus else {}
        )
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": meta.get("uid"), "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        failed = f"binding {namespace}/{name} to {node} failed"
        path = f"/api/v1/namespaces/{seg(namespace)}/pods/{seg(name)}/binding"
        status, body = await self.call(failed, "POST", path, binding)
        if status >= 300:
            raise BindError(f"{failed}: {api_error(status, body)}")
