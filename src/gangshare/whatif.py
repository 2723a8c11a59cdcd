"""`gangshare plan`: ask the core where a gang would go on a cluster spec, without a cluster.

A what-if tool for platform teams: same code path as the operator's admission.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gangshare.core import (
    Cluster,
    GangPlan,
    GangRequest,
    ServiceClass,
    Topology,
    TopologyPolicy,
    TopologyScope,
    plan_gang,
)
from gangshare.core.spec import SpecError, parse_cluster_spec

# Package data of gangshare.dev (see [tool.setuptools.package-data] in pyproject.toml).
DEMO_CLUSTER = "data/demo-cluster.yaml"


def load_cluster(path: Path | None) -> Cluster:
    """The cluster of a spec file, or the embedded demo cluster (`gangshare dev up`'s) for None.

    The embedded spec ships in the wheel, so `gangshare plan` runs anywhere it is installed.
    """
    try:
        if path is None:
            text = resources.files("gangshare.dev").joinpath(DEMO_CLUSTER).read_text()
        else:
            text = path.read_text()
        doc: Any = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        where = path or f"gangshare.dev/{DEMO_CLUSTER}"
        raise SpecError(f"{where}: cannot read cluster spec ({err})") from None
    return Cluster(node.to_state() for node in parse_cluster_spec(doc or {}))


def add_plan_command(commands: Any) -> None:
    plan = commands.add_parser("plan", help="show where a gang would be placed on a cluster spec")
    plan.add_argument(
        "--cluster",
        type=Path,
        default=None,
        help="cluster spec YAML (nodePools; default: the embedded demo cluster of `gangshare dev`)",
    )
    plan.add_argument("--workers", type=int, default=1)
    plan.add_argument("--gpus", type=int, default=1, help="GPUs per worker")
    plan.add_argument(
        "--class",
        dest="service_class",
        default="Guaranteed",
        choices=[c.value for c in ServiceClass],
    )
    plan.add_argument("--gpu-memory-mib", type=int, default=None)
    plan.add_argument("--policy", default="Preferred", choices=[p.value for p in TopologyPolicy])
    plan.add_argument("--scope", default="NVLink", choices=[s.value for s in TopologyScope])
    plan.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    try:
        cluster = load_cluster(args.cluster)
        gang = GangRequest(
            "what-if",
            args.workers,
            args.gpus,
            ServiceClass(args.service_class),
            Topology(TopologyPolicy(args.policy), TopologyScope(args.scope)),
            args.gpu_memory_mib,
        )
    except (SpecError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = plan_gang(cluster, gang)
    if not isinstance(result, GangPlan):
        print(f"unschedulable: {result.reason}")
        return 1
    print(f"{'RANK':<6}{'NODE':<20}{'RACK':<12}GPUS")
    for p in result.placements:
        rack = cluster.node(p.node).rack
        print(f"{p.rank:<6}{p.node:<20}{rack:<12}{','.join(map(str, p.gpu_indices))}")
    suffix = " (topology preference relaxed)" if result.relaxed else ""
    print(f"{len(result.nodes)} node(s), {len(result.racks(cluster))} rack(s){suffix}")
    return 0
