"""Worker pod manifests: GPUs, rendezvous environment, plan annotations, ownership."""

from jobs import make_job

from gangshare.kube.scheduling import gpu_devices
from gangshare.kube.trainingjob import parse_trainingjob
from gangshare.operator.lifecycle import Observation, detect_actions
from gangshare.operator.manifests import worker_pod


def env_of(pod):
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_guaranteed_worker_requests_whole_gpus_and_gets_torchrun_environment():
    job = parse_trainingjob(make_job("llm").spec(workers=2, gpusPerWorker=8).build())
    pod = worker_pod(job, 1, "h100-3", list(range(8)), attempt=2)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    env = env_of(pod)
    assert env["MASTER_ADDR"] == "llm-worker-0.llm.team.svc"
    assert (env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "16",
        "8",
        "1",
        "8",
    )
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"]) == ("2", "8", "1")
    assert pod["metadata"]["labels"]["gangshare.io/attempt"] == "2"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    assert pod["spec"]["hostname"] == "llm-worker-1" and pod["spec"]["subdomain"] == "llm"
    assert pod["spec"]["schedulerName"] == "gangshare-scheduler"
    assert pod["spec"]["restartPolicy"] == "Never"
    # What the kubelet will hand the pod, counted by the reader every ledger uses: its plan.
    assert gpu_devices(pod["spec"]) == {"nvidia.com/gpu": 8}


def test_a_lone_worker_is_its_own_master_and_gets_no_service():
    one = parse_trainingjob(make_job("solo").spec(workers=1, gpusPerWorker=1).build())
    assert env_of(worker_pod(one, 0, "n-0", [0], attempt=0))["MASTER_ADDR"] == "solo-worker-0"
    admitted = (
        make_job("solo")
        .spec(workers=1, gpusPerWorker=1)
        .status(
            phase="Admitted",
            attempt=0,
            placement=[{"rank": 0, "node": "n-0", "gpus": [0]}],
            observedGeneration=1,
        )
        .build()
    )
    actions = detect_actions(Observation(admitted, [], False, 1.0e9), "gangshare-scheduler")
    assert actions.create_service is None
    assert [p["metadata"]["name"] for p in actions.create_pods] == ["solo-worker-0"]


def test_opportunistic_worker_requests_share_slots_and_records_its_memory():
    job = parse_trainingjob(
        make_job("nb").spec(serviceClass="Opportunistic", gpuMemory="8Gi").build()
    )
    pod = worker_pod(job, 0, "a100-0", [3], attempt=0)
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"gangshare.io/gpu-share": "1"}
    assert pod["metadata"]["annotations"]["gangshare.io/gpu-memory-mib"] == "8192"
    assert env_of(pod)["GANGSHARE_GPU_MEMORY_MIB"] == "8192"


def test_user_template_is_kept_but_gpu_requests_follow_the_spec():
    template = {
        "metadata": {"labels": {"team": "nlp"}, "annotations": {"note": "x"}},
        "spec": {
            "nodeSelector": {"disk": "ssd"},
            "containers": [
                {
                    "name": "t",
                    "image": "i",
                    "env": [{"name": "MASTER_PORT", "value": "1"}, {"name": "A", "value": "b"}],
                    "resources": {"limits": {"nvidia.com/gpu": "99", "cpu": "4"}},
                },
                {"name": "sidecar", "image": "s"},
            ],
        },
    }
    job = parse_trainingjob(make_job("j").spec(gpusPerWorker=2, template=template).build())
    pod = worker_pod(job, 0, "n-0", [0, 1], attempt=0)
    assert (
        pod["metadata"]["labels"]["team"] == "nlp" and pod["metadata"]["annotations"]["note"] == "x"
    )
    # The template's selector is kept; the plan pins the node by name (metadata.name), which
    # holds even where the hostname label differs from the node's name.
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-0"]}]}
        ]
    }
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "4",
        "nvidia.com/gpu": "2",
    }
    assert "resources" not in pod["spec"]["containers"][1]
    assert env_of(pod)["MASTER_PORT"] == "29500" and env_of(pod)["A"] == "b"
    assert (
        template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "99"
    )  # not mutated


def test_the_planned_node_is_anded_into_every_affinity_term_of_the_template():
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    rack = {"key": "rack", "operator": "Exists"}
    template = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [zone]},
                            {"matchExpressions": [rack]},
                        ]
                    }
                },
                "podAffinity": {"x": 1},
            },
            "containers": [{"name": "t", "image": "i"}],
        }
    }
    job = parse_trainingjob(make_job("j").spec(template=template).build())
    affinity = worker_pod(job, 0, "n-3", [0], attempt=0)["spec"]["affinity"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["n-3"]}
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [zone], "matchFields": [pin]},
        {"matchExpressions": [rack], "matchFields": [pin]},
    ]
    assert affinity["podAffinity"] == {"x": 1}
    assert template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0] == {"matchExpressions": [zone]}  # not mutated


def test_an_opportunistic_workers_grace_is_clamped_not_refused():
    """A job from before the CRD's rule keeps running; its workers still give their GPU memory
    back within the bound every gpu-share pod has."""
    body = make_job("old").spec(serviceClass="Opportunistic").build()
    body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 31_536_000
    pod = worker_pod(parse_trainingjob(body), 0, "a100-0", [3], attempt=0)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    assert (
        worker_pod(parse_trainingjob(body), 0, "n", [0], 0)["spec"]["terminationGracePeriodSeconds"]
        == 5
    )
    guaranteed = make_job("g").build()
    guaranteed["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 600
    assert (
        worker_pod(parse_trainingjob(guaranteed), 0, "n", [0], 0)["spec"][
            "terminationGracePeriodSeconds"
        ]
        == 600
    )
