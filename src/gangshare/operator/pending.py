"""Why each waiting job waits, written to its status: bounded per pass, throttled per job.

Every waiting job gets its reason (the Admitted=False condition and status.message), but a
pass must not turn into thousands of status writes. Two rules keep the writes proportional
to what changed, not to how many jobs wait:
  - a *transition* (a new condition reason: Queued -> QuotaExceeded, or Inadmissible's why)
    is written at once and posts an event;
  - a reason whose text alone changed ("8 of 64 GPUs in use" -> "16 of 64") is rewritten at
    most every REFRESH_SECONDS per job, with no event: such texts move on every admission in
    the queue, and 10,000 waiting jobs would otherwise be rewritten on each.
At most WRITES_PER_PASS are written per pass, in queue order; the rest follow on later passes
(a pass comes every second or sooner). A pass that admitted writes at most
FORECAST_WRITES_WHILE_ADMITTING forecasts that ride on no reason: the pass waits for its
writes, and a burst of first forecasts for a standing backlog held admissions back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from gangshare.core.cycle import Pending, PendingKind
from gangshare.core.forecast import Forecast
from gangshare.core.queueing import QueuePolicy
from gangshare.core.shape_advice import ShapeAdvice
from gangshare.kube.shapes import parse_shapes
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.conditions import condition, set_condition
from gangshare.operator.first_queue import first_queue_status, is_new, place_in_line
from gangshare.operator.forecasts import advice_is_news, forecast_moved, forecast_status
from gangshare.operator.kubeapi import Conflict, KubeApi

WRITES_PER_PASS = 200
FORECAST_WRITES_WHILE_ADMITTING = 20
REFRESH_SECONDS = 60.0


@dataclass(frozen=True)
class PendingWrite:
    status: dict[str, Any]
    transition: bool  # a new condition reason (an event is posted); else the text alone moved
    # Shape advice new to status.forecast (a ShapeAdvised event, or Reshaped when taken).
    advice: ShapeAdvice | None = None


def detect_reshape(job: Mapping[str, Any], advice: ShapeAdvice) -> dict[str, int] | None:
    """status.reshapedTo when the author lets admission take the advice (spec.reshape: Admit,
    the shape among spec.shapes) and the job has not changed shape yet."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    try:
        shapes = parse_shapes(spec, status, int(spec["workers"]), int(spec["gpusPerWorker"]))
    except (KeyError, TypeError, ValueError):  # ShapeError is a ValueError
        return None
    shape = (advice.workers, advice.gpus_per_worker)
    if not shapes.admit or shapes.reshaped or shape not in shapes.alternatives:
        return None
    return {"workers": shape[0], "gpusPerWorker": shape[1]}


def inadmissible_why(waiting: Pending, policy: QueuePolicy) -> str | None:
    if waiting.kind is not PendingKind.INADMISSIBLE:
        return None
    if policy.require_known_queue and waiting.job.queue not in policy.queues:
        return "QueueNotFound"
    return "CannotFit"


def clear_inadmissible(
    conditions: list[dict[str, Any]], now: float, gen: int
) -> list[dict[str, Any]]:
    found = condition(conditions, "Inadmissible")
    if found is None or found.get("status") != "True":
        return conditions
    return set_condition(
        conditions, "Inadmissible", False, "CanFit", "the job can fit the cluster", now, gen
    )


def detect_pending_write(
    job: dict[str, Any], waiting: Pending, policy: QueuePolicy, now: float
) -> PendingWrite | None:
    """The status patch that tells why `job` waits; None when its status says so already. A
    new job's is its first status too (operator/first_queue.py)."""
    status = job.get("status") or {}
    if status.get("message") == waiting.reason:
        return None
    gen = int(job["metadata"].get("generation", 0))
    first: dict[str, Any] = {}
    if is_new(job):
        try:
            spec = parse_trainingjob(job)
        except InvalidSpec:
            return None  # the reconciler fails it, with the reason
        first = first_queue_status(spec, status, place_in_line(job, now), now, gen)
    conditions = status.get("conditions")
    admitted, blocked = condition(conditions, "Admitted"), condition(conditions, "Inadmissible")
    was = (
        (admitted or {}).get("reason"),
        blocked.get("reason") if blocked and blocked.get("status") == "True" else None,
    )
    why = inadmissible_why(waiting, policy)
    conditions = set_condition(
        conditions, "Admitted", False, waiting.kind.value, waiting.reason, now, gen
    )
    if why is not None:
        # Waiting cannot help: said once, re-judged every pass as nodes and policy change.
        conditions = set_condition(conditions, "Inadmissible", True, why, waiting.reason, now, gen)
    else:
        conditions = clear_inadmissible(conditions, now, gen)
    return PendingWrite(
        {**first, "message": waiting.reason, "conditions": conditions},
        transition=was != (waiting.kind.value, why),
    )


class PendingReasons:
    """Writes pending reasons within the per-pass budget; remembers when each was written."""

    def __init__(
        self,
        api: KubeApi,
        writes_per_pass: int = WRITES_PER_PASS,
        refresh_seconds: float = REFRESH_SECONDS,
        forecast_writes_while_admitting: int = FORECAST_WRITES_WHILE_ADMITTING,
    ) -> None:
        self.api = api
        self.writes_per_pass = writes_per_pass
        self.forecast_writes_while_admitting = forecast_writes_while_admitting
        self.refresh_seconds = refresh_seconds
        self._written_at: dict[str, float] = {}
        self.events_posted = 0  # over the process's life (the benchmark reads it)

    def explain(
        self,
        waiting: Iterable[Pending],
        by_key: dict[str, dict[str, Any]],
        policy: QueuePolicy,
        now: float,
        pool: Executor | None = None,
        forecasts: Mapping[str, Forecast] | None = None,
        advice: Mapping[str, ShapeAdvice] | None = None,
        admitting: bool = False,
    ) -> int:
        """Write the reasons due this pass (side by side on `pool`, when given: each is an
        API round trip), each with the job's forecast when it has moved (operator/forecasts.py);
        `admitting`: the pass admitted jobs (forecasts alone then wait their turn); returns
        how many were written."""
        due: list[tuple[dict[str, Any], Pending, PendingWrite]] = []
        alone = self.forecast_writes_while_admitting if admitting else self.writes_per_pass
        seen = set()
        forecasts, advice = forecasts or {}, advice or {}
        for pending in waiting:
            key = pending.job.key
            seen.add(key)
            if len(due) >= self.writes_per_pass:
                continue
            job = by_key[key]
            write = detect_pending_write(job, pending, policy, now)
            recent = now - self._written_at.get(key, -1e18) < self.refresh_seconds
            if write is not None and not write.transition and recent:
                write = None
            # A job that cannot be admitted as it stands has no start to forecast: its reason
            # says what to change.
            inadmissible = pending.kind is PendingKind.INADMISSIBLE
            forecast = None if inadmissible else forecasts.get(key)
            written = (job.get("status") or {}).get("forecast")
            told = advice.get(key) if forecast is not None else None
            news = forecast is not None and advice_is_news(written, told)
            # On a reason write it rides free; alone, a job's first is written at once, new
            # shape advice too, and a later one once it has moved, at most once per refresh.
            if forecast is not None and (
                write is not None
                or (
                    alone > 0
                    and (
                        not written
                        or news
                        or (not recent and forecast_moved(written, forecast, now))
                    )
                )
            ):
                alone -= write is None
                base = write or PendingWrite({}, transition=False)
                status = {**base.status, "forecast": forecast_status(forecast, now, told)}
                reshape = detect_reshape(job, told) if told is not None else None
                if reshape is not None:
                    status["reshapedTo"] = reshape
                write = PendingWrite(status, base.transition, told if news else None)
            if write is None:
                continue
            due.append((job, pending, write))
        for key in self._written_at.keys() - seen:
            del self._written_at[key]  # admitted, deleted or ended: nothing more to explain
        outcomes = (pool.map if pool is not None else map)(lambda d: self._write(*d), due)
        written = 0
        for (_, pending, _), (done, posted) in zip(due, list(outcomes), strict=True):
            if done:
                self._written_at[pending.job.key] = now
                written += 1
            self.events_posted += posted
        return written

    def _write(
        self, job: dict[str, Any], waiting: Pending, write: PendingWrite
    ) -> tuple[bool, int]:
        """Whether the status was written, and how many events were posted."""
        try:
            self.api.patch_job_status(job, write.status)
        except Conflict:
            return False, 0
        posted = 0
        if write.transition and waiting.kind is not PendingKind.BEHIND:
            kind = "Warning" if waiting.kind is PendingKind.INADMISSIBLE else "Normal"
            self.api.post_event(job, kind, waiting.kind.value, waiting.reason, action="Schedule")
            posted += 1
        if write.advice is not None:
            advice = write.status["forecast"]["advice"]["message"]
            if "reshapedTo" in write.status:
                message = f"took shape {write.advice.shape} (spec.reshape: Admit): {advice}"
                self.api.post_event(job, "Normal", "Reshaped", message, action="Schedule")
            else:
                self.api.post_event(job, "Normal", "ShapeAdvised", advice, action="Schedule")
            posted += 1
        return True, posted
