"""A Guaranteed worker's GPU out-of-memory error beside an opportunistic tenant is not the
user's: judged by the real Reconciler, which looks the node's pods up only when a worker
failed, on an API server answered from memory (fake_apiserver.py)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from jobs import make_job, pod

from gangshare.core.clock import ManualClock
from gangshare.kube.trainingjob import parse_trainingjob
from gangshare.operator.manifests import worker_pod
from gangshare.operator.reconcile import OperatorOptions, Reconciler

NOW = 1_800_000_000.0
PLACEMENT = [{"rank": 0, "node": "n-0", "gpus": [0]}, {"rank": 1, "node": "n-1", "gpus": [0]}]
TORCH_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
STARTED, FAILED = "2027-01-15T07:59:00Z", "2027-01-15T07:59:30Z"  # an early failure (30 s)


def running(service_class: str = "Guaranteed") -> dict[str, Any]:
    return (
        make_job("j")
        .spec(workers=2, serviceClass=service_class)
        .status(
            phase="Running",
            attempt=0,
            restarts=0,
            placement=PLACEMENT,
            observedGeneration=1,
            serviceClass=service_class,
        )
        .condition("GangScheduled", True)
        .build()
    )


def oom_worker(last_words: str = TORCH_OOM) -> dict[str, Any]:
    ended = {
        "exitCode": 1,
        "reason": "Error",
        "message": last_words,
        "startedAt": STARTED,
        "finishedAt": FAILED,
    }
    worker = pod(
        "j",
        0,
        phase="Failed",
        node="n-0",
        containerStatuses=[{"name": "trainer", "state": {"terminated": ended}}],
    )
    worker["metadata"]["annotations"]["gangshare.io/planned-gpus"] = "0"
    return worker


def tenant(
    gpus: str | None = "0", node: str = "n-0", started: str = "2027-01-15T07:00:00Z"
) -> dict[str, Any]:
    """A bare pod holding one GPU share slot, bound to `node`."""
    annotations = {} if gpus is None else {"gangshare.io/assigned-gpus": gpus}
    return {
        "metadata": {"name": "opp-0", "namespace": "lab", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"gangshare.io/gpu-share": "1"}}}],
        },
        "status": {"phase": "Running", "startTime": started},
    }


def reconcile(job: dict[str, Any], others: list[dict[str, Any]]) -> FakeApiServer:
    server = FakeApiServer(
        job, [oom_worker(), pod("j", 1, phase="Running", node="n-1")], [], others
    )
    reconciler = Reconciler(server.kube_api(), ManualClock(NOW), OperatorOptions())
    reconciler.reconcile("team", "j")
    return server


def last_failure(server: FakeApiServer) -> tuple[str, str, str]:
    status = server.job["status"]
    return status["phase"], status["lastFailure"]["class"], status["lastFailure"]["reason"]


def test_a_guaranteed_workers_gpu_oom_beside_a_tenant_on_its_gpu_restarts_the_gang():
    server = reconcile(running(), [tenant("0")])
    assert last_failure(server) == ("Restarting", "Infrastructure", "SharedGpuOutOfMemory")
    assert "lab/opp-0" in server.job["status"]["lastFailure"]["message"]
    assert server.job["status"]["userFailures"] == 0  # not charged to the user
    # The node's pods were looked up by node, once.
    lookups = [t for name, t in server.calls if name == "list_pod_for_all_namespaces"]
    assert len(lookups) == 1 and "spec.nodeName=n-0" in lookups[0]


@pytest.mark.parametrize(
    "beside",
    [
        pytest.param([tenant(None)], id="tenant-gpus-unknown"),
        pytest.param([tenant("0,1")], id="tenant-on-two-gpus"),
    ],
)
def test_unknown_or_overlapping_gpus_count_as_shared(beside):
    assert last_failure(reconcile(running(), beside))[1:] == (
        "Infrastructure",
        "SharedGpuOutOfMemory",
    )


@pytest.mark.parametrize(
    "beside",
    [
        pytest.param([], id="nobody-beside"),
        pytest.param([tenant("1")], id="tenant-on-another-gpu"),
        pytest.param([tenant("0", node="n-1")], id="tenant-on-another-node"),
        pytest.param([tenant("0", started="2027-01-15T08:00:00Z")], id="tenant-came-after"),
    ],
)
def test_a_gpu_oom_nobody_shared_is_the_users(beside):
    assert last_failure(reconcile(running(), beside)) == ("Failed", "User", "ErrorExitEarly")


def test_an_opportunistic_job_is_not_excused_and_nothing_is_looked_up():
    server = reconcile(running("Opportunistic"), [tenant("0")])
    assert last_failure(server) == ("Failed", "User", "ErrorExitEarly")
    assert not [name for name, _ in server.calls if name == "list_pod_for_all_namespaces"]


def test_a_workers_log_tail_becomes_its_termination_message_unless_the_template_says():
    spec = parse_trainingjob(running())
    made = worker_pod(spec, 0, "n-0", [0], 0)
    assert made["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    own = running()
    own["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] = "File"
    kept = worker_pod(parse_trainingjob(own), 0, "n-0", [0], 0)
    assert kept["spec"]["containers"][0]["terminationMessagePolicy"] == "File"
