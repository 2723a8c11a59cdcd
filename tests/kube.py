"""Test helpers for the real local control plane: a session cluster and per-test namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gangshare.core.spec import parse_cluster_spec
from gangshare.dev import binaries
from gangshare.dev.cli import load_nodes
from gangshare.dev.cluster import ClusterState, LocalCluster
from gangshare.dev.processes import free_port
from gangshare.kube.claims import pod_owner
from gangshare.kube.nodes import KWOK_NODE_ANNOTATION, node_manifest
from gangshare.kube.snapshot import build_snapshot

T = TypeVar("T")


@dataclass
class Kube:
    state: ClusterState
    bins: Path
    api_client: Any

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @property
    def extensions(self) -> client.ApiextensionsV1Api:
        return client.ApiextensionsV1Api(self.api_client)

    def kubectl(self, *args: str) -> list[str]:
        return [str(self.bins / "kubectl"), f"--kubeconfig={self.state.kubeconfig}", *args]


def gpu_pod(
    name: str,
    gpus: int,
    resource: str = "nvidia.com/gpu",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler: str | None = None,
    node_name: str | None = None,
    node_selector: dict[str, str] | None = None,
) -> client.V1Pod:
    """A one-container pod asking for GPUs (whole ones, or gangshare share slots)."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations or {}, labels=labels or {}),
        spec=client.V1PodSpec(
            scheduler_name=scheduler,
            node_name=node_name,
            node_selector=node_selector,
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="train",
                    image="example.invalid/train:1",
                    resources=client.V1ResourceRequirements(
                        requests={resource: str(gpus)}, limits={resource: str(gpus)}
                    ),
                )
            ],
        ),
    )


def grant_edit(kube: Kube, namespace: str, user: str = "tenant") -> None:
    """Give `user` the built-in `edit` role in `namespace`: a tenant as clusters make them."""
    client.RbacAuthorizationV1Api(kube.api_client).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"{user}-edit"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"
            ),
            subjects=[
                client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
            ],
        ),
    )


def start_session_cluster(root: Path) -> tuple[LocalCluster, Kube]:
    bins = binaries.bin_dir(build=True)
    cluster = LocalCluster(root, bins, attached=True)
    state = cluster.up(load_nodes(None))
    api_client = config.new_client_from_config(config_file=state.kubeconfig)
    return cluster, Kube(state, bins, api_client)


def new_namespace(kube: Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods are refused until the service-account controller has made the default account.
    eventually(
        lambda: kube.core.read_namespaced_service_account("default", name), what="default SA"
    )
    yield name
    kube.core.delete_namespace(name)

    def gone() -> bool:
        return all(ns.metadata.name != name for ns in kube.core.list_namespace().items)

    # Wait, so the next test starts on a cluster whose GPUs are free again.
    eventually(gone, timeout=90, what=f"namespace {name} deleted")


def eventually(
    check: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = ""
) -> T:
    """Poll until `check` returns a truthy value without raising; fail with the last reason."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as err:
            last = err
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or check}: last saw {last!r}"
    )


class ChildProcess:
    """A gangshare command the test started; SIGKILL or SIGTERM it at will."""

    proc: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class OperatorProcess(ChildProcess):
    """`gangshare operator` as a real process against the session cluster, killable at will."""

    def __init__(
        self,
        kube: Kube,
        log_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        faults: tuple[str, ...] = (),
    ) -> None:
        self.kube = kube
        self.log_dir = log_dir
        self.extra = extra
        self.env = env or {}
        # Options of tests/integration/faulty_operator.py; empty runs the plain command.
        self.faults = faults
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.liveness_port = free_port()
        self.metrics_port = free_port()

    def start(self) -> OperatorProcess:
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        launcher = (
            [str(Path(__file__).parent / "integration" / "faulty_operator.py"), *self.faults, "--"]
            if self.faults
            else ["-m", "gangshare.cli"]
        )
        argv = [
            sys.executable,
            *launcher,
            "operator",
            "--kubeconfig",
            self.kube.state.kubeconfig,
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--cycle-interval",
            "0.5",
            "--backoff-base-seconds",
            "1",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            # Off unless a test turns it on (`--leader-elect` in extra; the last flag wins): each
            # test runs one operator of its own, and one that was killed would otherwise hold
            # the shared cluster's Lease for 15 s against the next.
            "--no-leader-elect",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        return self

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log"))
        )


class NodePool:
    """Fresh GPU nodes that only this test uses: a pool label (pods select it with a
    nodeSelector) and a GPU model no other node has (TrainingJobs select it with gpuModel)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.names: list[str] = []
        self.label = f"p{uuid.uuid4().hex[:6]}"
        self.model = f"TEST-GPU-{self.label}"

    def nodes(
        self,
        count: int,
        gpus: int,
        islands: list[list[int]] | None = None,
        *,
        cpu: str = "64",
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        hostname: str | None = None,
        managed: bool = True,
        suffix: str = "",
    ) -> list[str]:
        """Create nodes; `managed=False` leaves them to no kubelet at all (KWOK ignores them),
        Ready only because the test says so, like a node whose kubelet just died."""
        spec = {
            "nodePools": [
                {
                    "name": self.label + suffix,
                    "count": count,
                    "gpusPerNode": gpus,
                    "gpuModel": self.model,
                    "nvlinkIslands": islands or [],
                    "cpu": cpu,
                }
            ]
        }
        created = []
        for node in parse_cluster_spec(spec):
            if node.name in self.names:
                continue
            manifest = node_manifest(node)
            manifest["metadata"]["labels"]["gangshare.io/pool"] = self.label
            manifest["metadata"]["labels"].update(labels or {})
            if hostname is not None:
                manifest["metadata"]["labels"]["kubernetes.io/hostname"] = hostname
            if taints:
                manifest["spec"]["taints"] = taints
            if not managed:
                del manifest["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
            self.kube.core.create_node(manifest)
            created.append(node.name)
        self.names += created
        for name in created:
            if not managed:
                self.mark_ready(name)
            eventually(lambda n=name: self._ready(n), what=f"{name} Ready, not-ready taint gone")
        return created

    def _ready(self, name: str) -> bool:
        node = self.kube.core.read_node(name)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        # The node controller taints a new node not-ready until it has seen it Ready.
        tainted = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
        return ready and not tainted

    def mark_ready(self, node: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.kube.core.patch_node_status(node, {"status": {"conditions": [ready]}})

    def occupy(self, node: str, gpus: list[int]) -> None:
        """A running pod already holding these GPUs (bound directly, with its GPUs recorded)."""
        name = f"holder-{node}-{'-'.join(map(str, gpus))}"
        self.pod(
            name,
            len(gpus),
            node_name=node,
            annotations={"gangshare.io/planned-gpus": ",".join(map(str, gpus))},
        )
        eventually(
            lambda: (
                self.kube.core.read_namespaced_pod(name, self.namespace).status.phase == "Running"
            )
        )

    def pod(
        self,
        name: str,
        gpus: int,
        resource: str = "nvidia.com/gpu",
        node_name: str | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        scheduler: str = "gangshare-scheduler",
    ) -> None:
        body = gpu_pod(
            name,
            gpus,
            resource,
            annotations,
            labels,
            scheduler=scheduler,
            node_name=node_name,
            node_selector={"gangshare.io/pool": self.label},
        )
        self.kube.core.create_namespaced_pod(self.namespace, body)

    def placements(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """pod -> (node, GPUs) for every bound pod of this test, as gangshare's ledger holds
        them when built from the API's objects: the GPUs recorded on the pod, else the ones
        every ledger derives for it alike (a KWOK node has no agent to record the kubelet's)."""
        raw = self.kube.api_client.sanitize_for_serialization
        pods = [raw(p) for p in self.kube.core.list_pod_for_all_namespaces().items]
        nodes = [raw(n) for n in self.kube.core.list_node().items]
        try:
            jobs = self.kube.custom.list_cluster_custom_object(
                "gangshare.io", "v1alpha1", "trainingjobs"
            )["items"]
        except ApiException as err:
            if err.status != 404:  # the CRD is installed only for tests that ask for it
                raise
            jobs = []
        cluster = build_snapshot(nodes, pods, jobs).cluster
        result = {}
        for pod in pods:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if meta["namespace"] != self.namespace or not node:
                continue
            labels = meta.get("labels") or {}
            owners = [pod_owner(self.namespace, meta["name"])]
            if "gangshare.io/job" in labels:
                job, rank = labels["gangshare.io/job"], labels.get("gangshare.io/rank")
                owners.append(f"{self.namespace}/{job}/{rank}")
            for owner in owners:
                held = [a for a in cluster.allocations_of(owner) if a.node == node]
                if held:
                    result[meta["name"]] = (node, tuple(sorted(held[0].gpu_indices)))
        return result

    def wait_bound(
        self, names: list[str], timeout: float = 60
    ) -> dict[str, tuple[str, tuple[int, ...]]]:
        def all_bound() -> dict[str, tuple[str, tuple[int, ...]]] | None:
            placed = self.placements()
            return placed if all(n in placed for n in names) else None

        return eventually(
            all_bound, timeout=timeout, what=f"{len(names)} pods bound and held on GPUs"
        )

    def cleanup(self) -> None:
        # Pods first, while KWOK still manages their nodes and finishes their deletion at once;
        # pods on unmanaged nodes have no kubelet to finish theirs, so they go without grace.
        self.kube.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        eventually(
            lambda: not self.kube.core.list_namespaced_pod(self.namespace).items, what="pods gone"
        )
        for name in self.names:
            try:
                self.kube.core.delete_node(name)
            except ApiException as err:
                if err.status != 404:
                    raise
