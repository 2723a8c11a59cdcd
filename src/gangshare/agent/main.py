"""`gangshare agent`: the node DaemonSet (see device-plugin/README.md)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gangshare.agent.backend import BackendError, GpuBackend
from gangshare.agent.devices import DeviceError
from gangshare.core.coordinator import ControlParams
from gangshare.core.gpu import DEFAULT_SHARE_SLOTS

log = logging.getLogger("gangshare.agent")


def add_agent_command(commands: Any) -> None:
    agent = commands.add_parser(
        "agent", help="run the node agent (NVML inventory, kubelet device plugin, read-back)"
    )
    env = os.environ.get
    agent.add_argument(
        "--node-name", default=env("NODE_NAME"), help="this node (default: $NODE_NAME)"
    )
    agent.add_argument(
        "--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, then ~/.kube/config"
    )
    agent.add_argument(
        "--nvml",
        choices=("nvml", "fake"),
        default=env("GANGSHARE_NVML", "nvml"),
        help="GPU backend: the real NVML library, or a fake from --fake-spec",
    )
    agent.add_argument(
        "--fake-spec",
        type=Path,
        default=None,
        help="cluster spec file for --nvml fake (nodePools, with an optional fake: section)",
    )
    agent.add_argument(
        "--share-slots",
        type=int,
        default=DEFAULT_SHARE_SLOTS,
        help=f"gangshare.io/gpu-share slots per GPU (default {DEFAULT_SHARE_SLOTS})",
    )
    agent.add_argument(
        "--publish-interval",
        type=float,
        default=10.0,
        help="least seconds between two utilization reports on the Node",
    )
    agent.add_argument(
        "--device-plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins")
    )
    agent.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    )
    agent.add_argument(
        "--socket-dir",
        type=Path,
        default=Path("/var/run/gangshare"),
        help="host folder mounted read-only into GPU containers for the training SDK",
    )
    agent.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/var/run/gangshare-agent"),
        help="host folder for state that outlives a killed agent (the pods it may have "
        "stopped); never mounted into tenants' containers",
    )
    agent.add_argument(
        "--mps-pipe-dir",
        type=Path,
        default=Path("/tmp/nvidia-mps"),
        help="CUDA MPS pipe folder; used when an MPS control daemon runs there",
    )
    agent.add_argument(
        "--cgroup-root",
        type=Path,
        default=Path("/sys/fs/cgroup"),
        help="where the host's cgroup hierarchies are mounted, writable: throttled pods are "
        "frozen there (cgroup.freeze, or the v1 freezer)",
    )
    agent.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="slowdown a guaranteed job may see from its opportunistic neighbours (0.05 = 5%%)",
    )
    agent.add_argument(
        "--control-period", type=float, default=2.0, help="seconds between coordinator decisions"
    )
    agent.add_argument(
        "--metrics-port", type=int, default=9402, help="Prometheus /metrics port (0: none)"
    )
    agent.add_argument("--verbose", action="store_true")
    agent.set_defaults(run=run_agent)


def _fail(message: str) -> int:
    print(f"gangshare agent: {message}", file=sys.stderr)
    return 2


def open_backend(args: argparse.Namespace) -> GpuBackend:
    if args.nvml == "fake":
        if args.fake_spec is None:
            raise BackendError("--fake-spec: required with --nvml fake")
        from gangshare.agent.fake_nvml import FakeBackend

        return FakeBackend(args.fake_spec, args.node_name)
    from gangshare.agent.nvml import NvmlBackend

    return NvmlBackend()


def run_agent(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.node_name:
        return _fail("--node-name: required (or set NODE_NAME from the downward API)")
    if args.share_slots < 1:
        return _fail(f"--share-slots: must be at least 1, got {args.share_slots}")
    if args.publish_interval <= 0:
        return _fail(f"--publish-interval: must be positive, got {args.publish_interval}")
    try:
        control = ControlParams(tolerance=args.tolerance, period_seconds=args.control_period)
    except ValueError as err:
        return _fail(f"--tolerance/--control-period: {err}")
    if args.control_period <= 0:
        return _fail(f"--control-period: must be positive, got {args.control_period}")
    try:
        backend = open_backend(args)
    except BackendError as err:
        return _fail(str(err))
    # Imported late so `gangshare agent --help` works before the stubs are generated.
    from gangshare.agent.agent import Agent, AgentConfig
    from gangshare.agent.nodeapi import NodeApi
    from gangshare.agent.podresources import PodResourcesClient
    from gangshare.kube.client import connect

    if args.socket_dir is not None:
        args.socket_dir.mkdir(parents=True, exist_ok=True)
    config = AgentConfig(
        node=args.node_name,
        plugin_dir=args.device_plugin_dir,
        socket_dir=args.socket_dir,
        share_slots=args.share_slots,
        publish_interval=args.publish_interval,
        mps_pipe_dir=args.mps_pipe_dir,
        state_dir=args.state_dir,
        cgroup_root=args.cgroup_root,
        control=control,
    )
    try:
        agent = Agent(
            config,
            backend,
            NodeApi(connect(args.kubeconfig), args.node_name),
            PodResourcesClient(args.pod_resources_socket),
        )
    except DeviceError as err:
        return _fail(str(err))
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=agent.metrics.registry)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    inventory = backend.inventory()
    log.info(
        "node %s: %d GPUs (%s), NVLink islands %s, %d share slots each",
        args.node_name,
        len(inventory.gpus),
        inventory.gpus[0].model if inventory.gpus else "none",
        list(inventory.islands()),
        args.share_slots,
    )
    agent.run()
    return 0
