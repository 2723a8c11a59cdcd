"""The operator's Prometheus series: pure computations, the registry's text, the HTTP endpoint."""

from __future__ import annotations

import urllib.request

import pytest
from fake_apiserver import FakeApiServer
from jobs import JobBuilder, make_job, nodes, pod
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gangshare.core.clock import ManualClock
from gangshare.core.queueing import QueuePolicy
from gangshare.core.queues import QueueSpec
from gangshare.kube.queue import default_queue_object
from gangshare.kube.queued_kinds import workload_kind_name
from gangshare.operator.actions import Actions, Displacement, Event, Observation
from gangshare.operator.informers import Informers
from gangshare.operator.lifecycle import detect_actions
from gangshare.operator.metrics import (
    PHASES,
    OperatorMetrics,
    outcome_of,
    parse_address,
    queue_samples,
    serve,
    trainingjob_counts,
)
from gangshare.operator.reconcile import OperatorOptions, Reconciler
from gangshare.operator.scheduler import SchedulerLoop

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
ADMITTED_AT = "2027-01-15T08:00:00Z"
# spec.jobRef's (apiVersion, kind) of the records the operator makes for each queued kind.
JOB_REFS = {
    "Job": ("batch/v1", "Job"),
    "JobSet": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "PyTorchJob": ("kubeflow.org/v1", "PyTorchJob"),
    "TrainJob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}


def record(name: str, api_version: str, kind: str) -> JobBuilder:
    """The TrainingJob the operator makes to queue `kind` `name` (spec.jobRef names it)."""
    ref = {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{kind}-{name}"}
    return make_job(f"{kind.lower()}-{name}").spec(jobRef=ref)


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's exposition text, keyed by name and sorted labels."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


# ----- gangshare_trainingjobs -----------------------------------------------------------------


def test_trainingjobs_are_counted_by_phase_admitted_class_and_queue_with_zeros_filled():
    jobs = [
        make_job("a").spec(queue="research").status(phase="Running").build(),
        make_job("b").spec(queue="research").status(phase="Running").build(),
        make_job("c").spec(queue="research").status(phase="Queued").build(),
        # Admitted beyond its quota: counted as the class admission decided, not the spec's.
        make_job("d")
        .spec(queue="research")
        .status(phase="Admitted", serviceClass="Opportunistic", borrowed=True)
        .build(),
        # Not seen by the operator yet, no queue named: New in `default`.
        {"metadata": {"name": "e", "namespace": "t"}, "spec": {"workers": 1}},
    ]
    counts = trainingjob_counts(jobs)
    assert counts[("Running", "Guaranteed", "research", "TrainingJob")] == 2
    assert counts[("Queued", "Guaranteed", "research", "TrainingJob")] == 1
    assert counts[("Admitted", "Opportunistic", "research", "TrainingJob")] == 1
    assert counts[("Admitted", "Guaranteed", "research", "TrainingJob")] == 0
    assert counts[("New", "Guaranteed", "default", "TrainingJob")] == 1
    # Every phase for each (class, queue, kind) seen, so an emptied phase reads 0.
    assert {k for k in counts if k[1:] == ("Guaranteed", "research", "TrainingJob")} == {
        (p, "Guaranteed", "research", "TrainingJob") for p in PHASES
    }
    assert sum(counts.values()) == len(jobs)
    assert trainingjob_counts([]) == {}


def test_the_trainingjobs_gauge_is_replaced_whole_each_pass():
    metrics = OperatorMetrics()
    metrics.set_trainingjobs([make_job("a").spec(queue="q1").status(phase="Running").build()])
    assert (
        value(
            metrics,
            "gangshare_trainingjobs",
            phase="Running",
            service_class="Guaranteed",
            queue="q1",
            kind="TrainingJob",
        )
        == 1
    )
    metrics.set_trainingjobs([make_job("b").spec(queue="q2").status(phase="Queued").build()])
    current = samples(metrics)
    assert not [k for k in current if k[0] == "gangshare_trainingjobs" and ("queue", "q1") in k[1]]
    assert (
        value(
            metrics,
            "gangshare_trainingjobs",
            phase="Queued",
            service_class="Guaranteed",
            queue="q2",
            kind="TrainingJob",
        )
        == 1
    )
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE gangshare_trainingjobs gauge" in text
    # The help text documents the label values.
    for documented in ("Restarting", "Opportunistic", "spec.queue", "PyTorchJob", "spec.jobRef"):
        assert documented in text


def test_a_record_is_counted_under_the_kind_its_job_ref_names():
    assert workload_kind_name(make_job("own").build()) == "TrainingJob"
    assert workload_kind_name({"metadata": {"name": "bare"}}) == "TrainingJob"
    for kind, (api_version, name) in JOB_REFS.items():
        assert workload_kind_name(record("x", api_version, name).build()) == kind
    # A kind gangshare does not queue, or a known kind at another version: one bounded value.
    assert workload_kind_name(record("x", "kubeflow.org/v1", "MPIJob").build()) == "Other"
    assert workload_kind_name(record("x", "kubeflow.org/v2", "PyTorchJob").build()) == "Other"
    assert workload_kind_name(make_job("odd").spec(jobRef={}).build()) == "Other"


def test_trainingjobs_of_each_kind_are_counted_under_their_kind():
    jobs = [
        make_job("own").spec(queue="research").status(phase="Running").build(),
        record("sweep", *JOB_REFS["JobSet"]).spec(queue="research").status(phase="Running").build(),
        record("sweep2", *JOB_REFS["JobSet"]).spec(queue="research").status(phase="Queued").build(),
        record("ddp", *JOB_REFS["PyTorchJob"])
        .spec(queue="research")
        .status(phase="Running")
        .build(),
        record("llm", *JOB_REFS["TrainJob"]).spec(queue="research").build(),
        record("batch", *JOB_REFS["Job"]).spec(queue="research").status(phase="Succeeded").build(),
        record("mpi", "kubeflow.org/v1", "MPIJob").spec(queue="research").build(),
    ]
    counts = trainingjob_counts(jobs)
    running = {k[3]: n for k, n in counts.items() if k[0] == "Running" and n}
    assert running == {"TrainingJob": 1, "JobSet": 1, "PyTorchJob": 1}
    assert counts[("Queued", "Guaranteed", "research", "JobSet")] == 1
    assert counts[("New", "Guaranteed", "research", "TrainJob")] == 1
    assert counts[("Succeeded", "Guaranteed", "research", "Job")] == 1
    assert counts[("New", "Guaranteed", "research", "Other")] == 1
    # Every phase, 0 included, for each kind seen (a kind's emptied phase reads 0 too).
    assert counts[("Running", "Guaranteed", "research", "TrainJob")] == 0
    assert {k[3] for k in counts} == {"TrainingJob", *JOB_REFS, "Other"}
    assert sum(counts.values()) == len(jobs)

    metrics = OperatorMetrics()
    metrics.set_trainingjobs(jobs)
    running_series = {
        dict(labels)["kind"]: v
        for (name, labels), v in samples(metrics).items()
        if name == "gangshare_trainingjobs" and ("phase", "Running") in labels and v
    }
    assert running_series == {"TrainingJob": 1, "JobSet": 1, "PyTorchJob": 1}
    # Summed over kind (as the dashboards do), the counts are what they were without it.
    by_phase: dict[str, float] = {}
    for (name, labels), v in samples(metrics).items():
        if name == "gangshare_trainingjobs":
            by_phase[dict(labels)["phase"]] = by_phase.get(dict(labels)["phase"], 0) + v
    assert by_phase == {"New": 2, "Queued": 1, "Admitted": 0, "Running": 3} | {
        "Restarting": 0,
        "Succeeded": 1,
        "Failed": 0,
    }


# ----- queue gauges ---------------------------------------------------------------------------


def test_queue_gauges_come_from_the_pass_statuses_and_the_queue_spec():
    statuses = {
        "team-a": {"pendingJobs": 2, "admittedJobs": 3, "guaranteedGPUs": 8, "borrowedGPUs": 4},
        "default": {"pendingJobs": 0, "admittedJobs": 1, "guaranteedGPUs": 0, "borrowedGPUs": 0},
    }
    specs = {
        "team-a": QueueSpec("team-a", nominal_gpus=8, cohort="c"),
        "default": QueueSpec("default"),
    }
    got = queue_samples(statuses, specs)
    assert got["gangshare_queue_pending_jobs"] == {"team-a": 2, "default": 0}
    assert got["gangshare_queue_admitted_jobs"] == {"team-a": 3, "default": 1}
    assert got["gangshare_queue_guaranteed_gpus"] == {"team-a": 8, "default": 0}
    assert got["gangshare_queue_borrowed_gpus"] == {"team-a": 4, "default": 0}
    # A queue without quota has no nominal series (absent is not 0: it is unlimited).
    assert got["gangshare_queue_nominal_gpus"] == {"team-a": 8}

    metrics = OperatorMetrics()
    metrics.set_queues(statuses, specs)
    assert value(metrics, "gangshare_queue_borrowed_gpus", queue="team-a") == 4
    assert value(metrics, "gangshare_queue_nominal_gpus", queue="team-a") == 8
    assert value(metrics, "gangshare_queue_nominal_gpus", queue="default") is None
    # Without the Queue CRD the pass reports no queues, and the old series go.
    metrics.set_queues({}, {})
    assert not [k for k in samples(metrics) if k[0].startswith("gangshare_queue_") and k[1]]


# ----- what a reconcile commits ---------------------------------------------------------------


def test_a_gang_that_starts_observes_admission_to_running():
    job = (
        make_job("j")
        .spec(workers=2)
        .status(
            phase="Admitted",
            attempt=0,
            admittedAt=ADMITTED_AT,
            placement=[{"rank": r, "node": "n-0", "gpus": [r]} for r in range(2)],
        )
        .condition("GangScheduled", True)
        .build()
    )
    pods = [pod("j", r, phase="Running", node="n-0") for r in range(2)]
    actions = detect_actions(Observation(job, pods, True, NOW + 12), "gangshare-scheduler")
    assert actions.status["phase"] == "Running"
    outcome = outcome_of(job, actions)
    assert outcome.start_seconds == 12  # status times are whole seconds
    assert outcome.requeues == () and outcome.failure_class is None

    metrics = OperatorMetrics()
    metrics.applied(job, actions)
    assert value(metrics, "gangshare_gang_start_seconds_count") == 1
    assert value(metrics, "gangshare_gang_start_seconds_bucket", le="20.0") == 1
    assert value(metrics, "gangshare_gang_start_seconds_bucket", le="10.0") == 0


def test_a_reclaimed_borrower_counts_a_preemption_and_a_requeue():
    job = (
        make_job("j")
        .spec(queue="b")
        .status(
            phase="Running",
            attempt=2,
            serviceClass="Opportunistic",
            borrowed=True,
            admittedAt=ADMITTED_AT,
            placement=[{"rank": 0, "node": "n-0", "gpus": [0]}],
        )
        .condition("GangScheduled", True)
        .build()
    )
    pods = [pod("j", 0, phase="Running", node="n-0", attempt=2)]
    seen = Observation(job, pods, True, NOW, Displacement(2, "reclaimed", preempted=True))
    actions = detect_actions(seen, "gangshare-scheduler")
    assert outcome_of(job, actions).preempted_queue == "b"
    metrics = OperatorMetrics()
    metrics.applied(job, actions)
    reclaimed = {"queue": "b", "reason": "Reclaimed", "kind": "TrainingJob"}
    assert value(metrics, "gangshare_preemptions_total", **reclaimed) == 1
    assert value(metrics, "gangshare_requeues_total", reason="Preempted", kind="TrainingJob") == 1


@pytest.mark.parametrize(
    ("exit_code", "started", "restarts", "failure_class", "event"),
    [
        # Exit 1 right after start: the user's error; no user retries by default -> Failed.
        ("1", NOW - 5, 0, "User", "Failed"),
        # Killed by a signal: infrastructure, the gang restarts.
        ("137", NOW - 5, 0, "Infrastructure", "GangRestarting"),
    ],
)
def test_a_failed_gang_counts_its_failure_class(exit_code, started, restarts, failure_class, event):
    job = (
        make_job("j")
        .status(
            phase="Running",
            attempt=0,
            restarts=restarts,
            admittedAt=ADMITTED_AT,
            placement=[{"rank": 0, "node": "n-0", "gpus": [0]}],
        )
        .condition("GangScheduled", True)
        .build()
    )
    terminated = {"exitCode": int(exit_code), "reason": "Error", "startedAt": ADMITTED_AT}
    failed = pod(
        "j",
        0,
        phase="Failed",
        node="n-0",
        containerStatuses=[{"name": "trainer", "state": {"terminated": terminated}}],
    )
    actions = detect_actions(Observation(job, [failed], True, NOW + 5), "gangshare-scheduler")
    assert [e.reason for e in actions.events] == [event]
    metrics = OperatorMetrics()
    metrics.applied(job, actions)
    failures = {"failure_class": failure_class, "kind": "TrainingJob"}
    assert value(metrics, "gangshare_gang_failures_total", **failures) == 1
    assert not [k for k in samples(metrics) if k[0] == "gangshare_requeues_total"]


def test_requeue_reasons_are_counted_from_the_applied_events_only():
    actions = Actions(
        status={"phase": "Queued"},
        events=[
            Event("Warning", "GangStartTimeout", "not bound"),
            Event("Normal", "Requeued", "not a release: not counted"),
        ],
    )
    job = make_job("j").build()
    assert outcome_of(job, actions).requeues == ("GangStartTimeout",)
    metrics = OperatorMetrics()
    for reason in ("GangDisplaced", "OpportunisticEvicted"):
        metrics.applied(job, Actions(status={"phase": "Queued"}, events=[Event("W", reason, "")]))
    metrics.applied(job, actions)
    requeues = {
        dict(labels)["reason"]: v
        for (name, labels), v in samples(metrics).items()
        if name == "gangshare_requeues_total"
    }
    assert requeues == {"GangStartTimeout": 1, "GangDisplaced": 1, "OpportunisticEvicted": 1}
    assert value(metrics, "gangshare_requeues_total", reason="GangDisplaced", kind="TrainingJob")


def test_what_a_record_commits_is_counted_under_its_kind():
    """The same steps for the records of a PyTorchJob and a JobSet: their kind, not TrainingJob
    (BatchActions carry the same status and events as Actions)."""
    metrics = OperatorMetrics()
    ddp = record("ddp", *JOB_REFS["PyTorchJob"]).spec(queue="b").build()
    preempted = Actions(status={"phase": "Queued"}, events=[Event("W", "Preempted", "")])
    metrics.applied(ddp, preempted)
    reclaimed = {"queue": "b", "reason": "Reclaimed", "kind": "PyTorchJob"}
    assert value(metrics, "gangshare_preemptions_total", **reclaimed) == 1
    assert value(metrics, "gangshare_requeues_total", reason="Preempted", kind="PyTorchJob") == 1
    sweep = record("sweep", *JOB_REFS["JobSet"]).build()
    failed = Actions(
        status={"phase": "Failed", "lastFailure": {"class": "User"}},
        events=[Event("W", "Failed", "exit 1")],
    )
    metrics.applied(sweep, failed)
    failures = {"failure_class": "User", "kind": "JobSet"}
    assert value(metrics, "gangshare_gang_failures_total", **failures) == 1
    metrics.applied(make_job("own").build(), failed)
    failures = {"failure_class": "User", "kind": "TrainingJob"}
    assert value(metrics, "gangshare_gang_failures_total", **failures) == 1
    assert (
        value(metrics, "gangshare_requeues_total", reason="Preempted", kind="TrainingJob") is None
    )


# ----- what the scheduling loop records --------------------------------------------------------


def test_admissions_and_pass_timings_reach_the_exposition_text():
    metrics = OperatorMetrics()
    metrics.admitted("research", "Guaranteed", False, 42.0, "TrainingJob")
    metrics.admitted("research", "Opportunistic", True, 0.5, "JobSet")
    metrics.cycle.observe(0.2)
    metrics.decision.observe(0.003)
    assert (
        value(
            metrics,
            "gangshare_admissions_total",
            queue="research",
            service_class="Opportunistic",
            borrowed="true",
            kind="JobSet",
        )
        == 1
    )
    assert (
        value(
            metrics,
            "gangshare_admissions_total",
            queue="research",
            service_class="Guaranteed",
            borrowed="false",
            kind="TrainingJob",
        )
        == 1
    )
    assert value(metrics, "gangshare_queue_wait_seconds_count", queue="research") == 2
    assert value(metrics, "gangshare_queue_wait_seconds_sum", queue="research") == 42.5
    # Buckets from a second to a day.
    assert value(metrics, "gangshare_queue_wait_seconds_bucket", queue="research", le="1.0") == 1
    assert (
        value(metrics, "gangshare_queue_wait_seconds_bucket", queue="research", le="86400.0") == 2
    )
    assert value(metrics, "gangshare_scheduling_cycle_duration_seconds_count") == 1
    assert value(metrics, "gangshare_admission_decision_seconds_count") == 1


@pytest.mark.parametrize("kind", ["TrainingJob", "JobSet", "PyTorchJob"])
def test_a_pass_counts_an_admission_under_the_kind_of_the_record(kind: str):
    """The real scheduling loop on an API server answered from memory: a plain TrainingJob,
    and the records of a JobSet and a PyTorchJob, each admitted and counted under its kind."""
    job = make_job("own") if kind == "TrainingJob" else record("x", *JOB_REFS[kind])
    queued = job.status(phase="Queued", queuedAt="2027-01-15T07:59:00Z").build()
    server = FakeApiServer(queued, [], queues=[default_queue_object()])
    api = server.kube_api()
    informers = Informers()
    informers.nodes.replace(nodes({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 2}]}))
    informers.pods.replace([])
    informers.jobs.replace([queued])
    metrics = OperatorMetrics()
    reconciler = Reconciler(api, ManualClock(NOW), OperatorOptions(), metrics)
    loop = SchedulerLoop(
        api, reconciler, QueuePolicy(), ManualClock(NOW), metrics=metrics, informers=informers
    )
    assert loop.run_once().admitted == [f"team/{queued['metadata']['name']}"]
    admission = {"queue": "default", "service_class": "Guaranteed", "borrowed": "false"}
    assert value(metrics, "gangshare_admissions_total", **admission, kind=kind) == 1
    assert value(metrics, "gangshare_queue_wait_seconds_count", queue="default") == 1
    jobs = {"phase": "Queued", "service_class": "Guaranteed", "queue": "default"}
    assert value(metrics, "gangshare_trainingjobs", **jobs, kind=kind) == 1
    admitted = [dict(k[1]) for k in samples(metrics) if k[0] == "gangshare_admissions_total"]
    assert [labels["kind"] for labels in admitted] == [kind]


def test_every_series_is_named_with_the_prefix_and_documented():
    metrics = OperatorMetrics()
    metrics.set_trainingjobs([make_job("a").status(phase="Running").build()])
    metrics.set_queues({"q": {"pendingJobs": 1}}, {"q": QueueSpec("q", nominal_gpus=1)})
    families = list(text_string_to_metric_families(generate_latest(metrics.registry).decode()))
    names = {f.name for f in families}
    assert {
        "gangshare_trainingjobs",
        "gangshare_queue_pending_jobs",
        "gangshare_queue_admitted_jobs",
        "gangshare_queue_nominal_gpus",
        "gangshare_queue_guaranteed_gpus",
        "gangshare_queue_borrowed_gpus",
        "gangshare_queue_wait_seconds",
        "gangshare_scheduling_cycle_duration_seconds",
        "gangshare_admission_decision_seconds",
        "gangshare_admissions",
        "gangshare_preemptions",
        "gangshare_requeues",
        "gangshare_gang_failures",
        "gangshare_gang_start_seconds",
        "gangshare_operator_leader",
    } <= names
    assert all(f.name.startswith("gangshare_") and f.documentation for f in families)


# ----- the endpoint ---------------------------------------------------------------------------


def test_parse_address():
    assert parse_address("0.0.0.0:8081") == ("0.0.0.0", 8081)
    assert parse_address("[::]:9090") == ("::", 9090)
    assert parse_address(":8081") == ("0.0.0.0", 8081)
    for bad in ("8081", "host:", "host:http", "h:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_metrics_are_served_over_http_and_an_empty_address_serves_nothing():
    assert serve(OperatorMetrics(), "") is None
    metrics = OperatorMetrics()
    metrics.leader.set(1)
    server = serve(metrics, "127.0.0.1:0")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert "gangshare_operator_leader 1.0" in body
    finally:
        server.shutdown()
        server.server_close()
