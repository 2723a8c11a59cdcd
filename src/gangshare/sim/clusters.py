"""Clusters to replay on: a cluster spec (YAML), or one derived from the Alibaba node list.

A spec is what `gangshare plan` reads (`nodePools`, parsed by the core) plus a
simulator-only `queues` section, since the simulator has no Queue objects to read:

    queues:
      - name: 6214e9   # the trace's queue (Philly: the virtual cluster)
        quota: 512     # guaranteed GPUs (omit for no quota)
        weight: 512    # fair-share weight (default: the quota, else 1)
        gpuModel: X    # optional: the queue's jobs only run on GPUs of this model; a pool
                       # whose model only this queue asks for is that queue's own machines
        cohort: c      # optional: queues of one cohort lend each other idle quota
        borrowingLimit: 64  # optional: most GPUs the queue borrows at once (default: any)
        lendingLimit: 32    # optional: most of its idle quota it lends (default: all)

Cohorts only take effect under the `cohort` policy (without it quotas are hard walls,
as before); that policy puts every queue with a quota in one cohort, `all`, unless
the spec names cohorts itself.

The Alibaba node list (sn, gpu, model) names GPU models but not their memory,
NVLink layout or racks; `ALIBABA_GPU_MEMORY_MIB` and `alibaba_node` state what is
assumed. `fraction` keeps that share of each (model, GPUs per node) group, in file
order, because the published pod list never uses more than 71 GPUs at once, so the
full 6,212-GPU cluster never queues anything.

Every node carries the label `nvidia.com/gpu.product` = its GPU model, as GPU feature
discovery labels real nodes, so a job that accepts several models can say so with node
affinity (an Alibaba gpu_spec such as `V100M16|V100M32`, see workload.py).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gangshare.core import Cluster
from gangshare.core.annotations import GPU_PRODUCT_LABEL
from gangshare.core.gpu import Gpu
from gangshare.core.spec import NodeSpec, SpecError, gpu_uuid, parse_cluster_spec

# Public figures for the named models; G1..G3 are undisclosed, assumed 32 GiB (V100-class).
ALIBABA_GPU_MEMORY_MIB = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G1": 32768,
    "G2": 32768,
    "G3": 32768,
}
ALIBABA_NODES_PER_RACK = 32


@dataclass
class SimCluster:
    cluster: Cluster
    description: str
    quotas: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    # Queue -> the GPU model its jobs require.
    pins: dict[str, str] = field(default_factory=dict)
    # Queue -> its cohort, and the borrowing / lending limits the spec sets (GPUs).
    cohorts: dict[str, str] = field(default_factory=dict)
    borrowing_limits: dict[str, int] = field(default_factory=dict)
    lending_limits: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return sum(n.gpu_count for n in self.cluster.nodes.values())


def load_sim_cluster(path: Path, fraction: float = 1.0) -> SimCluster:
    if not 0 < fraction <= 1:
        raise SpecError(f"--cluster-fraction: must be in (0, 1], got {fraction}")
    if path.suffix.lower() == ".csv":
        return alibaba_cluster(path, fraction)
    if fraction != 1:
        raise SpecError("--cluster-fraction: only applies to a node list CSV")
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except OSError as err:
        raise SpecError(f"--cluster: cannot read {path} ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise SpecError(f"--cluster: {path} is not YAML ({err})") from None
    try:
        nodes = parse_cluster_spec(doc or {})
    except SpecError as err:
        raise SpecError(f"--cluster: {err}") from None
    queues = parse_queues(doc.get("queues", []))
    models = {g.model for n in nodes for g in n.gpus}
    for queue, model in queues.pins.items():
        if model not in models:
            raise SpecError(f"--cluster: queues: {queue}: no node has GPU model {model}")
    gpus = sum(len(n.gpus) for n in nodes)
    queues.cluster = Cluster(labelled(n).to_state() for n in nodes)
    queues.description = f"{path.name}: {len(nodes)} nodes, {gpus} GPUs"
    return queues


def parse_queues(queues: Any) -> SimCluster:
    """The `queues` section, on an empty cluster (the caller adds the nodes)."""
    if not isinstance(queues, list):
        raise SpecError("--cluster: queues: must be a list")
    quotas: dict[str, int] = {}
    weights: dict[str, float] = {}
    pins: dict[str, str] = {}
    cohorts: dict[str, str] = {}
    limits: dict[str, dict[str, int]] = {"borrowingLimit": {}, "lendingLimit": {}}
    for position, queue in enumerate(queues):
        path = f"--cluster: queues[{position}]"
        if not isinstance(queue, Mapping) or not isinstance(queue.get("name"), str | int):
            raise SpecError(f"{path}.name: required")
        name = str(queue["name"])
        if name in weights:
            raise SpecError(f"{path}.name: queue {name} is listed twice")
        quota = queue.get("quota")
        if quota is not None:
            if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
                raise SpecError(f"{path}.quota: must be a non-negative integer, got {quota!r}")
            quotas[name] = quota
        weight = queue.get("weight", quota if quota else 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise SpecError(f"{path}.weight: must be a positive number, got {weight!r}")
        weights[name] = float(weight)
        model = queue.get("gpuModel")
        if model is not None:
            if not isinstance(model, str) or not model:
                raise SpecError(f"{path}.gpuModel: must be a GPU model name, got {model!r}")
            pins[name] = model
        cohort = queue.get("cohort")
        if cohort is not None:
            if not isinstance(cohort, str | int) or isinstance(cohort, bool) or cohort == "":
                raise SpecError(f"{path}.cohort: must be a cohort name, got {cohort!r}")
            cohorts[name] = str(cohort)
        for key, found in limits.items():
            limit = queue.get(key)
            if limit is None:
                continue
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise SpecError(f"{path}.{key}: must be a non-negative integer, got {limit!r}")
            found[name] = limit
    return SimCluster(
        Cluster(),
        "",
        quotas,
        weights,
        pins,
        cohorts,
        limits["borrowingLimit"],
        limits["lendingLimit"],
    )


def labelled(node: NodeSpec) -> NodeSpec:
    """The node with its GPU model as the `nvidia.com/gpu.product` label."""
    if not node.gpus or GPU_PRODUCT_LABEL in node.labels:
        return node
    return replace(node, labels={**node.labels, GPU_PRODUCT_LABEL: node.gpus[0].model})


def alibaba_node(name: str, gpus: int, model: str, rack: str) -> NodeSpec:
    """Assumed layout: 8-GPU nodes have two NVLink islands of 4, smaller nodes none (PCIe)."""
    memory = ALIBABA_GPU_MEMORY_MIB.get(model, 16384)
    islands = ((0, 1, 2, 3), (4, 5, 6, 7)) if gpus == 8 else tuple((g,) for g in range(gpus))
    return NodeSpec(
        name=name,
        rack=rack,
        gpus=tuple(Gpu(g, gpu_uuid(name, g), model, memory) for g in range(gpus)),
        islands=islands,
        labels={GPU_PRODUCT_LABEL: model},
    )


def alibaba_cluster(path: Path, fraction: float) -> SimCluster:
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as err:
        raise SpecError(f"--cluster: cannot read {path} ({err.strerror or err})") from None
    needed = {"sn", "gpu", "model"}
    if not rows or not needed <= set(rows[0]):
        lacks = f"missing {sorted(needed - set(rows[0]))}" if rows else "and has no rows"
        raise SpecError(f"--cluster: {path}: a node list needs columns {sorted(needed)}, {lacks}")
    groups: dict[tuple[str, int], list[str]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            gpus = int(row["gpu"])
        except ValueError:
            raise SpecError(f"--cluster: line {line}: gpu: must be an integer") from None
        if gpus > 0:
            groups.setdefault((row["model"].strip(), gpus), []).append(row["sn"].strip())
    kept: list[tuple[str, int, str]] = []
    for (model, gpus), names in groups.items():
        keep = len(names) if fraction == 1 else round(len(names) * fraction)
        kept.extend((name, gpus, model) for name in names[:keep])
    if not kept:
        raise SpecError(f"--cluster-fraction: {fraction} keeps no node of {path}")
    kept.sort()
    nodes = [
        alibaba_node(name, gpus, model, f"rack-{i // ALIBABA_NODES_PER_RACK:02d}")
        for i, (name, gpus, model) in enumerate(kept)
    ]
    total = sum(len(n.gpus) for n in nodes)
    share = "" if fraction == 1 else f" ({fraction:g} of each model group)"
    return SimCluster(
        Cluster(n.to_state() for n in nodes),
        f"{path.name}{share}: {len(nodes)} nodes, {total} GPUs",
    )
