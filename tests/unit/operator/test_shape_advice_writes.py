"""Shape advice in the operator: status.forecast.advice and its event, spec.reshape: Admit
taking the advised shape (status.reshapedTo), and what a TrainingJob's shapes parse to."""

from __future__ import annotations

from typing import Any

import pytest
from jobs import make_job
from test_forecast_writes import T0, forecast
from test_scheduler_pass import RecordingApi, waiting

from gangshare.core.cycle import PendingKind
from gangshare.core.queueing import QueuePolicy
from gangshare.core.shape_advice import ShapeAdvice
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.pending import PendingReasons, detect_reshape

POLICY = QueuePolicy()
HOUR_3 = 3 * 3600.0


class Api(RecordingApi):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[str, str]] = []

    def post_event(self, job: dict[str, Any], kind: str, reason: str, message: str, action: str):
        super().post_event(job, kind, reason, message, action)
        self.messages.append((reason, message))


def wide_job(reshape: str | None = None, **status: Any) -> dict[str, Any]:
    """team/a: one 8-GPU worker whose author allows 2x4 and 8x1."""
    job = make_job("a").spec(workers=1, gpusPerWorker=8).status(phase="Queued", **status).build()
    job["spec"]["shapes"] = [{"workers": 2, "gpusPerWorker": 4}, {"workers": 8, "gpusPerWorker": 1}]
    if reshape is not None:
        job["spec"]["reshape"] = reshape
    return job


def explain(reasons: PendingReasons, job: dict[str, Any], now: float, advice: Any) -> int:
    behind = [waiting(job, "waiting behind team/x", PendingKind.BEHIND)]
    made = {"team/a": forecast("team/a", T0 + HOUR_3)}
    return reasons.explain(behind, {"team/a": job}, POLICY, now, forecasts=made, advice=advice)


ADVICE = {"team/a": ShapeAdvice("team/a", 2, 4, T0 + 240, T0 + HOUR_3)}


def test_advice_is_written_with_the_forecast_and_told_once_in_an_event():
    api = Api()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = wide_job()
    assert explain(reasons, job, T0, ADVICE) == 1
    told = job["status"]["forecast"]["advice"]
    assert told["message"] == "as 2x4 it would start in about 4 min instead of in about 3 h"
    assert (told["workers"], told["gpusPerWorker"]) == (2, 4)
    assert api.messages[-1] == ("ShapeAdvised", told["message"])
    assert "reshapedTo" not in job["status"]  # Advise (the default) never changes the shape
    # The same advice again: no write, no event.
    assert explain(reasons, job, T0 + 120, ADVICE) == 0
    assert [reason for reason, _ in api.messages].count("ShapeAdvised") == 1
    # Advice that no longer holds is cleared at once, with no event.
    assert explain(reasons, job, T0 + 130, {}) == 1
    assert job["status"]["forecast"]["advice"] is None
    # Waiting behind another job posts no event of its own: the advice's is the only one.
    assert api.messages == [("ShapeAdvised", told["message"])]


def test_with_reshape_admit_the_advised_shape_is_taken_once_and_parsed_as_the_jobs_shape():
    api = Api()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = wide_job("Admit")
    before = parse_trainingjob(job)
    assert (before.workers, before.gpus_per_worker) == (1, 8)
    assert before.gang().alternative_shapes == ((2, 4), (8, 1))
    assert explain(reasons, job, T0, ADVICE) == 1
    assert job["status"]["reshapedTo"] == {"workers": 2, "gpusPerWorker": 4}
    reason, message = api.messages[-1]
    assert reason == "Reshaped" and message.startswith("took shape 2x4 (spec.reshape: Admit)")
    after = parse_trainingjob(job)
    assert (after.workers, after.gpus_per_worker, after.total_gpus) == (2, 4, 8)
    assert [after.pod_name(r) for r in range(2)] == ["a-worker-0", "a-worker-1"]
    # A job changes shape once: no more alternatives, so no more advice.
    assert after.gang().alternative_shapes == () and after.shapes.reshaped


def test_a_forged_or_stale_reshaped_to_grants_nothing():
    # Not among spec.shapes (another total would need a quota it was not judged by).
    forged = wide_job("Admit", reshapedTo={"workers": 4, "gpusPerWorker": 8})
    assert (parse_trainingjob(forged).workers, parse_trainingjob(forged).gpus_per_worker) == (1, 8)
    # Among them, but the author took the opt-in back.
    advise_only = wide_job("Advise", reshapedTo={"workers": 2, "gpusPerWorker": 4})
    assert parse_trainingjob(advise_only).workers == 1
    # And the writer never takes advice for a job without the opt-in.
    api = Api()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = wide_job("Advise")
    explain(reasons, job, T0, ADVICE)
    assert "reshapedTo" not in job["status"]


def test_admission_takes_only_an_allowed_shape_and_only_once():
    allowed = ShapeAdvice("team/a", 2, 4, T0 + 240, T0 + HOUR_3)
    assert detect_reshape(wide_job("Admit"), allowed) == {"workers": 2, "gpusPerWorker": 4}
    # Advice naming a shape the author did not list (a stale round, a bug) is not taken.
    assert detect_reshape(wide_job("Admit"), ShapeAdvice("team/a", 4, 2, T0, T0 + 9)) is None
    taken = wide_job("Admit", reshapedTo={"workers": 8, "gpusPerWorker": 1})
    assert detect_reshape(taken, allowed) is None  # it changed shape already
    assert detect_reshape(wide_job("Advise"), allowed) is None
    broken = wide_job("Admit")
    broken["spec"]["shapes"] = [{"workers": 2, "gpusPerWorker": "four"}]
    assert detect_reshape(broken, allowed) is None  # the schema refuses it; never a traceback


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            {"shapes": [{"workers": 3, "gpusPerWorker": 2}]},
            "spec.shapes[0]: workers and gpusPerWorker holding the same 8 GPUs",
        ),
        ({"shapes": [{"workers": 0, "gpusPerWorker": 8}]}, "spec.shapes[0]"),
        ({"shapes": "2x4"}, "spec.shapes: a list of at most 8 shapes"),
        ({"jobRef": {"kind": "Job", "name": "x"}}, "spec.shapes: only a TrainingJob"),
    ],
)
def test_bad_shapes_are_named_by_field(change: dict[str, Any], error: str):
    job = wide_job()
    job["spec"].update(change)
    with pytest.raises(InvalidSpec, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_trainingjob(job)
