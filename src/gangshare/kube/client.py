"""A Kubernetes API client for gangshare's processes: timeouts on every call, and events.

The operator, the extender and the node agent each connect with `connect` and report with
`post_event`; this is their shared plumbing, so none of them imports another.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gangshare.kube")

# (connect, read) seconds for every API call that does not set its own: a hung API server
# must turn into an error the caller retries, never a thread that waits forever.
DEFAULT_TIMEOUT = (5.0, 60.0)
# Lease calls must end well within the renew deadline (operator/leader.py).
LEASE_TIMEOUT = (2.0, 3.0)


class TimeoutApiClient(client.ApiClient):
    """An ApiClient whose calls time out by default (watches pass a longer read timeout)."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = DEFAULT_TIMEOUT
        return super().call_api(*args, **kwargs)


def connect(kubeconfig: str | None, pool_size: int | None = None) -> client.ApiClient:
    """An API client; `pool_size` keeps that many connections open for reuse (the default,
    5 per CPU, is for a few threads)."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return TimeoutApiClient(configuration=configuration)


def post_event(
    events: client.EventsV1Api,
    regarding: client.V1ObjectReference,
    kind: str,
    reason: str,
    message: str,
    action: str,
    controller: str,
    instance: str,
) -> None:
    """An events.k8s.io event about `regarding`. An event is a courtesy and must never fail
    the caller's work, but a refused one is logged."""
    namespace = cast(str, regarding.namespace)  # every object we report on is namespaced
    event = client.EventsV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{regarding.name}-", namespace=namespace),
        event_time=datetime.now(UTC),
        type=kind,
        reason=reason,
        note=message[:1024],
        action=action,
        reporting_controller=controller,
        reporting_instance=instance,
        regarding=regarding,
    )
    try:
        events.create_namespaced_event(namespace, event)
    except ApiException as err:
        log.warning("event %s for %s/%s refused: %s", reason, namespace, regarding.name, err.reason)
