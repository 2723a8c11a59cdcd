"""The world of tests/e2e/test_install.py: a bare control plane (no gangshare process of the
test's own: the release must bring every part), one real kubelet node that is a GPU node as a
platform team would have it (labelled for the agent, untainted, a RuntimeClass `nvidia`), and
the images `make image` builds imported into its containerd.

Also what the tests read from the host about a pod's containers: their processes, found by the
pod's UID in their cgroup, and what the kernel says each runs as.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from test_helm import Helm

import tj
from gangshare.dev import binaries, realnode_host, release_image
from gangshare.dev.cluster import LocalCluster
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_config import POD_LOGS, REAL_NODE_LABEL
from gangshare.dev.realnode_image import IMAGE
from kube import Kube

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gangshare"
CI_VALUES = CHART / "ci" / "real-node-values.yaml"
RELEASE = "gangshare"
NAMESPACE = "gangshare-system"
GPU_NODE_LABEL = "gangshare.io/gpu-node"
CAP_KILL = 1 << 5
# The agent's hostPath folders (DirectoryOrCreate): the kubelet makes them on this machine.
AGENT_HOST_DIRS = (
    Path("/tmp/nvidia-mps"),
    Path("/var/run/gangshare"),
    Path("/var/run/gangshare-agent"),
)
# Prints the GPUs the kubelet's Allocate gave the container, as the container sees them.
REPORT = 'echo "node-gpus=$GANGSHARE_NODE_GPUS uuids=$NVIDIA_VISIBLE_DEVICES"'


@dataclass
class InstallEnv:
    kube: Kube
    node: RealNode
    helm: Helm
    # What the tests measured, printed at the end of the module (the README's figures).
    figures: dict[str, float] = field(default_factory=dict)

    def helm_release(self, *args: str, check: bool = True) -> Any:
        """helm against this cluster, in the release's namespace."""
        return self.helm(
            *args, "-n", NAMESPACE, f"--kubeconfig={self.kube.state.kubeconfig}", check=check
        )

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.kube.api_client)

    def release_pods(self) -> list[client.V1Pod]:
        pods: list[client.V1Pod] = self.kube.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/instance={RELEASE}"
        ).items
        return pods

    def component_pods(self, component: str) -> list[client.V1Pod]:
        return [
            p
            for p in self.release_pods()
            if (p.metadata.labels or {}).get("app.kubernetes.io/component") == component
            and p.metadata.deletion_timestamp is None
        ]


def bare_world(root: Path) -> Iterator[InstallEnv]:
    """The control plane, the GPU node and the images; torn down whatever the tests did."""
    bins = binaries.bin_dir(build=True)
    images = [release_image.gangshare_image(), release_image.scheduler_image(bins)]
    made = [d for d in AGENT_HOST_DIRS if not d.exists()]
    cluster = LocalCluster(root / "cluster", bins)
    state = cluster.up([], with_gangshare=False)
    kube = Kube(state, bins, config.new_client_from_config(config_file=state.kubeconfig))
    node = RealNode(root / "node", bins, Path(state.kubeconfig), name="gpu-0")
    try:
        node.up()
        for image in images:
            node.import_image(image.tarball, image.ref)
        become_a_gpu_node(kube, node.name)
        client.NodeV1Api(kube.api_client).create_runtime_class(
            client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="runc")
        )
        yield InstallEnv(kube, node, Helm(bins / "helm", root / "helm-home"))
    finally:
        keep_pod_logs(root / "pod-logs")
        left = node.down()
        survivors = cluster.down()
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"the real node left behind: {left}"
    assert survivors == [], f"components survived teardown: {survivors}"


def keep_pod_logs(into: Path) -> None:
    """The release's and the jobs' container logs, kept beside the test's other files (the
    node's teardown removes the kubelet's), for whoever reads a failure."""
    for folder in POD_LOGS.glob("*_*_*"):
        if folder.name.startswith((f"{NAMESPACE}_", "team-")):
            shutil.copytree(folder, into / folder.name, dirs_exist_ok=True)


def become_a_gpu_node(kube: Kube, name: str) -> None:
    """What a platform team does to a GPU node for the chart's defaults: the agent's label; and
    the real node's test taint lifted, so the chart's pods (which tolerate none) land on it."""
    node = kube.core.read_node(name)
    taints = [t for t in node.spec.taints or [] if t.key != REAL_NODE_LABEL]
    kube.core.patch_node(
        name, {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}, "spec": {"taints": taints}}
    )


def rollout_done(env: InstallEnv) -> bool:
    """Every Deployment and the DaemonSet of the release at its desired count, all updated,
    available and ready, with no old pod left."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    deployments = env.apps.list_namespaced_deployment(NAMESPACE, label_selector=selector).items
    daemonsets = env.apps.list_namespaced_daemon_set(NAMESPACE, label_selector=selector).items
    if len(deployments) != 2 or len(daemonsets) != 1:
        return False
    for d in deployments:
        s = d.status
        if s.observed_generation != d.metadata.generation:
            return False
        want = d.spec.replicas
        if (s.updated_replicas, s.ready_replicas, s.available_replicas, s.replicas) != (
            want,
            want,
            want,
            want,
        ):
            return False
    for ds in daemonsets:
        s = ds.status
        if s.observed_generation != ds.metadata.generation or not s.desired_number_scheduled:
            return False
        if not (
            s.desired_number_scheduled
            == s.number_ready
            == s.updated_number_scheduled
            == s.number_available
        ):
            return False
    return len(env.release_pods()) == sum(d.spec.replicas for d in deployments) + 1


# ----- workloads and metrics ---------------------------------------------------------------------


def trainingjob(name: str, workers: int, gpus: int, seconds: int) -> dict[str, Any]:
    """A TrainingJob whose workers are real containers: they report their GPUs and sleep."""
    body = tj.trainingjob(name, workers, gpus, exit_code=None)
    body["spec"]["template"]["spec"]["containers"] = [
        {
            "name": "trainer",
            "image": IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", f"{REPORT}; sleep {seconds}"],
        }
    ]
    return body


def labelled_job(name: str, seconds: int) -> client.V1Job:
    gpu = {"nvidia.com/gpu": "1"}
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"gangshare.io/queue": "default"}),
        spec=client.V1JobSpec(
            suspend=True,
            completion_mode="Indexed",
            completions=2,
            parallelism=2,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    # A Job's pods keep the scheduler they name (docs/decisions.md): this one
                    # names the release's, so its extender filters them too.
                    scheduler_name="gangshare-scheduler",
                    restart_policy="Never",
                    containers=[
                        client.V1Container(
                            name="trainer",
                            image=IMAGE,
                            image_pull_policy="Never",
                            command=["sh", "-c", f"{REPORT}; sleep {seconds}"],
                            resources=client.V1ResourceRequirements(limits=gpu),
                        )
                    ],
                )
            ),
        ),
    )


def metric_total(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        ours = line.startswith((name + "{", name + " "))
        if ours and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ----- the host's view of a pod's containers -------------------------------------------------


@dataclass(frozen=True)
class HostProcess:
    pid: int
    argv: list[str]
    uid: int
    cap_eff: int
    no_new_privs: bool
    state: str
    root_read_only: bool


def pod_processes(pod_uid: str) -> list[HostProcess]:
    """The processes of a pod's containers (not its sandbox), by the pod's cgroup."""
    found = []
    for pid in realnode_host.all_pids():
        try:
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
            status = Path(f"/proc/{pid}/status").read_text()
            mountinfo = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            continue
        if f"pod{pod_uid}" not in cgroups and f"pod{pod_uid.replace('-', '_')}" not in cgroups:
            continue
        _, argv = realnode_host.process_names(pid)
        if argv == ["sleep", "1000000"]:
            continue  # the sandbox ("pause") process of the test image
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        found.append(
            HostProcess(
                pid=pid,
                argv=argv,
                uid=int(fields["Uid"].split()[1]),  # effective
                cap_eff=int(fields["CapEff"], 16),
                no_new_privs=fields.get("NoNewPrivs", "0").strip() == "1",
                state=fields["State"].split()[0],
                root_read_only=_root_read_only(mountinfo),
            )
        )
    return found


def _root_read_only(mountinfo: str) -> bool:
    for line in mountinfo.splitlines():
        parts = line.split()
        if parts[4] == "/":
            return "ro" in parts[5].split(",")
    return False
