"""Start-time forecasts in the operator: when a pass makes one, when it is written (riding on
a pending-reason write, else only once it moved), how a queued Job shows it, and
`gangshare queue`."""

from __future__ import annotations

from jobs import make_job
from test_scheduler_pass import RecordingApi, queued, waiting

from gangshare.core.cycle import PendingKind
from gangshare.core.forecast import Forecast
from gangshare.core.queueing import QueuePolicy
from gangshare.operator.conditions import iso
from gangshare.operator.forecasts import (
    ForecastBook,
    forecast_moved,
    forecast_status,
    written_forecast_note,
)
from gangshare.operator.pending import PendingReasons
from gangshare.queue_view import queue_rows, render

POLICY = QueuePolicy()
T0 = 1_800_000_000.0


def forecast(key: str, start: float | None, position: int = 1, size: int = 3) -> Forecast:
    return Forecast(
        key=key,
        queue="default",
        start=start,
        earliest=None if start is None else T0 + (start - T0) * 0.5,
        latest=None if start is None else T0 + (start - T0) * 2,
        position=position,
        queue_size=size,
        cohort=None,
        cohort_position=None,
        blocked_by="waiting behind team/x (strict order in its queue)",
    )


def one_waiting_job() -> tuple[RecordingApi, PendingReasons, dict, dict, list]:
    """Job team/a waiting behind another, and the reason writer (60 s refresh) it goes to."""
    api = RecordingApi()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = queued("a")
    return (
        api,
        reasons,
        job,
        {"team/a": job},
        [waiting(job, "waiting behind team/x", PendingKind.BEHIND)],
    )


def test_a_forecast_is_due_on_its_period_sooner_for_new_jobs_and_never_within_the_gap():
    book = ForecastBook(period_seconds=30)
    job = waiting(queued("a"), "r", PendingKind.BEHIND).job
    assert book.due(T0, [job])
    book.current, book.made_at = {job.key: forecast(job.key, T0)}, T0
    book._backlog = 1
    assert not book.due(T0 + 10, [job])
    assert book.due(T0 + 30, [job])
    other = waiting(queued("b"), "r", PendingKind.BEHIND).job
    assert not book.due(T0 + 2, [job, other])  # within the minimum gap
    assert book.due(T0 + 6, [job, other])  # a job with no forecast yet
    assert not book.due(T0 + 31, [])  # nothing waits


def test_a_forecast_is_news_when_it_moves_by_a_quarter_of_the_wait_or_leaves_the_horizon():
    written = forecast_status(forecast("team/a", T0 + 3600), T0)
    assert written["startTime"] == iso(T0 + 3600) and written["waitSeconds"] == 3600
    assert not forecast_moved(written, forecast("team/a", T0 + 3600 + 600), T0)
    assert forecast_moved(written, forecast("team/a", T0 + 3600 + 1000), T0)
    assert forecast_moved(written, forecast("team/a", None), T0)
    assert forecast_moved(None, forecast("team/a", T0), T0)
    # Close to the start a minute is the least move that counts.
    near = forecast_status(forecast("team/a", T0 + 100), T0)
    assert not forecast_moved(near, forecast("team/a", T0 + 150), T0)
    assert forecast_moved(near, forecast("team/a", T0 + 170), T0)


def test_the_forecast_rides_on_the_reason_write_and_alone_is_written_only_once_it_moved():
    api, reasons, job, by_key, behind = one_waiting_job()
    first = {"team/a": forecast("team/a", T0 + 3600)}
    assert reasons.explain(behind, by_key, POLICY, T0, forecasts=first) == 1
    assert len(api.writes) == 1  # one write: the reason and the forecast together
    assert job["status"]["forecast"]["startTime"] == iso(T0 + 3600)
    # Moved a little: no write; moved a lot, but within the refresh period: none yet.
    small = {"team/a": forecast("team/a", T0 + 3700)}
    assert reasons.explain(behind, by_key, POLICY, T0 + 100, forecasts=small) == 0
    big = {"team/a": forecast("team/a", T0 + 9000)}
    assert reasons.explain(behind, by_key, POLICY, T0 + 30, forecasts=big) == 0
    assert reasons.explain(behind, by_key, POLICY, T0 + 100, forecasts=big) == 1
    assert api.writes[-1][1] == {"forecast": forecast_status(big["team/a"], T0 + 100)}
    assert job["status"]["forecast"]["startTime"] == iso(T0 + 9000)
    # A forecast-only write posts no event.
    assert api.events == []


def test_a_queued_jobs_note_carries_the_forecast_with_no_relative_time():
    written = forecast_status(forecast("team/a", T0 + 720, position=2, size=5), T0)
    note = written_forecast_note(written)
    assert note == f"forecast start {iso(T0 + 720)}; 2 of 5 in its queue"
    assert written_forecast_note({"positionInQueue": 4, "queueLength": 4}) == (
        "forecast: not within a week; 4 of 4 in its queue"
    )


def test_gangshare_queue_lists_waiting_jobs_in_forecast_order_with_their_reasons():
    def tj(name: str, queue: str, position: int | None, start: float | None) -> dict:
        job = make_job(name).status(phase="Queued", queuedAt=iso(T0 - 600)).build()
        job["spec"]["queue"] = queue
        if position is not None:
            job["status"]["forecast"] = {
                **forecast_status(forecast(f"team/{name}", start, position), T0),
                "cohort": "lab",
                "positionInCohort": position * 2,
            }
        return job

    jobs = [
        tj("late", "a", 2, T0 + 7200),
        tj("unseen", "a", None, None),
        tj("first", "a", 1, T0 + 300),
        tj("other", "b", 1, None),
        make_job("running").status(phase="Running").build(),
    ]
    rows = queue_rows(jobs, T0, "a")
    assert [r.name for r in rows] == ["team/first", "team/late", "team/unseen"]
    assert [r.position for r in rows] == ["1", "2", "-"]
    assert rows[0].forecast.startswith("in ~5m") and rows[1].forecast.startswith("in ~2h")
    assert rows[0].forecast == f"in ~5m ({iso(T0 + 300)})"
    assert rows[2].forecast == "not yet forecast" and rows[0].waited == "10m"
    assert rows[0].reason.startswith("waiting behind")
    cohort = queue_rows(jobs, T0, "lab", cohort=True)
    assert [r.name for r in cohort] == ["team/first", "team/other", "team/late"]
    assert cohort[1].forecast == "not within a week"
    table = render(rows).splitlines()
    assert table[0].split()[:3] == ["POS", "QUEUE", "WORKLOAD"] and len(table) == 4
    assert render([]) == "No waiting workloads."


def test_a_jobs_first_forecast_is_written_at_once_even_after_a_recent_reason_write():
    _, reasons, job, by_key, behind = one_waiting_job()
    assert reasons.explain(behind, by_key, POLICY, T0) == 1  # no forecast made yet
    assert "forecast" not in job["status"]
    made = {"team/a": forecast("team/a", T0 + 3600)}
    assert reasons.explain(behind, by_key, POLICY, T0 + 5, forecasts=made) == 1
    assert job["status"]["forecast"]["startTime"] == iso(T0 + 3600)


def test_a_costly_forecast_waits_twenty_times_its_cost_and_a_period_of_zero_turns_them_off():
    book = ForecastBook(period_seconds=30)
    job = waiting(queued("a"), "r", PendingKind.BEHIND).job
    book.current, book.made_at, book.last_seconds = {}, T0, 3.0
    assert not book.due(T0 + 59, [job])  # a job without a forecast, but 3 s x 20 not yet over
    assert book.due(T0 + 60, [job])
    off = ForecastBook(period_seconds=0)
    assert not off.due(T0, [job])


def test_a_job_that_cannot_be_admitted_as_it_stands_gets_no_forecast():
    api = RecordingApi()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = queued("a")
    lost = [waiting(job, "queue nope does not exist (spec.queue)", PendingKind.INADMISSIBLE)]
    made = {"team/a": forecast("team/a", None)}
    assert reasons.explain(lost, {"team/a": job}, POLICY, T0, forecasts=made) == 1
    assert job["status"]["message"] == "queue nope does not exist (spec.queue)"
    assert "forecast" not in job["status"]
    assert reasons.explain(lost, {"team/a": job}, POLICY, T0 + 120, forecasts=made) == 0


def test_a_forecast_yields_to_admissions_for_up_to_four_periods():
    book = ForecastBook(period_seconds=30)
    job = waiting(queued("a"), "r", PendingKind.BEHIND).job
    # Passes that admit hold the first forecast back, up to four periods from the first wait.
    assert not book.due(T0, [job], admitting=True)
    assert not book.due(T0 + 119, [job], admitting=True)
    assert book.due(T0 + 120, [job], admitting=True)
    assert book.due(T0 + 1, [job])  # a pass that admits nothing makes it at once
    book.current, book.made_at, book._backlog = {job.key: forecast(job.key, T0)}, T0, 1
    assert book.due(T0 + 30, [job]) and not book.due(T0 + 30, [job], admitting=True)
    assert book.due(T0 + 120, [job], admitting=True)


def test_a_pass_that_admitted_writes_few_forecasts_alone_and_the_rest_follow():
    api = RecordingApi()
    reasons = PendingReasons(
        api, writes_per_pass=10, refresh_seconds=60, forecast_writes_while_admitting=2
    )  # type: ignore[arg-type]
    jobs = [queued(name) for name in "abcde"]
    by_key = {f"team/{job['metadata']['name']}": job for job in jobs}
    behind = [waiting(job, "waiting behind team/x", PendingKind.BEHIND) for job in jobs]
    assert reasons.explain(behind, by_key, POLICY, T0) == 5  # reasons: no forecast yet
    made = {key: forecast(key, T0 + 3600) for key in by_key}
    assert reasons.explain(behind, by_key, POLICY, T0 + 5, forecasts=made, admitting=True) == 2
    assert [job["metadata"]["name"] for job in jobs if "forecast" in job["status"]] == ["a", "b"]
    # A reason that is due carries its forecast whatever the cap.
    moved = [waiting(jobs[4], "queue team quota", PendingKind.QUOTA)]
    assert reasons.explain(moved, by_key, POLICY, T0 + 6, forecasts=made, admitting=True) == 1
    assert "forecast" in jobs[4]["status"]
    # Once a pass admits nothing, the rest are written.
    assert reasons.explain(behind[:4], by_key, POLICY, T0 + 7, forecasts=made) == 2
    assert all("forecast" in job["status"] for job in jobs)
