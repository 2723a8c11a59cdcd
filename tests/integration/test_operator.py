"""The operator against a real control plane: admission, gangs, failures, crashes."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kube import Kube, OperatorProcess, eventually
from tj import create, gpus_bound_per_node, job_pods, partial_gangs, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"


def test_every_example_applies_with_kubectl(crd: Kube, namespace: str):
    out = subprocess.run(
        crd.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "trainingjobs")),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.count("created") == len(list((ROOT / "examples" / "trainingjobs").glob("*.yaml")))
    table = subprocess.run(
        crd.kubectl("get", "tj", "-n", namespace), capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "CLASS",
        "QUEUE",
        "WORKERS",
        "GPUS/WORKER",
        "PHASE",
        "RESTARTS",
        "FORECAST",
        "AGE",
    ]
    assert any(
        line.split()[:5] == ["llm-pretrain", "Guaranteed", "research", "2", "8"] for line in table
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"workers": 0}, "spec.workers"),
        ({"gpusPerWorker": 100}, "spec.gpusPerWorker"),
        ({"gpuMemory": "8Gi"}, "spec.gpuMemory: only Opportunistic jobs set gpuMemory"),
        (
            {"gpusPerWorker": 8, "shapes": [{"workers": 3, "gpusPerWorker": 2}]},
            "spec.shapes: every shape must hold the same GPUs",
        ),
        ({"shapes": [{"workers": 1, "gpusPerWorker": 1}], "reshape": "Always"}, "spec.reshape"),
        ({"serviceClass": "Gold"}, "spec.serviceClass"),
        (
            {"topology": {"policy": "None", "relaxAfterSeconds": 5}},
            "spec.topology.relaxAfterSeconds",
        ),
        ({"queue": "Not A Queue"}, "spec.queue"),
        (
            {
                "template": {
                    "spec": {"containers": [{"name": "t", "image": "i", "args": ["--lr", 0.001]}]}
                }
            },
            "spec.template.spec.containers[0].args[1]",
        ),
    ],
)
def test_invalid_manifests_are_rejected_naming_the_field(crd: Kube, namespace: str, change, field):
    body = trainingjob("bad", 1, 1)
    body["spec"].update(change)
    result = subprocess.run(
        crd.kubectl("apply", "-n", namespace, "-f", "-"),
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_a_gang_runs_to_success_with_conditions_and_events(
    operator: OperatorProcess, namespace: str
):
    kube = operator.kube
    create(
        kube,
        namespace,
        trainingjob(
            "pair", 2, 4, gpuModel=H100, topology={"policy": "Required", "scope": "NVLink"}
        ),
    )
    done = eventually(lambda: phase_is(kube, namespace, "pair", "Succeeded", "Failed"), timeout=60)
    assert done["phase"] == "Succeeded", done
    assert [w["rank"] for w in done["placement"]] == [0, 1]
    assert all(
        len(w["gpus"]) == 4 and w["gpus"] in ([0, 1, 2, 3], [4, 5, 6, 7]) for w in done["placement"]
    )
    conditions = {c["type"]: c for c in done["conditions"]}
    assert {
        k: conditions[k]["status"] for k in ("Admitted", "GangScheduled", "Running", "Completed")
    } == {"Admitted": "True", "GangScheduled": "True", "Running": "False", "Completed": "True"}
    assert done["queueWaitSeconds"] >= 0 and done["restarts"] == 0
    describe = subprocess.run(
        kube.kubectl("describe", "tj", "pair", "-n", namespace),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    events = describe[describe.index("Events:") :]
    for reason in ("GangScheduled", "Completed"):
        assert re.search(rf"Normal\s+{reason}\s", events), events
    # Being queued, admitted at its first turn and starting to run are said by the conditions
    # (describe prints each with its message), with no event (#39: events where a person
    # needs the why; an admission after a told wait, or on borrowed quota, posts one).
    for reason in ("Queued", "Admitted", "Running"):
        assert not re.search(rf"Normal\s+{reason}\s", events), events
    for kind in ("Admitted", "Running"):
        assert re.search(rf"Type:\s+{kind}\b", describe), describe
    assert "admitted: 2 worker(s) on" in describe, describe
    pods = job_pods(kube, namespace, "pair")
    assert sorted(p.metadata.name for p in pods) == ["pair-worker-0", "pair-worker-1"]
    for pod in pods:
        planned = next(
            w
            for w in done["placement"]
            if w["rank"] == int(pod.metadata.labels["gangshare.io/rank"])
        )
        assert pod.spec.node_name == planned["node"]
        assert pod.metadata.annotations["gangshare.io/planned-gpus"] == ",".join(
            map(str, planned["gpus"])
        )


def test_three_competing_gangs_never_run_partially_and_all_finish(
    operator: OperatorProcess, namespace: str
):
    kube = operator.kube
    # Each gang needs 3 of the 4 H100 nodes, so only one fits at a time.
    jobs = {f"gang-{i}": 3 for i in range(3)}
    for name in jobs:
        create(kube, namespace, trainingjob(name, 3, 8, run_for="3s", gpuModel=H100))
    deadline = time.monotonic() + 120
    samples = 0
    while time.monotonic() < deadline:
        assert partial_gangs(kube, namespace, jobs) == []
        assert all(used <= 8 for used in gpus_bound_per_node(kube, namespace).values())
        samples += 1
        if all(phase_is(kube, namespace, name, "Succeeded") for name in jobs):
            break
        time.sleep(0.1)
    assert all(status(kube, namespace, name).get("phase") == "Succeeded" for name in jobs), (
        operator.logs()[-3000:]
    )
    assert samples > 20
    waits = sorted(status(kube, namespace, name)["queueWaitSeconds"] for name in jobs)
    assert waits[-1] > 3  # the last gang really waited for the others


def test_a_burst_of_jobs_is_admitted_from_the_stores_without_promising_a_gpu_twice(
    operator: OperatorProcess, namespace: str
):
    """Passes read watch-fed stores and write admissions side by side: the invariant end to
    end (the assumed-write rule itself is unit-tested in test_scheduler_pass.py)."""
    kube = operator.kube
    names = [f"burst-{i}" for i in range(40)]  # 1 GPU each on the 4 H100 nodes' 32 GPUs
    for name in names:
        create(kube, namespace, trainingjob(name, 1, 1, run_for="120s", gpuModel=H100))
    holding = ("Admitted", "Running")
    deadline, jobs = time.monotonic() + 90, []
    while time.monotonic() < deadline:
        listed = kube.custom.list_namespaced_custom_object(
            "gangshare.io", "v1alpha1", namespace, "trainingjobs"
        )
        jobs = [j.get("status") or {} for j in listed["items"]]
        promised = [
            (w["node"], gpu)
            for s in jobs
            if s.get("phase") in holding
            for w in s.get("placement") or []
            for gpu in w["gpus"]
        ]
        assert len(promised) == len(set(promised)), sorted(promised)
        waiting = [s for s in jobs if s.get("phase") == "Queued"]
        # A new job has no phase until a pass writes its first status (with its decision).
        told = len(waiting) == 8 and all("waiting for" not in s["message"] for s in waiting)
        if len(promised) == 32 and told:
            break
        time.sleep(0.2)
    assert sum(s.get("phase") in holding for s in jobs) == 32, operator.logs()[-3000:]
    waiting = [s for s in jobs if s.get("phase") == "Queued"]
    assert len(waiting) == 8
    # Each waiting job was told why in its first status (no "waiting for ..." of a reconciler's
    # enqueue written before it).
    reasons = {c["reason"] for s in waiting for c in s["conditions"] if c["type"] == "Admitted"}
    assert reasons <= {"Unschedulable", "WaitingInQueue"} and reasons, reasons


def test_a_lost_worker_restarts_the_whole_gang(operator: OperatorProcess, namespace: str):
    kube = operator.kube
    create(kube, namespace, trainingjob("resilient", 2, 1, run_for="4s"))
    eventually(lambda: phase_is(kube, namespace, "resilient", "Running"), timeout=30)
    first = {p.metadata.name: p.metadata.uid for p in job_pods(kube, namespace, "resilient")}
    kube.core.delete_namespaced_pod("resilient-worker-1", namespace)
    done = eventually(
        lambda: phase_is(kube, namespace, "resilient", "Succeeded", "Failed"), timeout=60
    )
    assert done["phase"] == "Succeeded"
    assert done["restarts"] == 1 and done["attempt"] == 1
    assert done["lastFailure"]["class"] == "Infrastructure"
    second = {p.metadata.name: p.metadata.uid for p in job_pods(kube, namespace, "resilient")}
    assert sorted(second) == sorted(first) and not set(second.values()) & set(first.values())
    assert {
        p.metadata.labels["gangshare.io/attempt"] for p in job_pods(kube, namespace, "resilient")
    } == {"1"}


def test_a_user_error_fails_fast_with_the_reason(operator: OperatorProcess, namespace: str):
    kube = operator.kube
    create(kube, namespace, trainingjob("typo", 2, 1, exit_code="1", run_for="1s"))
    done = eventually(lambda: phase_is(kube, namespace, "typo", "Failed"), timeout=60)
    assert done["restarts"] == 0
    assert (
        done["lastFailure"]["class"] == "User" and done["lastFailure"]["reason"] == "ErrorExitEarly"
    )
    assert "exited with code 1" in done["message"]
    failed = next(c for c in done["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "ErrorExitEarly"
    eventually(
        lambda: all(
            p.status.phase in ("Succeeded", "Failed") or p.metadata.deletion_timestamp
            for p in job_pods(kube, namespace, "typo")
        ),
        what="failed gang released",
    )


@pytest.mark.parametrize(
    ("container", "where"),
    [
        # Refused by the API server (422).
        ({"name": "Not_A_DNS_Label"}, "spec.containers[0].name"),
        # Refused by the client's own type check before sending.
        ({"env": [{"name": "EPOCHS", "value": 3}]}, "spec.containers.0.env.0.value"),
    ],
)
def test_a_template_that_cannot_become_a_pod_ends_in_a_failed_condition(
    operator: OperatorProcess, namespace: str, container, where
):
    kube = operator.kube
    body = trainingjob("badtemplate", 1, 1)
    body["spec"]["template"]["spec"]["containers"][0].update(container)
    create(kube, namespace, body)
    done = eventually(lambda: phase_is(kube, namespace, "badtemplate", "Failed"), timeout=30)
    assert done["lastFailure"]["reason"] == "InvalidPodTemplate"
    assert done["message"].startswith("spec.template: the worker pod was refused: ")
    assert where in done["message"], done["message"]
    assert done.get("placement") is None  # its GPUs are free again
    assert job_pods(kube, namespace, "badtemplate") == []


def test_deleting_a_job_removes_its_pods_and_service(operator: OperatorProcess, namespace: str):
    kube = operator.kube
    create(kube, namespace, trainingjob("forever", 2, 1, exit_code=None))
    eventually(lambda: phase_is(kube, namespace, "forever", "Running"), timeout=30)
    assert kube.core.read_namespaced_service("forever", namespace).spec.cluster_ip == "None"
    kube.custom.delete_namespaced_custom_object(
        "gangshare.io", "v1alpha1", namespace, "trainingjobs", "forever"
    )
    eventually(
        lambda: job_pods(kube, namespace, "forever") == [],
        timeout=60,
        what="pods garbage-collected",
    )
    eventually(
        lambda: not kube.core.list_namespaced_service(namespace).items,
        timeout=60,
        what="service gone",
    )


def test_operator_killed_mid_admission_loses_nothing_and_duplicates_nothing(
    crd: Kube, namespace: str, tmp_path: Path
):
    # Slow pod creation down so SIGKILL lands between the workers of one gang.
    slow = OperatorProcess(crd, tmp_path, faults=("--pod-create-delay", "0.7")).start()
    jobs = {f"crash-{i}": 2 for i in range(3)}
    try:
        for name in jobs:
            create(crd, namespace, trainingjob(name, 2, 4, run_for="2s", gpuModel=H100))
        for _ in range(2):
            eventually(
                lambda: any(len(job_pods(crd, namespace, n)) == 1 for n in jobs),
                timeout=60,
                interval=0.05,
                what="a gang half created",
            )
            slow.kill()
            assert partial_gangs(crd, namespace, jobs) == []
            slow.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for name, workers in jobs.items():
                names = [p.metadata.name for p in job_pods(crd, namespace, name)]
                assert len(names) <= workers and len(set(names)) == len(names), names
            assert partial_gangs(crd, namespace, jobs) == []
            if all(phase_is(crd, namespace, n, "Succeeded") for n in jobs):
                break
            time.sleep(0.1)
        phases = {n: status(crd, namespace, n).get("phase") for n in jobs}
        assert phases == dict.fromkeys(jobs, "Succeeded"), slow.logs()[-4000:]
        assert slow.starts == 3
    finally:
        slow.stop()
