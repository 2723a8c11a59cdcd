"""Command lines and config files for each control-plane component, on loopback ports."""

from __future__ import annotations

import base64
import os
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gangshare.dev.pki import Credentials

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_NAME = "gangshare-dev"
GANGSHARE_SCHEDULER = "gangshare-scheduler"


@dataclass
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int
    kwok: int
    extender: int
    gangshare_scheduler: int
    extender_metrics: int
    jobset_webhook: int
    jobset_health: int
    trainer_webhook: int
    trainer_health: int
    training_operator_webhook: int
    training_operator_health: int

    def all(self) -> list[int]:
        return list(asdict(self).values())


@dataclass
class Layout:
    """Files of one local cluster, all under `root`."""

    root: Path
    pki: Path = field(init=False)
    logs: Path = field(init=False)
    etcd_data: Path = field(init=False)
    kubeconfig: Path = field(init=False)
    scheduler_config: Path = field(init=False)
    gangshare_scheduler_config: Path = field(init=False)
    kwok_config: Path = field(init=False)
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.etcd_data = self.root / "etcd"
        self.kubeconfig = self.root / "kubeconfig"
        self.scheduler_config = self.root / "scheduler-config.yaml"
        self.gangshare_scheduler_config = self.root / "gangshare-scheduler-config.yaml"
        self.kwok_config = self.root / "kwok.yaml"
        self.state = self.root / "state.json"


def kubeconfig(server: str, creds: Credentials) -> dict[str, Any]:
    ca = base64.b64encode(creds.ca_cert.read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": "admin", "user": {"token": creds.admin_token}}],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": "admin"}}],
        "current-context": CLUSTER_NAME,
    }


def scheduler_config(kubeconfig_path: Path) -> dict[str, Any]:
    """The cluster's default kube-scheduler: the stock profile only."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}],
    }


def gangshare_scheduler_config(
    template: Path, kubeconfig_path: Path, extender_port: int
) -> dict[str, Any]:
    """extender/scheduler-config.yaml, pointed at this cluster and the extender's loopback port."""
    config: dict[str, Any] = yaml.safe_load(template.read_text())
    config["clientConnection"]["kubeconfig"] = str(kubeconfig_path)
    config["leaderElection"] = {"leaderElect": False}
    for extender in config.get("extenders") or []:
        extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}/"
    return config


def kwok_config() -> str:
    """KwokConfiguration plus gangshare's own stages (node ready, pod running/finish/delete)."""
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": "kwok.x-k8s.io/node=fake",
            "nodeLeaseDurationSeconds": 40,
            # A config file switches off kwok's built-in defaults, so state them.
            "nodeLeaseParallelism": 4,
            # One worker per simulated kubelet would be the truth; 16 keeps a 512-pod gang's
            # Running status within a second or two of its last bind (4 took 5.5 s).
            "podPlayStageParallelism": 16,
            "nodePlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 2,
            "enablePodsOnNodeSyncListPager": True,
            "cidr": "10.244.0.0/16",
            "nodeIP": "10.244.0.1",
        },
    }
    stages = resources.files("gangshare.dev").joinpath("data/kwok-stages.yaml").read_text()
    return yaml.safe_dump(options, sort_keys=False) + "---\n" + stages


def etcd_argv(bins: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bins / "etcd"),
        "--name=gangshare",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gangshare={peer}",
        # A throwaway dev store: durability buys nothing, fsync costs every write.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(bins: Path, creds: Credentials, ports: Ports) -> list[str]:
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={creds.serving_cert}",
        f"--tls-private-key-file={creds.serving_key}",
        f"--client-ca-file={creds.ca_cert}",
        f"--token-auth-file={creds.token_file}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={creds.sa_pub}",
        f"--service-account-signing-key-file={creds.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(
    bins: Path, layout: Layout, creds: Credentials, ports: Ports
) -> list[str]:
    kc = str(layout.kubeconfig)
    return [
        str(bins / "kube-controller-manager"),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        "--leader-elect=false",
        f"--service-account-private-key-file={creds.sa_key}",
        f"--root-ca-file={creds.ca_cert}",
        f"--cluster-name={CLUSTER_NAME}",
        "--use-service-account-credentials=false",
        # Its client's default rate (20/s) lifted the not-ready taint from 500 new nodes in
        # about 110 s and garbage-collected thousands of pods in minutes; large clusters raise it.
        "--kube-api-qps=100",
        "--kube-api-burst=200",
        "--v=1",
    ]


def scheduler_argv(bins: Path, layout: Layout, config: Path, port: int) -> list[str]:
    kc = str(layout.kubeconfig)
    return [
        str(bins / "kube-scheduler"),
        f"--config={config}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--v=2",
    ]


def extender_argv(layout: Layout, ports: Ports) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gangshare.cli",
        "extender",
        f"--kubeconfig={layout.kubeconfig}",
        "--host=127.0.0.1",
        f"--port={ports.extender}",
        "--metrics-host=127.0.0.1",
        f"--metrics-port={ports.extender_metrics}",
        # Debugging aid: GANGSHARE_EXTENDER_RECORD=DIR keeps what kube-scheduler sends.
        *(
            [f"--record={record}"]
            if (record := os.environ.get("GANGSHARE_EXTENDER_RECORD"))
            else []
        ),
    ]


def kwok_argv(bins: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bins / "kwok"),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={layout.kwok_config}",
        f"--server-address=127.0.0.1:{ports.kwok}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
    ]
