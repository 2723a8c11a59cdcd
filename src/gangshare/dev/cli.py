"""`gangshare dev up | down | status | build`: the local control plane for development."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gangshare.core.spec import NodeSpec, SpecError, parse_cluster_spec
from gangshare.dev import binaries, processes
from gangshare.dev.cluster import ClusterError, ClusterState, LocalCluster
from gangshare.dev.realnode import RealNode, RealNodeError


def default_root() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("GANGSHARE_DEV_DIR") or Path(base) / "gangshare" / "dev")


def load_nodes(path: Path | None) -> list[NodeSpec]:
    """Nodes from a cluster spec file, or the embedded demo cluster."""
    try:
        if path is None:
            text = resources.files("gangshare.dev").joinpath("data/demo-cluster.yaml").read_text()
        else:
            text = path.read_text()
        doc: Any = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"--cluster {path}: cannot read ({err})") from None
    return parse_cluster_spec(doc or {})


def add_dev_command(commands: Any) -> None:
    dev = commands.add_parser("dev", help="run a local control plane with simulated GPU nodes")
    actions = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text, run in (
        (
            "up",
            "start etcd, kube-apiserver, scheduler, controller-manager, KWOK and GPU nodes",
            run_up,
        ),
        ("down", "stop every component of the local cluster", run_down),
        ("status", "show the local cluster's components and nodes", run_status),
        ("build", "build (or reuse) the Kubernetes binaries", run_build),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument(
            "--root", type=Path, default=None, help="state folder (default: %(default)s)"
        )
        action.set_defaults(run=run)
        if name == "up":
            action.add_argument(
                "--cluster", type=Path, default=None, help="cluster spec YAML (default: demo)"
            )
            action.add_argument("--timeout", type=float, default=180.0)
            action.add_argument(
                "--real-node",
                action="store_true",
                help="also run a real kubelet and containerd node (needs root and "
                "scripts/install-node-deps.sh); tainted gangshare.io/real-node=true:NoSchedule",
            )


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root) if args.root else default_root()


def run_build(args: argparse.Namespace) -> int:
    try:
        print(binaries.bin_dir(build=True))
    except binaries.BinariesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _real_node_root(root: Path) -> Path:
    return root / "real-node"


def run_up(args: argparse.Namespace) -> int:
    try:
        nodes = load_nodes(args.cluster)
        bins = binaries.bin_dir(build=True)
        cluster = LocalCluster(_root(args), bins, attached=False)
        state = cluster.up(nodes, timeout=args.timeout)
    except (SpecError, ClusterError, binaries.BinariesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.real_node:
        real = RealNode(_real_node_root(_root(args)), bins, Path(state.kubeconfig), attached=False)
        try:
            real.up(timeout=args.timeout)
        except RealNodeError as err:
            # All or nothing: a cluster without the node asked for would only mislead.
            cluster.down()
            print(f"error: real node: {err}", file=sys.stderr)
            return 1
        print(f"real node {real.name} up (kubelet, containerd); logs: {real.layout.logs}")
    print(f"local cluster up: {len(state.nodes)} GPU nodes, API server {state.server}")
    print(f"  export KUBECONFIG={state.kubeconfig}")
    print(f"  logs: {state.logs}")
    print("  stop with: gangshare dev down")
    return 0


def run_down(args: argparse.Namespace) -> int:
    # The real node first: deleting its Node object needs the API server.
    real = RealNode.recorded(_real_node_root(_root(args)))
    if real is not None:
        left = real.down()
        if left:
            print(f"error: the real node left behind: {', '.join(left)}", file=sys.stderr)
            return 1
        print(f"real node {real.name} stopped")
    cluster = LocalCluster(_root(args), Path(), attached=False)
    if not cluster.layout.state.exists():
        print("no local cluster is running")
        return 0
    ports = ClusterState.load(cluster.layout.state).ports
    survivors = cluster.down()
    if survivors:
        print(f"error: still running: {', '.join(survivors)}", file=sys.stderr)
        return 1
    busy = [p for p in ports.values() if processes.port_is_open(p)]
    if busy:
        print(f"error: ports still in use: {busy}", file=sys.stderr)
        return 1
    print("local cluster stopped; no component left running")
    return 0


def run_status(args: argparse.Namespace) -> int:
    layout_state = LocalCluster(_root(args), Path()).layout.state
    if not layout_state.exists():
        print("no local cluster is running")
        return 1
    state = ClusterState.load(layout_state)
    print(f"API server {state.server}  kubeconfig {state.kubeconfig}")
    down = 0
    for name, pid in state.pids.items():
        alive = processes.Child(name, pid, Path()).alive()
        down += not alive
        print(f"  {name:<26} pid {pid:<8} {'running' if alive else 'NOT RUNNING'}")
    print(f"  {len(state.nodes)} simulated GPU nodes; logs in {state.logs}")
    real = RealNode.recorded(_real_node_root(_root(args)))
    for child in real.children.values() if real is not None else []:
        alive = child.alive()
        down += not alive
        label = f"real node {child.name}"
        print(f"  {label:<26} pid {child.pid:<8} {'running' if alive else 'NOT RUNNING'}")
    return 1 if down else 0
