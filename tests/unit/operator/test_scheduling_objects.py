"""A pod's and a node's scheduling facts read from API objects, as kube-scheduler reads them."""

from gangshare.core.constraints import SelectorOperator, Taint
from gangshare.kube.claims import gpu_request
from gangshare.kube.scheduling import (
    gpu_devices,
    node_allocatable,
    node_taints,
    pod_constraints,
    pod_requests,
    requests_by_node,
)


def container(name, cpu=None, memory=None, gpu=None, limits_only=False):
    amounts = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    if gpu:
        amounts["nvidia.com/gpu"] = gpu
    resources = {"limits": amounts} if limits_only else {"requests": amounts}
    return {"name": name, "resources": resources}


def test_requests_sum_containers_and_sidecars_and_cover_the_largest_init_container():
    spec = {
        "initContainers": [
            container("fetch", cpu="6", memory="1Gi"),  # runs alone, before the sidecar
            {**container("proxy", cpu="500m"), "restartPolicy": "Always"},
            container("warm", cpu="2", memory="8Gi"),  # runs beside the proxy
        ],
        "containers": [
            container("train", cpu="4", memory="16Gi", gpu="8"),
            container("log", cpu="250m"),
        ],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {
        # max(containers 4.25 + sidecar 0.5, init 6, init 2 + sidecar 0.5) + overhead 0.1
        "cpu": 6100,
        # max(16Gi, 1Gi, 8Gi): GPUs are left to the core's own model
        "memory": 16 * 2**30,
        "pods": 1,
    }


def test_gpu_devices_count_sidecars_beside_the_containers_as_the_kubelet_hands_them_out():
    sidecar = {**container("proxy", gpu="4"), "restartPolicy": "Always"}
    assert gpu_devices({"initContainers": [sidecar], "containers": [container("t")]}) == {
        "nvidia.com/gpu": 4
    }
    spec = {
        "initContainers": [container("fetch", gpu="6"), sidecar, container("warm", gpu="3")],
        "containers": [container("train", gpu="2")],
    }
    # max(containers 2 + sidecar 4, plain init 6, plain init 3 + sidecar 4): the kubelet reuses
    # an init container's devices for the containers, never a running sidecar's.
    assert gpu_devices(spec) == {"nvidia.com/gpu": 7}
    share = {
        "containers": [
            container("a"),
            {"name": "b", "resources": {"limits": {"gangshare.io/gpu-share": "2"}}},
        ]
    }
    assert gpu_devices(share) == {"gangshare.io/gpu-share": 2}
    # The one reader the ledger, the extender and the agent use:
    assert gpu_request({"spec": {"initContainers": [sidecar], "containers": [container("t")]}})
    assert gpu_request({"spec": spec})[1] == 7  # type: ignore[index]
    assert gpu_request({"spec": {"containers": [container("cpu", cpu="1")]}}) is None


def test_a_limit_without_a_request_is_the_request():
    spec = {"containers": [container("t", cpu="1500m", memory="2Gi", limits_only=True)]}
    assert pod_requests(spec) == {"cpu": 1500, "memory": 2 * 2**30, "pods": 1}


def test_pod_constraints_read_selector_affinity_and_tolerations():
    spec = {
        "nodeSelector": {"zone": "east"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "tier", "operator": "In", "values": ["a", "b"]}
                            ],
                            "matchFields": [
                                {"key": "metadata.name", "operator": "NotIn", "values": ["x"]}
                            ],
                        }
                    ]
                }
            }
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container("t", cpu="1")],
    }
    constraints = pod_constraints(spec)
    assert constraints.node_selector == (("zone", "east"),)
    [term] = constraints.affinity
    assert term.expressions[0].operator is SelectorOperator.IN
    assert term.expressions[0].values == ("a", "b")
    assert term.matches("y", {"tier": "b"}) and not term.matches("x", {"tier": "b"})
    assert constraints.tolerations[0].tolerates(Taint("nvidia.com/gpu", "", "NoSchedule"))
    assert dict(constraints.resources) == {"cpu": 1000, "pods": 1}


def test_node_taints_allocatable_and_what_bound_pods_take():
    node = {
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
        },
    }
    assert node_taints(node) == (Taint("gpu", "yes", "NoSchedule"),)
    assert node_allocatable(node) == {"cpu": 96_000, "memory": 2**40, "pods": 110}
    pods = [
        {"spec": {"nodeName": "n", "containers": [container("a", cpu="2")]}, "status": {}},
        {"spec": {"nodeName": "n", "containers": [container("b", cpu="1")]}, "status": {}},
        {
            "spec": {"nodeName": "n", "containers": [container("c", cpu="9")]},
            "status": {"phase": "Succeeded"},
        },
        {"spec": {"containers": [container("d", cpu="9")]}, "status": {}},  # not bound
    ]
    assert requests_by_node(pods) == {"n": {"cpu": 3000, "pods": 2}}


# ----- pod-level resources (spec.resources, beta and on by default since Kubernetes 1.34) -----


def pod_level(requests=None, limits=None):
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def test_pod_level_cpu_and_memory_replace_what_the_containers_add_up_to():
    spec = {
        "resources": pod_level(requests={"cpu": "32", "memory": "256Gi"}),
        "containers": [container("train", cpu="4", memory="16Gi", gpu="8"), container("log")],
    }
    assert pod_requests(spec) == {"cpu": 32_000, "memory": 256 * 2**30, "pods": 1}


def test_a_resource_named_only_by_containers_is_still_their_aggregate():
    spec = {
        "resources": pod_level(requests={"cpu": "32"}),
        "containers": [
            container("train", cpu="4", memory="16Gi"),
            {"name": "scratch", "resources": {"requests": {"ephemeral-storage": "10Gi"}}},
        ],
    }
    assert pod_requests(spec) == {
        "cpu": 32_000,
        "memory": 16 * 2**30,
        "ephemeral-storage": 10 * 2**30,
        "pods": 1,
    }


def test_overhead_is_added_on_top_of_the_pod_level_request():
    spec = {
        "resources": pod_level(requests={"cpu": "8", "memory": "32Gi"}),
        "containers": [container("train", cpu="2")],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    }
    assert pod_requests(spec) == {
        "cpu": 8_250,
        "memory": 32 * 2**30 + 120 * 2**20,
        "pods": 1,
    }


def test_the_pod_level_request_replaces_the_init_container_peak_too():
    # Containers 2 CPUs, a plain init container 12: the aggregate would be 12 CPUs, 1Gi. The pod
    # says 6 CPUs (the API server only checks it is at least the containers' aggregate when
    # both are set, so a larger init container is its own business): 6 it is. Memory, not named
    # at pod level, keeps the aggregate rule: max(containers 1Gi, init 4Gi).
    spec = {
        "resources": pod_level(requests={"cpu": "6"}),
        "initContainers": [container("fetch", cpu="12", memory="4Gi")],
        "containers": [container("train", cpu="2", memory="1Gi")],
    }
    assert pod_requests(spec) == {"cpu": 6_000, "memory": 4 * 2**30, "pods": 1}


def test_a_pod_level_limit_without_a_request_is_the_request_unless_containers_ask():
    # The API server's defaulting (pkg/apis/core/v1/defaults.go defaultPodRequests): a pod-level
    # limit with no pod-level request defaults the request to the containers' aggregate when
    # they ask for that resource, else to the limit itself.
    spec = {
        "resources": pod_level(limits={"cpu": "16", "memory": "64Gi"}),
        "containers": [container("train", cpu="3")],
    }
    assert pod_requests(spec) == {"cpu": 3_000, "memory": 64 * 2**30, "pods": 1}
    both = {**spec, "resources": pod_level(requests={"memory": "8Gi"}, limits={"memory": "64Gi"})}
    assert pod_requests(both) == {"cpu": 3_000, "memory": 8 * 2**30, "pods": 1}


def test_pod_level_resources_kubernetes_does_not_support_are_ignored():
    # Only cpu, memory and hugepages-* may be set at pod level; GPUs still come from containers.
    spec = {
        "resources": pod_level(
            requests={"hugepages-2Mi": "1Gi", "ephemeral-storage": "1Ti", "nvidia.com/gpu": "8"}
        ),
        "containers": [container("train", cpu="1", gpu="2")],
    }
    assert pod_requests(spec) == {"cpu": 1_000, "hugepages-2Mi": 2**30, "pods": 1}
    assert gpu_devices(spec) == {"nvidia.com/gpu": 2}


def test_pod_level_requests_count_for_a_bound_pod_and_in_a_templates_constraints():
    spec = {
        "nodeName": "n",
        "resources": pod_level(requests={"cpu": "32", "memory": "256Gi"}),
        "containers": [container("train", cpu="1")],
    }
    assert requests_by_node([{"spec": spec, "status": {}}]) == {
        "n": {"cpu": 32_000, "memory": 256 * 2**30, "pods": 1}
    }
    assert dict(pod_constraints(spec).resources)["cpu"] == 32_000
