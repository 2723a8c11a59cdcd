"""Fixtures shared by the integration and e2e tests: one real control plane per session."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gangshare.dev.realnode import RealNode
from kube import Kube, NodePool, new_namespace, start_session_cluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    cluster, handle = start_session_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield handle
    finally:
        survivors = cluster.down()
        assert survivors == [], f"components survived teardown: {survivors}"


@pytest.fixture(scope="module")
def real_node(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A real kubelet and containerd beside the session cluster, per test module (up in about
    1.5 s), so no other module's tests see it. Needs root and scripts/install-node-deps.sh
    (make test runs it)."""
    node = RealNode(tmp_path_factory.mktemp("real-node"), kube.bins, Path(kube.state.kubeconfig))
    node.up()
    try:
        yield node
    finally:
        left = node.down()
        assert left == [], f"the real node left behind: {left}"


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    yield from new_namespace(kube)


@pytest.fixture(scope="session")
def crd(kube: Kube) -> Kube:
    """The TrainingJob and Queue CRDs and the admission policies, as `kubectl apply -f crds/`
    installs them (the operator creates the `default` Queue itself)."""
    for path in (
        "trainingjob.yaml",
        "trainingjob-admission-policy.yaml",
        "job-admission-policy.yaml",
        "jobset-admission-policy.yaml",
        "pytorchjob-admission-policy.yaml",
        "trainjob-admission-policy.yaml",
        "gang-gate-policy.yaml",
        "pod-group-policy.yaml",
        "pod-owner-policy.yaml",
        "job-owner-policy.yaml",
        "queue.yaml",
    ):
        subprocess.run(
            kube.kubectl("apply", "-f", str(ROOT / "crds" / path)),
            check=True,
            capture_output=True,
        )
    subprocess.run(
        kube.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/trainingjobs.gangshare.io",
            "crd/queues.gangshare.io",
            "--timeout=60s",
        ),
        check=True,
        capture_output=True,
    )
    return kube


@pytest.fixture
def pool(crd: Kube, namespace: str) -> Iterator[NodePool]:
    """GPU nodes of the test's own (modules may define a `pool` of their own instead)."""
    created = NodePool(crd, namespace)
    yield created
    created.cleanup()


@pytest.fixture
def queues(crd: Kube) -> Iterator[Callable[..., str]]:
    """Creates cluster-scoped Queues with names unique to the test; deletes them after."""
    suffix = uuid.uuid4().hex[:5]
    made: list[str] = []

    def make(name: str, **spec: Any) -> str:
        full = f"{name}-{suffix}"
        body = {"apiVersion": "gangshare.io/v1alpha1", "kind": "Queue", "metadata": {"name": full}}
        crd.custom.create_cluster_custom_object(
            "gangshare.io", "v1alpha1", "queues", {**body, "spec": spec}
        )
        made.append(full)
        return full

    yield make
    for name in made:
        crd.custom.delete_cluster_custom_object("gangshare.io", "v1alpha1", "queues", name)
