"""A real kubelet node beside the control plane runs real containers (local images), on the
host network or on its own pod network, where the API server answers at its Service."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gangshare.dev import realnode_net
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_config import REAL_NODE_LABEL
from gangshare.dev.realnode_image import IMAGE
from gangshare.dev.realnode_net import BRIDGE, POD_CIDR, POD_GATEWAY
from gangshare.dev.realnode_pyimage import PY_IMAGE
from gangshare.kube.nodes import KWOK_NODE_ANNOTATION
from kube import Kube, eventually

pytestmark = pytest.mark.e2e


IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def real_pod(
    name: str,
    command: list[str],
    resources: client.V1ResourceRequirements | None = None,
    host_network: bool = True,
    image: str = IMAGE,
) -> client.V1Pod:
    """A pod only the real node takes: it tolerates the node's taint and selects its label.
    Off the host network it gets the default service account's token, as pods usually do."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            host_network=host_network,
            # Long-running ones: PID 1 ignores SIGTERM, so deleting them would wait 30 s.
            termination_grace_period_seconds=1,
            node_selector={REAL_NODE_LABEL: "true"},
            tolerations=[
                client.V1Toleration(
                    key=REAL_NODE_LABEL, operator="Equal", value="true", effect="NoSchedule"
                )
            ],
            automount_service_account_token=not host_network,
            containers=[
                client.V1Container(
                    name="main",
                    image=image,
                    image_pull_policy="Never",
                    command=command,
                    resources=resources,
                )
            ],
        ),
    )


def finished(kube: Kube, namespace: str, name: str) -> client.V1Pod:
    def done() -> client.V1Pod | None:
        pod = kube.core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod: client.V1Pod = eventually(done, timeout=60, what=f"pod {name} finished")
    return pod


def test_real_node_is_tainted_labelled_and_not_kwoks(kube: Kube, real_node: RealNode):
    node = kube.core.read_node(real_node.name)
    assert node.metadata.labels[REAL_NODE_LABEL] == "true"
    assert KWOK_NODE_ANNOTATION not in (node.metadata.annotations or {})
    assert any(
        t.key == REAL_NODE_LABEL and t.value == "true" and t.effect == "NoSchedule"
        for t in node.spec.taints or []
    )
    assert node.status.node_info.kubelet_version == "v1.35.4"


def test_pod_runs_a_real_container_and_its_output_is_read_back(
    kube: Kube, real_node: RealNode, namespace: str
):
    kube.core.create_namespaced_pod(
        namespace, real_pod("hello", ["sh", "-c", "echo hello-from-$(hostname)-node"])
    )
    pod = finished(kube, namespace, "hello")
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.spec.node_name == real_node.name
    # Host network: the container sees the machine's own hostname.
    hostname = Path("/proc/sys/kernel/hostname").read_text().strip()
    assert real_node.container_log(namespace, "hello", "main") == f"hello-from-{hostname}-node\n"


def test_the_kubelet_applies_the_pod_memory_limit(kube: Kube, real_node: RealNode, namespace: str):
    limits = {"memory": "64Mi", "cpu": "250m"}
    # cgroup v1: runc mounts the container's own cgroups there.
    files = ["/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"]
    kube.core.create_namespaced_pod(
        namespace,
        real_pod(
            "limited",
            ["cat", *files],
            client.V1ResourceRequirements(requests=limits, limits=limits),
        ),
    )
    pod = finished(kube, namespace, "limited")
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.status.qos_class == "Guaranteed"
    assert real_node.container_log(namespace, "limited", "main").split() == ["67108864", "25000"]


# What an in-cluster client does (client-go's rest.InClusterConfig): the Service from the
# environment, the mounted CA and token.
IN_CLUSTER_VERSION = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
with open(f"{sa}/token") as f:
    token = f.read()
request = urllib.request.Request(
    f"https://{host}:{port}/version", headers={"Authorization": f"Bearer {token}"}
)
with urllib.request.urlopen(request, context=context, timeout=10) as response:
    print(host, port, json.load(response)["gitVersion"])
"""


def test_a_pod_network_pod_reaches_the_api_server_at_its_service(
    kube: Kube, real_node: RealNode, namespace: str
):
    forwarding = IP_FORWARD.read_text()
    kube.core.create_namespaced_pod(
        namespace,
        real_pod(
            "in-cluster",
            ["python3", "-c", IN_CLUSTER_VERSION],
            host_network=False,
            image=PY_IMAGE,
        ),
    )
    pod = finished(kube, namespace, "in-cluster")
    output = real_node.container_log(namespace, "in-cluster", "main")
    assert pod.status.phase == "Succeeded", output
    assert pod.spec.node_name == real_node.name
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_CIDR)
    version = client.VersionApi(kube.api_client).get_code().git_version
    assert output == f"{realnode_net.service_ip()} 443 {version}\n"
    # The traffic was delivered locally: the pod network never turns on forwarding.
    assert IP_FORWARD.read_text() == forwarding


def test_the_api_server_reaches_a_pod_network_pod_through_its_pod_proxy(
    kube: Kube, real_node: RealNode, namespace: str
):
    serve = "mkdir -p /tmp/www && echo served-by-$(hostname) > /tmp/www/hello && cd /tmp/www"
    kube.core.create_namespaced_pod(
        namespace,
        real_pod(
            "web",
            ["sh", "-c", f"{serve} && exec python3 -m http.server 8080"],
            host_network=False,
            image=PY_IMAGE,
        ),
    )

    def fetched() -> str:
        # Unread: the client refuses to decode http.server's application/octet-stream.
        response = kube.core.connect_get_namespaced_pod_proxy_with_path(
            "web:8080", namespace, "hello", _preload_content=False
        )
        return str(response.data.decode())

    # The pod's own hostname: it is not on the host network.
    assert eventually(fetched, timeout=60, what="the pod's page") == "served-by-web\n"
    pod = kube.core.read_namespaced_pod("web", namespace)
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_CIDR)


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on the pod bridge's own address (not loopback: pods reach that only
    through the Service), accepting and closing whatever connects; yields its port."""
    listener = socket.create_server((POD_GATEWAY, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                listener.accept()[0].close()
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


PROBE = """
import socket, sys
for host, port in (sys.argv[1], int(sys.argv[2])), (sys.argv[3], int(sys.argv[4])):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(host, "open")
    except OSError as err:
        print(host, "closed", type(err).__name__)
"""


def test_pods_reach_nothing_on_the_host_but_the_api_server(
    kube: Kube, real_node: RealNode, namespace: str, host_listener: int
):
    # The host accepts this connection from itself: only the pod network's rules stop pods.
    socket.create_connection((POD_GATEWAY, host_listener), timeout=3).close()
    target = [POD_GATEWAY, str(host_listener), realnode_net.service_ip(), "443"]
    kube.core.create_namespaced_pod(
        namespace,
        real_pod(
            "probe",
            ["python3", "-c", PROBE, *target],
            host_network=False,
            image=PY_IMAGE,
        ),
    )
    pod = finished(kube, namespace, "probe")
    output = real_node.container_log(namespace, "probe", "main")
    assert pod.status.phase == "Succeeded", output
    assert output.splitlines() == [
        f"{POD_GATEWAY} closed TimeoutError",
        f"{realnode_net.service_ip()} open",
    ]


def test_stopping_the_node_removes_its_pod_network(kube: Kube, real_node: RealNode, namespace: str):
    kube.core.create_namespaced_pod(
        namespace, real_pod("sleeper", ["sleep", "3600"], host_network=False)
    )
    eventually(
        lambda: kube.core.read_namespaced_pod("sleeper", namespace).status.phase == "Running",
        timeout=60,
        what="sleeper running",
    )
    route_localnet = Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet")
    assert route_localnet.read_text() == "1\n"
    assert realnode_net.table_exists()
    veths = realnode_net.bridge_ports()
    assert veths, "the pod's veth is not on the bridge"
    assert realnode_net.cni_cache_entries(), "libcni cached no result for the pod"
    # Its sandbox is never deleted through CNI: the node goes down with the pod on it.
    try:
        assert real_node.down() == []
        assert not realnode_net.table_exists()
        assert not realnode_net.bridge_exists()
        assert not [v for v in veths if Path("/sys/class/net", v).exists()]
        assert realnode_net.cni_cache_entries() == []
    finally:
        # Gone with its node (whose Node object teardown deleted): no kubelet will stop it.
        kube.core.delete_namespaced_pod("sleeper", namespace, grace_period_seconds=0)
        real_node.up()
    # Back for the module's other tests and the fixture's teardown; a fresh network.
    assert realnode_net.table_exists()
    assert realnode_net.bridge_exists()
