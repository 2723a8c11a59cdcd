"""The snapshot kept from changes (kube/standing.py) is the one rebuilt from everything: random
churn of nodes, jobs and pods (cordons, heartbeats, removals, plans that break, foreign pods,
jobs deleted mid-run), applied in random batches, compared with build_snapshot each time."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from jobs import make_job, nodes, pod

from gangshare.core.cycle import schedule_cycle
from gangshare.core.queueing import QueuePolicy
from gangshare.kube.ledger import Ledger
from gangshare.kube.snapshot import build_snapshot, decode_api_node
from gangshare.kube.snapshot_drift import DRIFT_KINDS, snapshot_drift
from gangshare.kube.standing import StandingSnapshot
from gangshare.kube.trainingjob import parse_trainingjob

SPEC = {
    "nodePools": [{"name": "n", "count": 4, "gpusPerNode": 4, "nvlinkIslands": [[0, 1], [2, 3]]}]
}
NODE_NAMES = [f"n-{i}" for i in range(4)]


class World:
    """Objects by key, as the stores hold them, and what changed since the last take."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes = {n["metadata"]["name"]: n for n in nodes(SPEC)}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.changed: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
        self.serial = 0

    def put(self, kind: int, key: str, obj: dict[str, Any] | None) -> None:
        store = (self.nodes, self.jobs, self.pods)[kind]
        if obj is None:
            store.pop(key, None)
        else:
            store[key] = obj
        self.changed[kind][key] = obj

    def take(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        taken, self.changed = self.changed, ({}, {}, {})
        return taken

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.15:
            self.node_step()
        elif roll < 0.45 or not self.jobs:
            self.new_job()
        elif roll < 0.6:
            self.job_step()
        else:
            self.pod_step()

    def node_step(self) -> None:
        rng = self.rng
        name = rng.choice(NODE_NAMES)
        node = copy.deepcopy(
            self.nodes.get(name) or {n["metadata"]["name"]: n for n in nodes(SPEC)}[name]
        )
        what = rng.choice(["cordon", "uncordon", "remove", "heartbeat", "allocatable", "taint"])
        if what == "remove" and name in self.nodes:
            self.put(0, name, None)
            return
        if what == "cordon":
            node.setdefault("spec", {})["unschedulable"] = True
        elif what == "uncordon":
            node.setdefault("spec", {})["unschedulable"] = False
        elif what == "allocatable":
            node.setdefault("status", {})["allocatable"] = {
                "cpu": "64",
                "memory": "256Gi",
                "pods": "110",
            }
        elif what == "taint":
            node.setdefault("spec", {})["taints"] = [{"key": "maint", "effect": "NoSchedule"}]
        node["metadata"]["resourceVersion"] = str(self.serial)  # a heartbeat: nothing else
        self.put(0, name, node)

    def new_job(self) -> None:
        rng = self.rng
        self.serial += 1
        name = f"j{self.serial}"
        workers = rng.randint(1, 2)
        phase = rng.choice(["Queued", "Admitted", "Running"])
        job = make_job(name).spec(workers=workers, gpusPerWorker=1)
        if phase != "Queued":
            placement = [
                {"rank": r, "node": rng.choice(NODE_NAMES), "gpus": [rng.randint(0, 3)]}
                for r in range(workers)
            ]
            job.status(
                phase=phase,
                placement=placement,
                admittedAt="2027-01-15T08:00:00Z",
                borrowed=rng.random() < 0.3,
            )
        else:
            job.status(phase="Queued")
        self.put(1, f"team/{name}", job.build())

    def job_step(self) -> None:
        rng = self.rng
        key = rng.choice(sorted(self.jobs))
        job = copy.deepcopy(self.jobs[key])
        what = rng.choice(["succeed", "delete", "deleting", "run", "requeue"])
        if what == "delete":
            self.put(1, key, None)
            return
        if what == "deleting":
            job["metadata"]["deletionTimestamp"] = "2027-01-15T08:01:00Z"
        elif what == "succeed":
            job["status"]["phase"] = "Succeeded"
        elif what == "run" and job["status"].get("placement"):
            job["status"]["phase"] = "Running"
            job["status"]["startedAt"] = "2027-01-15T08:00:30Z"
        elif what == "requeue":
            job["status"] = {"phase": "Queued", "attempt": 1}
        self.put(1, key, job)

    def pod_step(self) -> None:
        rng = self.rng
        if self.pods and rng.random() < 0.3:
            key = rng.choice(sorted(self.pods))
            if rng.random() < 0.5:
                self.put(2, key, None)
            else:
                ended = copy.deepcopy(self.pods[key])
                ended["status"]["phase"] = rng.choice(["Succeeded", "Running"])
                self.put(2, key, ended)
            return
        job = self.jobs[rng.choice(sorted(self.jobs))]
        name = job["metadata"]["name"]
        placement = job["status"].get("placement") or [{"rank": 0, "node": "n-0", "gpus": [0]}]
        rank = rng.choice(placement)
        node = rank["node"] if rng.random() < 0.8 else rng.choice([*NODE_NAMES, None])
        worker = pod(name, rank["rank"], phase="Running" if node else "Pending", node=node)
        worker["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "500m"}
        if rng.random() < 0.2:  # a foreign pod with GPUs of its own
            worker["metadata"]["labels"] = {}
            worker["metadata"]["name"] = f"foreign-{self.serial}"
            self.serial += 1
        self.put(2, f"team/{worker['metadata']['name']}", worker)

    def churn(self, standing: StandingSnapshot, most: int) -> None:
        """Up to `most` random steps, handed to `standing` as one batch of changes."""
        for _ in range(self.rng.randint(1, most)):
            self.step()
        nodes_changed, jobs_changed, pods_changed = self.take()
        standing.apply(nodes_changed, pods_changed, jobs_changed)

    def rebuilt(self):
        live = [j for j in self.jobs.values() if not j["metadata"].get("deletionTimestamp")]
        return build_snapshot(self.nodes.values(), self.pods.values(), live)


@pytest.mark.parametrize("seed", range(40))
def test_changes_applied_in_batches_keep_the_snapshot_a_rebuild_makes(seed: int):
    rng = random.Random(seed)
    world = World(rng)
    for _ in range(rng.randint(0, 10)):
        world.step()
    standing = StandingSnapshot.of(world.nodes.values(), world.pods.values(), world.jobs.values())
    world.take()
    checked = 0
    for _ in range(12):
        world.churn(standing, 8)
        drift = snapshot_drift(standing.snapshot(), world.rebuilt())
        assert drift == [], drift
        checked += 1
    assert checked == 12


@pytest.mark.parametrize("seed", range(10))
def test_a_cycle_planned_on_the_standing_cluster_is_undone_after_it(seed: int):
    rng = random.Random(seed)
    world = World(rng)
    for _ in range(15):
        world.step()
    standing = StandingSnapshot.of(world.nodes.values(), world.pods.values(), world.jobs.values())
    waiting = [make_job(f"w{i}").spec(workers=rng.randint(1, 3)).build() for i in range(6)]
    pending = [parse_trainingjob(j).queued(float(i)) for i, j in enumerate(waiting)]
    snapshot = standing.snapshot()
    with snapshot.cluster.undone_after():
        result = schedule_cycle(snapshot.cluster, pending, snapshot.running, QueuePolicy(), 100.0)
    assert snapshot_drift(standing.snapshot(), world.rebuilt()) == []
    if seed == 0:
        assert result.admitted  # the cycle did allocate, so the undo had work to do


def test_the_comparison_sees_a_drift():
    world = World(random.Random(1))
    for _ in range(20):
        world.step()
    standing = StandingSnapshot.of(world.nodes.values(), world.pods.values(), world.jobs.values())
    # A change the standing snapshot never heard of: a new admitted job.
    world.new_job()
    world.jobs[sorted(world.jobs)[-1]]["status"] = {
        "phase": "Admitted",
        "placement": [{"rank": 0, "node": "n-3", "gpus": [3]}],
    }
    drift = snapshot_drift(standing.snapshot(), world.rebuilt())
    kinds = {kind for kind, _ in drift}
    assert {"allocations", "running"} <= kinds <= {*DRIFT_KINDS}, drift


@pytest.mark.parametrize("src,dst", [(a, b) for a in NODE_NAMES for b in NODE_NAMES if a != b])
def test_a_pod_made_again_on_another_node_within_one_batch_holds_on_the_new_one(src, dst):
    """Whichever of the two nodes is held again first: releasing the pod on the old node
    must not take its new hold with it."""
    ledger = Ledger()
    ledger.replace_nodes([decode_api_node(n, scheduling=True) for n in nodes(SPEC)])
    foreign = pod("other", 0, phase="Running", node=src)
    foreign["metadata"]["labels"] = {}
    ledger.replace_pods([foreign])
    moved = copy.deepcopy(foreign)
    moved["spec"]["nodeName"] = dst
    ledger.replace_pods([moved])
    held = ledger.cluster.allocations_of("pod:team/other-worker-0")
    assert [a.node for a in held] == [dst]
    assert ledger.cluster.node(src).free_guaranteed == 4


def decisions(result) -> tuple:
    return (
        [(a.job.key, a.plan.placements, a.borrowed) for a in result.admitted],
        sorted((p.job.key, p.kind, p.reason) for p in result.pending),
        sorted(p.job.key for p in result.preemptions),
    )


@pytest.mark.parametrize("seed", range(20))
def test_a_pass_after_an_undone_one_decides_as_that_one_did(seed: int):
    """Undoing a cycle puts the free-GPU index back in its order too: through churn, a pass
    planning again on the standing cluster makes the very same decisions, ties included."""
    rng = random.Random(seed)
    world = World(rng)
    for _ in range(10):
        world.step()
    standing = StandingSnapshot.of(world.nodes.values(), world.pods.values(), world.jobs.values())
    cluster = standing.ledger.cluster
    waiting = [
        make_job(f"w{i}")
        .spec(workers=rng.randint(1, 3), gpusPerWorker=rng.choice([1, 2]))
        .spec(serviceClass=rng.choice(["Guaranteed", "Opportunistic"]))
        .build()
        for i in range(8)
    ]
    pending = [parse_trainingjob(j).queued(float(i)) for i, j in enumerate(waiting)]
    admitted = 0
    for _ in range(8):
        world.churn(standing, 6)
        running = standing.snapshot().running
        policy = QueuePolicy(backfill=True)
        with cluster.undone_after():
            first = schedule_cycle(cluster, pending, running, policy, 100.0)
        with cluster.undone_after():
            again = schedule_cycle(cluster, pending, running, policy, 100.0)
        assert decisions(first) == decisions(again)
        admitted += len(first.admitted)
    assert admitted  # the cycles did plan, so there was something to undo
