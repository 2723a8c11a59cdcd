"""`gangshare agent` as a real process beside the real kubelet, with the fake NVML backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_config import REAL_NODE_LABEL
from kube import ChildProcess, Kube, eventually


class AgentProcess(ChildProcess):
    def __init__(
        self, kube: Kube, node: RealNode, workdir: Path, spec: str, extra: tuple[str, ...] = ()
    ) -> None:
        self.extra = extra
        self.kube = kube
        self.node = node
        self.workdir = workdir
        self.spec = workdir / "gpus.yaml"
        self.spec.write_text(spec)
        self.socket_dir = workdir / "sdk"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> AgentProcess:
        self.starts += 1
        log = (self.workdir / f"agent-{self.starts}.log").open("wb")
        argv = [
            sys.executable,
            "-m",
            "gangshare.cli",
            "agent",
            "--node-name",
            self.node.name,
            "--kubeconfig",
            self.kube.state.kubeconfig,
            "--nvml",
            "fake",
            "--fake-spec",
            str(self.spec),
            "--device-plugin-dir",
            str(self.node.device_plugin_dir),
            "--pod-resources-socket",
            str(self.node.pod_resources_socket),
            "--socket-dir",
            str(self.socket_dir),
            "--state-dir",
            str(self.workdir / "state"),
            "--publish-interval",
            "1",
            "--metrics-port",
            "0",
            *self.extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        return self

    def rewrite_spec(self, spec: str) -> None:
        self.spec.write_text(spec)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.workdir.glob("agent-*.log"))
        )

    def registered(self) -> bool:
        """Whether this start has registered both resources with the kubelet (the Node's
        allocatable can still show the previous agent's devices until the kubelet syncs)."""
        current = self.workdir / f"agent-{self.starts}.log"
        text = current.read_text(errors="replace") if current.exists() else ""
        return all(
            f"registered {r} with the kubelet" in text
            for r in ("nvidia.com/gpu", "gangshare.io/gpu-share")
        )

    def preferred(self, resource: str) -> list[list[str]]:
        """Every device-ID list GetPreferredAllocation answered for a resource, in order."""
        pattern = re.compile(rf"{re.escape(resource)}: preferred (\S+) of")
        return [m.group(1).split(",") for m in pattern.finditer(self.logs())]


def real_node_job(
    name: str, service_class: str, model: str, image: str, command: list[str]
) -> dict[str, Any]:
    """A one-worker, one-GPU TrainingJob that only the real node takes (host network: the real
    node has no pod network; the namespace needs gangshare.io/privileged-templates=allowed)."""
    return {
        "apiVersion": "gangshare.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": 1,
            "gpusPerWorker": 1,
            "serviceClass": service_class,
            "gpuModel": model,
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {REAL_NODE_LABEL: "true"},
                    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": command,
                        }
                    ],
                }
            },
        },
    }


def allow_privileged_templates(kube: Kube, namespace: str) -> None:
    """hostNetwork templates need the cluster admin's opt-in on the namespace."""
    kube.core.patch_namespace(
        namespace, {"metadata": {"labels": {"gangshare.io/privileged-templates": "allowed"}}}
    )


@contextmanager
def running_agent(
    kube: Kube,
    node: RealNode,
    workdir: Path,
    spec: str,
    ready: Callable[[], bool],
    extra: tuple[str, ...] = ("--control-period", "1"),
) -> Iterator[AgentProcess]:
    """An agent registered with the real kubelet and `ready`; its log tail printed after."""
    process = AgentProcess(kube, node, workdir, spec, extra).start()
    try:
        eventually(process.registered, timeout=30, what="the agent registered")
        eventually(ready, timeout=60, what="the agent's GPU allocatable on the real node")
        yield process
    finally:
        process.stop()
        print(process.logs()[-6000:])
