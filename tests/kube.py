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

from gangshare.dev import binaries
from gangshare.dev.cli import load_nodes
from gangshare.dev.cluster import ClusterState, LocalCluster
from gangshare.dev.processes import free_port

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


class OperatorProcess:
    """`gangshare operator` as a real process against the session cluster, killable at will."""

    def __init__(
        self, kube: Kube, log_dir: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.log_dir = log_dir
        self.extra = extra
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> OperatorProcess:
        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        argv = [
            sys.executable,
            "-m",
            "gangshare.cli",
            "operator",
            "--kubeconfig",
            self.kube.state.kubeconfig,
            "--liveness",
            f"http://127.0.0.1:{free_port()}/healthz",
            "--cycle-interval",
            "0.5",
            "--backoff-base-seconds",
            "1",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        return self

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

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log"))
        )
