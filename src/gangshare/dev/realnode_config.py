"""Config files and command lines of the real node: our own containerd and a kubelet.

Settings are what the project's build machines (Firecracker VMs, cgroup v1, no systemd, no
CAP_SYS_RESOURCE) needed; the reason for each non-default one sits next to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gangshare.dev.realnode_image import IMAGE_REF

KUBELET_ROOT = Path("/var/lib/kubelet")
POD_LOGS = Path("/var/log/pods")
CNI_BIN_DIR = Path("/usr/lib/cni")
REAL_NODE_LABEL = "gangshare.io/real-node"
# Keeps every pod that does not ask for the real node (the whole KWOK suite) off it.
REAL_NODE_TAINT = f"{REAL_NODE_LABEL}=true:NoSchedule"


@dataclass
class NodeLayout:
    """Files of one real node, all under `root` except what the kubelet fixes itself."""

    root: Path
    logs: Path = field(init=False)
    state: Path = field(init=False)
    containerd_config: Path = field(init=False)
    containerd_root: Path = field(init=False)
    containerd_state: Path = field(init=False)
    containerd_socket: Path = field(init=False)
    cni_conf_dir: Path = field(init=False)
    cni_ipam_dir: Path = field(init=False)
    kubelet_config: Path = field(init=False)

    def __post_init__(self) -> None:
        self.logs = self.root / "logs"
        self.state = self.root / "realnode.json"
        self.containerd_config = self.root / "containerd.toml"
        self.containerd_root = self.root / "containerd" / "root"
        self.containerd_state = self.root / "containerd" / "state"
        self.containerd_socket = self.root / "containerd" / "containerd.sock"
        self.cni_conf_dir = self.root / "cni"
        # host-local's address reservations (its default is /var/lib/cni/networks).
        self.cni_ipam_dir = self.root / "cni-ipam"
        self.kubelet_config = self.root / "kubelet-config.yaml"


@dataclass
class RealNodeState:
    """What `gangshare dev down` (another process) needs to stop a node `up` left running."""

    root: str
    name: str
    kubeconfig: str
    pids: dict[str, int]
    ports: dict[str, int]
    # Pod log folders that were there before the kubelet started: not ours to remove.
    earlier_logs: list[str] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> RealNodeState:
        return cls(**json.loads(path.read_text()))


def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6 config (version 2); everything not named keeps containerd's default."""
    return "\n".join(
        [
            "version = 2",
            f"root = {_toml(layout.containerd_root)}",
            f"state = {_toml(layout.containerd_state)}",
            "",
            "[grpc]",
            f"  address = {_toml(layout.containerd_socket)}",
            "",
            # Its default is /opt/containerd: keep every file of ours under the node's root.
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml(layout.root / 'containerd' / 'opt')}",
            "",
            '[plugins."io.containerd.grpc.v1.cri"]',
            f"  sandbox_image = {_toml(IMAGE_REF)}",
            # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE, which these VMs lack:
            # without this every sandbox dies with "can't get final child's PID from pipe: EOF".
            "  restrict_oom_score_adj = true",
            # Pod network namespaces are mounted under /var/run/netns by default: under the
            # node's state dir, teardown's unmount under the node's root frees them too.
            "  netns_mounts_under_state_dir = true",
            '[plugins."io.containerd.grpc.v1.cri".cni]',
            f"  bin_dir = {_toml(CNI_BIN_DIR)}",
            f"  conf_dir = {_toml(layout.cni_conf_dir)}",
            '[plugins."io.containerd.grpc.v1.cri".containerd]',
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
            '  runtime_type = "io.containerd.runc.v2"',
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
            "  SystemdCgroup = false",
            # runc's state defaults to /run/containerd/runc, outside the node's root.
            f"  Root = {_toml(layout.root / 'containerd' / 'runc')}",
            "",
        ]
    )


def kubelet_config(layout: NodeLayout, port: int, healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # A throwaway node on loopback: the API server never calls it back, no certs to mint.
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # The hosts are on cgroup v1, which 1.35 refuses unless told otherwise; no systemd.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        # A nearly full build disk must not taint the node with disk pressure mid-test.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "registerNode": True,
    }


def kubelet_argv(
    bins: Path, layout: NodeLayout, kubeconfig: Path, name: str, verbosity: int = 2
) -> list[str]:
    return [
        str(bins / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={name}",
        f"--root-dir={KUBELET_ROOT}",
        f"--register-with-taints={REAL_NODE_TAINT}",
        f"--node-labels={REAL_NODE_LABEL}=true",
        f"--v={verbosity}",
    ]


def containerd_argv(layout: NodeLayout, containerd: str) -> list[str]:
    return [containerd, f"--config={layout.containerd_config}", "--log-level=info"]


def _toml(value: object) -> str:
    # A TOML basic string is a JSON string for everything a path or image name holds.
    return json.dumps(str(value))
