"""What filter hands a pod stays held while kube-scheduler's PreBind waits on a slow volume.

kube-scheduler binds a pod only after its VolumeBinding PreBind has seen the pod's
WaitForFirstConsumer volume provisioned, up to bindTimeoutSeconds (600 s). Here the test
itself is the slow provisioner: a StorageClass with a made-up provisioner, and a PV made by
hand once the old 30 s hold (and one 5 s expiry sweep) would have run out (issue #36).
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_extender import admit_by_hand, displaced_now

from kube import Kube, NodePool, eventually, gpu_pod

pytestmark = pytest.mark.e2e

SELECTED_NODE = "volume.kubernetes.io/selected-node"
# Past the old TTL (30 s) and the sweep that would have forgotten the hold (every 5 s).
PAST_THE_OLD_HOLD = 37.0


def scheduling_failure(kube: Kube, namespace: str, pod: str) -> str | None:
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return next((e.message for e in events.items if e.reason == "FailedScheduling"), None)


def decision(kube: Kube, namespace: str, pod: str) -> str | None:
    """How kube-scheduler's attempt to place `pod` ended, if it did: bound, or why not."""
    node = kube.core.read_namespaced_pod(pod, namespace).spec.node_name
    return f"bound to {node}" if node else scheduling_failure(kube, namespace, pod)


def plan_is_held(kube: Kube, namespace: str, node: str) -> None:
    """The extender's cache holds the plan: one GPU is left, so a 1-GPU pod fits the node
    exactly (score 10). Asked of prioritize, which holds nothing; a filter would hold what it
    hands out, and a pod would be bound if the watch had not delivered the plan yet."""
    probe = kube.api_client.sanitize_for_serialization(
        gpu_pod("probe", 1, scheduler="gangshare-scheduler")
    )
    probe["metadata"]["namespace"] = namespace
    request = json.dumps({"Pod": probe, "NodeNames": [node]}).encode()
    url = f"http://127.0.0.1:{kube.state.ports['extender']}/prioritize"

    def score() -> int:
        asked = urllib.request.Request(url, request, {"content-type": "application/json"})
        with urllib.request.urlopen(asked, timeout=10) as answer:
            return int(json.loads(answer.read())[0]["Score"])

    eventually(lambda: score() == 10, what="the extender holding the plan")


def slow_storage(kube: Kube, namespace: str) -> str:
    """A WaitForFirstConsumer class nobody provisions, and a claim of it named `data`."""
    storage = client.StorageV1Api(kube.api_client)
    name = f"slow-{namespace}"
    storage.create_storage_class(
        client.V1StorageClass(
            metadata=client.V1ObjectMeta(name=name),
            provisioner="gangshare.test/slow",
            volume_binding_mode="WaitForFirstConsumer",
            reclaim_policy="Retain",
        )
    )
    kube.core.create_namespaced_persistent_volume_claim(
        namespace,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name="data"),
            spec=client.V1PersistentVolumeClaimSpec(
                storage_class_name=name,
                access_modes=["ReadWriteOnce"],
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    return name


def provision(kube: Kube, namespace: str, storage_class: str, node: str) -> None:
    """What the slow provisioner finally does: a PV on the selected node, bound to the claim
    (kube-controller-manager's PV controller completes the binding)."""
    claim = kube.core.read_namespaced_persistent_volume_claim("data", namespace)
    kube.core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=storage_class),
            spec=client.V1PersistentVolumeSpec(
                storage_class_name=storage_class,
                capacity={"storage": "1Gi"},
                access_modes=["ReadWriteOnce"],
                persistent_volume_reclaim_policy="Retain",
                host_path=client.V1HostPathVolumeSource(path="/tmp/gangshare-slow-volume"),
                claim_ref=client.V1ObjectReference(
                    namespace=namespace, name="data", uid=claim.metadata.uid
                ),
                node_affinity=client.V1VolumeNodeAffinity(
                    required=client.V1NodeSelector(
                        node_selector_terms=[
                            client.V1NodeSelectorTerm(
                                match_expressions=[
                                    client.V1NodeSelectorRequirement(
                                        key="kubernetes.io/hostname", operator="In", values=[node]
                                    )
                                ]
                            )
                        ]
                    )
                ),
            ),
        )
    )


def with_the_claim(body: client.V1Pod) -> client.V1Pod:
    body.spec.volumes = [
        client.V1Volume(
            name="data",
            persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name="data"),
        )
    ]
    body.spec.containers[0].volume_mounts = [client.V1VolumeMount(name="data", mount_path="/data")]
    return body


def remove_quietly(delete: Any, name: str) -> None:
    try:
        delete(name)
    except ApiException as err:
        if err.status != 404:
            raise


def test_a_pod_binding_slowly_keeps_the_last_gpu_beside_a_plan(
    pool: NodePool, crd: Kube, namespace: str
):
    """Pod a waits in PreBind for its volume; pod b, filtered 37 s later, must not be handed
    the GPU a holds (kube-scheduler counts a there, but not the plan beside it)."""
    kube = crd
    (x,) = pool.nodes(1, 8)
    admit_by_hand(kube, namespace, "big", [(x, [0, 1, 2, 3, 4, 5, 6])])
    plan_is_held(kube, namespace, x)
    storage_class = slow_storage(kube, namespace)
    storage = client.StorageV1Api(kube.api_client)
    try:
        body = gpu_pod(
            "a", 1, scheduler="gangshare-scheduler", node_selector={"gangshare.io/pool": pool.label}
        )
        kube.core.create_namespaced_pod(namespace, with_the_claim(body))

        def selected() -> str | None:
            claim = kube.core.read_namespaced_persistent_volume_claim("data", namespace)
            return (claim.metadata.annotations or {}).get(SELECTED_NODE)

        # PreBind has begun: filter handed a the node (and GPU 7) just before.
        assert eventually(selected, what="the claim's selected node") == x
        time.sleep(PAST_THE_OLD_HOLD)
        assert kube.core.read_namespaced_pod("a", namespace).spec.node_name is None
        pool.pod("b", 1)

        decided = eventually(lambda: decision(kube, namespace, "b"), what="b refused or bound")
        assert not decided.startswith("bound"), f"b was handed a's GPU: {decided}"
        assert "0 of 8 GPUs free" in decided, decided
        provision(kube, namespace, storage_class, x)
        assert pool.wait_bound(["a"])["a"] == (x, (7,))
        time.sleep(3)  # kube-scheduler retried b on a's binding; anything wrong shows by now
        assert kube.core.read_namespaced_pod("b", namespace).spec.node_name is None
        displaced = displaced_now(kube)
        assert f"{namespace}/big" not in displaced, displaced
    finally:
        # The PV goes once the namespace's claim does (its protection finalizer waits).
        remove_quietly(kube.core.delete_persistent_volume, storage_class)
        remove_quietly(storage.delete_storage_class, storage_class)
