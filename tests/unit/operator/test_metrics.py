"""The operator's Prometheus series: pure computations, the registry's text, the HTTP endpoint."""

from __future__ import annotations

import urllib.request

import pytest
from jobs import make_job, pod
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gangshare.core.queues import QueueSpec
from gangshare.operator.actions import Actions, Displacement, Event, Observation
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

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
ADMITTED_AT = "2027-01-15T08:00:00Z"


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
    assert counts[("Running", "Guaranteed", "research")] == 2
    assert counts[("Queued", "Guaranteed", "research")] == 1
    assert counts[("Admitted", "Opportunistic", "research")] == 1
    assert counts[("Admitted", "Guaranteed", "research")] == 0
    assert counts[("New", "Guaranteed", "default")] == 1
    # Every phase for each (class, queue) seen, so an emptied phase reads 0.
    assert {k for k in counts if k[1:] == ("Guaranteed", "research")} == {
        (p, "Guaranteed", "research") for p in PHASES
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
        )
        == 1
    )
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE gangshare_trainingjobs gauge" in text
    # The help text documents the label values.
    for documented in ("Restarting", "Opportunistic", "spec.queue"):
        assert documented in text


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
    assert value(metrics, "gangshare_preemptions_total", queue="b", reason="Reclaimed") == 1
    assert value(metrics, "gangshare_requeues_total", reason="Preempted") == 1


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
    assert value(metrics, "gangshare_gang_failures_total", failure_class=failure_class) == 1
    assert value(metrics, "gangshare_requeues_total", reason="GangRestarting") is None


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
    assert value(metrics, "gangshare_requeues_total", reason="GangStartTimeout") == 1
    assert value(metrics, "gangshare_requeues_total", reason="GangDisplaced") == 1
    assert value(metrics, "gangshare_requeues_total", reason="OpportunisticEvicted") == 1
    assert value(metrics, "gangshare_requeues_total", reason="Requeued") is None


# ----- what the scheduling loop records --------------------------------------------------------


def test_admissions_and_pass_timings_reach_the_exposition_text():
    metrics = OperatorMetrics()
    metrics.admitted("research", "Guaranteed", False, 42.0)
    metrics.admitted("research", "Opportunistic", True, 0.5)
    metrics.cycle.observe(0.2)
    metrics.decision.observe(0.003)
    assert (
        value(
            metrics,
            "gangshare_admissions_total",
            queue="research",
            service_class="Opportunistic",
            borrowed="true",
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
