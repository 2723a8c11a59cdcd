"""A TrainingJob's replica groups (spec.replicaGroups): read into one gang of pod sets, made into
pods of their own template and GPUs, and held by the ledger rank by rank (pure)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jobs import make_job, pod

from gangshare.core import Gpu, NodeState
from gangshare.core.job import PodSet
from gangshare.kube.claims import job_hold, pod_facts
from gangshare.kube.ledger import Ledger
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.lifecycle import Observation, detect_actions

NOW = 1_800_000_000.0
CPU = {"cpu": "2", "memory": "1Gi"}


def launcher(**extra: Any) -> dict[str, Any]:
    return {
        "name": "launcher",
        "replicas": 1,
        "template": {
            "spec": {"containers": [{"name": "l", "image": "l:1", "resources": {"requests": CPU}}]}
        },
        **extra,
    }


def mpi_job(**status: Any):
    return make_job("mpi").spec(workers=2, gpusPerWorker=4, replicaGroups=[launcher()])


def test_replica_groups_are_pod_sets_ranked_after_the_workers():
    spec = parse_trainingjob(mpi_job().build())
    gang = spec.gang()
    assert gang.pod_sets[1] == PodSet("launcher", 1, 0, gang.companions[0].constraints)
    assert dict(gang.companions[0].constraints.resources)["cpu"] == 2000
    assert (spec.pod_count, spec.total_gpus) == (3, 8)
    assert [spec.pod_name(r) for r in range(3)] == [
        "mpi-worker-0",
        "mpi-worker-1",
        "mpi-launcher-0",
    ]


@pytest.mark.parametrize(
    ("group", "field"),
    [
        (launcher(name="worker"), r"spec.replicaGroups\[0\].name"),
        (launcher(name="Bad_Name"), r"spec.replicaGroups\[0\].name"),
        (launcher(replicas=0), r"spec.replicaGroups\[0\].replicas"),
        (launcher(gpus=65), r"spec.replicaGroups\[0\].gpus"),
        (
            launcher(
                template={
                    "spec": {
                        "containers": [
                            {"name": "a", "image": "a"},
                            {
                                "name": "b",
                                "image": "b",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            },
                        ]
                    }
                }
            ),
            r"spec.replicaGroups\[0\].template.spec.containers\[1\].resources",
        ),
        (
            launcher(
                template={"spec": {"nodeName": "n", "containers": [{"name": "a", "image": "a"}]}}
            ),
            r"spec.replicaGroups\[0\].template.spec.nodeName",
        ),
    ],
)
def test_a_bad_replica_group_is_refused_naming_its_field(group, field):
    with pytest.raises(InvalidSpec, match=field):
        parse_trainingjob(make_job("mpi").spec(replicaGroups=[group]).build())


def test_two_groups_of_one_name_are_refused():
    job = make_job("mpi").spec(replicaGroups=[launcher(), launcher()]).build()
    with pytest.raises(InvalidSpec, match=r"spec.replicaGroups\[1\].name"):
        parse_trainingjob(job)


PLACEMENT = [
    {"rank": 0, "node": "n-0", "gpus": [0, 1, 2, 3]},
    {"rank": 1, "node": "n-0", "gpus": [4, 5, 6, 7]},
    {"rank": 2, "node": "n-0", "gpus": []},
]


def admitted() -> dict[str, Any]:
    return (
        mpi_job()
        .status(phase="Admitted", attempt=0, placement=PLACEMENT, observedGeneration=1)
        .build()
    )


def test_an_admitted_gang_creates_its_group_pod_from_the_groups_template():
    actions = detect_actions(Observation(admitted(), [], False, NOW), "gangshare-scheduler")
    pods = {p["metadata"]["name"]: p for p in actions.create_pods}
    assert sorted(pods) == ["mpi-launcher-0", "mpi-worker-0", "mpi-worker-1"]
    group_pod = pods["mpi-launcher-0"]
    labels = group_pod["metadata"]["labels"]
    assert labels["gangshare.io/replica-group"] == "launcher"
    assert labels["gangshare.io/rank"] == "2"
    container = group_pod["spec"]["containers"][0]
    assert container["image"] == "l:1"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "gangshare.io/planned-gpus" not in group_pod["metadata"]["annotations"]
    assert group_pod["spec"]["schedulingGates"] == [{"name": "gangshare.io/gang"}]
    assert actions.create_service is not None
    worker = pods["mpi-worker-0"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "4"


def launcher_pod(node: str | None, phase: str = "Pending") -> dict[str, Any]:
    found = pod("mpi", 2, node=node, phase=phase)
    found["metadata"]["name"] = "mpi-launcher-0"
    found["metadata"]["labels"]["gangshare.io/replica-group"] = "launcher"
    found["spec"]["containers"] = [{"name": "l", "resources": {"requests": CPU}}]
    return found


def test_the_ledger_holds_a_cpu_ranks_plan_until_its_pod_is_bound():
    ledger = Ledger()
    node = NodeState.build("n-0", [Gpu(i, f"GPU-{i}", "H100", 81920) for i in range(8)])
    node.allocatable = {"cpu": 16000, "memory": 64 * 2**30, "pods": 110}
    ledger.replace_nodes([node])
    running = copy.deepcopy(admitted())
    ledger.replace_jobs([running])
    hold, _ = job_hold(running)
    assert hold is not None and hold.pod_name(2) == "mpi-launcher-0"
    # Planned: the launcher's CPU is promised on its node, beside the workers' GPUs.
    assert ledger.cluster.node("n-0").requested.get("cpu") == 2000
    assert ledger.cluster.node("n-0").free_guaranteed == 0
    bound = launcher_pod("n-0", "Running")
    facts, _ = pod_facts(bound)
    assert facts is not None and facts.count == 0 and facts.identity is not None
    ledger.replace_pods([bound])
    # Bound, it is its rank's fact: the pod list counts its CPU, the plan no longer does.
    assert ledger.cluster.node("n-0").requested.get("cpu", 0) == 0
    assert "team/mpi" not in ledger.displaced()
    # A look-alike named for another group is no worker of the job.
    impostor = launcher_pod("n-0", "Running")
    impostor["metadata"]["labels"]["gangshare.io/replica-group"] = "other"
    wrong, _ = pod_facts(impostor)
    assert wrong is not None and wrong.identity is None
