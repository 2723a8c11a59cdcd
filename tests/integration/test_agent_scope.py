"""The node agent's reach is its own node (issue #25, item 7), on the real API server.

The chart's agent ServiceAccount, ClusterRole and binding and its admission policies
(agent-node-scope, reserved-pod-keys) are rendered by helm and applied; two KWOK nodes each get an
"agent" pod under that account, and each agent's credentials are a TokenRequest token bound to its
pod, as the kubelet's projected token is, so the API server names the pod's node in the token
(user extra authentication.kubernetes.io/node-name). Agent A may write node A and the pods bound
to it, and nothing of node B; a token bound to no pod may write nothing.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from chart import apply, delete, render, service_account_token, token_client
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import Kube, NodePool, eventually, new_namespace

pytestmark = pytest.mark.integration
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
TEMPLATES = ["agent-rbac.yaml", "agent-admission-policy.yaml", "admission-policies.yaml"]


@dataclass
class Scope:
    namespace: str  # the agent's
    account: str
    nodes: tuple[str, str]
    tenant_namespace: str
    agents: tuple[client.CoreV1Api, client.CoreV1Api]  # A's and B's credentials
    unbound: client.CoreV1Api  # the agent's account, token bound to no pod


def plain_pod(name: str, node: str | None, account: str | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            # Unbound ones stay so: no scheduler answers to this name.
            scheduler_name="no-such-scheduler",
            service_account_name=account,
            containers=[client.V1Container(name="c", image="example.invalid/agent:1")],
        ),
    )


@pytest.fixture(scope="module")
def scope(kube: Kube) -> Iterator[Scope]:
    release = f"scope-{uuid.uuid4().hex[:6]}"
    namespaces = [new_namespace(kube), new_namespace(kube)]
    ns, tenants = (next(made) for made in namespaces)
    manifests = render(
        kube,
        release,
        ns,
        TEMPLATES,
        "admissionPolicies.templates=false",
        "admissionPolicies.shareGrace=false",
    )
    account = f"{release}-gangshare-agent"
    pool = NodePool(kube, tenants)
    apply(kube, manifests)
    try:
        a, b = pool.nodes(2, 1)
        agents = []
        for node in (a, b):
            pod = kube.core.create_namespaced_pod(ns, plain_pod(f"agent-{node}", node, account))
            token = service_account_token(kube, ns, account, pod)
            api = token_client(kube, token)
            # The API server did bind the node into the token: the policy has something to read.
            review = client.AuthenticationV1Api(api).create_self_subject_review(
                client.V1SelfSubjectReview()
            )
            assert review.status.user_info.extra[NODE_NAME_KEY] == [node], review.status
            agents.append(client.CoreV1Api(api))
        unbound = client.CoreV1Api(token_client(kube, service_account_token(kube, ns, account)))
        yield Scope(ns, account, (a, b), tenants, (agents[0], agents[1]), unbound)
    finally:
        kube.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        kube.core.delete_collection_namespaced_pod(tenants, grace_period_seconds=0)
        pool.cleanup()
        delete(kube, manifests)
        for made in namespaces:
            next(made, None)


def refusal(call: Any) -> ApiException | None:
    """The API's refusal of `call()`, or None when it was allowed."""
    try:
        call()
    except ApiException as err:
        return err
    return None


def refused_with(call: Any, message: str) -> ApiException:
    """Refused (403) naming `message`; waits out the policy reaching admission's informers."""

    def refused() -> ApiException | None:
        err = refusal(call)
        return err if err is not None and err.status == 403 and message in str(err.body) else None

    return eventually(refused, timeout=30, what=f"refused with {message!r}")


def annotate(key: str, value: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


def test_an_agent_writes_its_own_node_and_no_other(scope: Scope):
    (a, b), (agent_a, agent_b) = scope.nodes, scope.agents
    err = refused_with(
        lambda: agent_a.patch_node(b, annotate("gangshare.io/gpu-topology", "forged")),
        f"metadata.name: the agent of node {a} may write only its own Node, not {b}",
    )
    assert "gangshare-agent-node-scope" in str(err.body)
    agent_a.patch_node(a, annotate("gangshare.io/gpu-topology", "{}"))
    agent_b.patch_node(b, annotate("gangshare.io/gpu-topology", "{}"))


def test_an_agent_patches_and_deletes_only_pods_bound_to_its_node(scope: Scope, kube: Kube):
    (a, b), (agent_a, _) = scope.nodes, scope.agents
    ns = scope.tenant_namespace
    on_a = kube.core.create_namespaced_pod(ns, plain_pod("worker-a", a))
    on_b = kube.core.create_namespaced_pod(ns, plain_pod("worker-b", b))
    unbound = kube.core.create_namespaced_pod(ns, plain_pod("worker-unbound", None))
    on_node = f"spec.nodeName: the agent of node {a} may write or delete only pods bound to it"
    refused_with(
        lambda: agent_a.patch_namespaced_pod("worker-b", ns, annotate("example.com/x", "1")),
        f"{on_node}; {ns}/worker-b is on {b}",
    )
    refused_with(
        lambda: agent_a.delete_namespaced_pod("worker-b", ns, grace_period_seconds=0),
        f"{on_node}; {ns}/worker-b is on {b}",
    )
    refused_with(
        lambda: agent_a.patch_namespaced_pod("worker-unbound", ns, annotate("example.com/x", "1")),
        f"{ns}/worker-unbound is bound to no node",
    )
    # Nor a GPU assignment forged on node B's pod (both policies refuse it).
    forged = refusal(
        lambda: agent_a.patch_namespaced_pod(
            "worker-b", ns, annotate("gangshare.io/assigned-gpus", "0")
        )
    )
    assert forged is not None and forged.status == 403
    # On its own node the agent records the kubelet's assignment (a reserved key) and deletes an
    # over-cap pod, with a uid precondition.
    agent_a.patch_namespaced_pod("worker-a", ns, annotate("gangshare.io/assigned-gpus", "0"))
    agent_a.delete_namespaced_pod(
        "worker-a",
        ns,
        body=client.V1DeleteOptions(
            grace_period_seconds=0,
            preconditions=client.V1Preconditions(uid=on_a.metadata.uid),
        ),
    )
    left = {p.metadata.uid for p in kube.core.list_namespaced_pod(ns).items}
    assert on_b.metadata.uid in left and unbound.metadata.uid in left


def test_an_agent_may_not_use_the_eviction_api(scope: Scope, kube: Kube):
    (a, _), (agent_a, _) = scope.nodes, scope.agents
    ns = scope.tenant_namespace
    pod = kube.core.create_namespaced_pod(ns, plain_pod("evictable", a))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="evictable", namespace=ns))

    def evict() -> None:
        agent_a.create_namespaced_pod_eviction("evictable", ns, eviction)

    # RBAC refuses it first: the agent's role has no pods/eviction.
    err = refusal(evict)
    assert err is not None and err.status == 403 and "cannot create resource" in str(err.body)
    # Granted anyway (a role someone added), the policy still refuses it: an eviction names no
    # node the policy could compare.
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    name = f"{scope.account}-evicts"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=name),
            rules=[
                client.V1PolicyRule(api_groups=[""], resources=["pods/eviction"], verbs=["create"])
            ],
        )
    )
    try:
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=name),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name=scope.account, namespace=scope.namespace
                    )
                ],
            )
        )
        refused_with(evict, "pods/eviction: the agent does not use the Eviction API")
    finally:
        rbac.delete_cluster_role(name)
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role_binding(name)
    assert kube.core.read_namespaced_pod("evictable", ns).metadata.uid == pod.metadata.uid


def test_a_token_bound_to_no_pod_writes_nothing(scope: Scope):
    a, _ = scope.nodes
    refused_with(
        lambda: scope.unbound.patch_node(a, annotate("gangshare.io/gpu-topology", "{}")),
        "userInfo.extra[authentication.kubernetes.io/node-name]: the agent's token names no node",
    )
