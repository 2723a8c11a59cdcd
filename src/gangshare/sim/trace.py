"""Job traces the simulator replays: the Philly job table, the Alibaba 2023 pod list, a generic CSV.

The format is recognised from the header:

- Philly (Pollux preparation): timestamp, duration, num_gpus, gpu_time, cluster.
  `cluster` is the virtual cluster (VC); it becomes the job's queue.
- Alibaba GPU 2023 (openb_pod_list_*.csv): name, num_gpu, gpu_milli, qos,
  creation_time, scheduled_time, deletion_time, and optionally gpu_spec. A pod ran
  from scheduled_time to deletion_time; pods that never ran (no scheduled_time) and
  CPU-only pods are left out and counted in `Trace.dropped`. gpu_spec (the gpuspec
  variants) names the GPU models a pod may run on, `|`-separated (`V100M16|V100M32`:
  either); empty or `nan` means any. Names are kept as written: they are the node
  list's `model` names.
- Generic: submit_time, duration, num_gpus (seconds, seconds, GPUs), and
  optionally job_id, queue, service_class (Guaranteed | Opportunistic),
  priority (integer, higher first), gpu_memory_mib, checkpoint_interval (seconds of
  a run between two checkpoints: what an eviction may lose; 0: no loss), gpu_spec (the
  GPU models it may run on, as Alibaba's).

Every error names the flag, the line and the field, e.g.
`--trace: line 12: duration: must be a positive number, got 'x'`; a header that fits
no format names, for each format, the columns it lacks.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from gangshare.core.job import ServiceClass

PHILLY_COLUMNS = frozenset({"timestamp", "duration", "num_gpus", "cluster"})
ALIBABA_COLUMNS = frozenset(
    {"name", "num_gpu", "gpu_milli", "qos", "creation_time", "scheduled_time", "deletion_time"}
)
GENERIC_COLUMNS = frozenset({"submit_time", "duration", "num_gpus"})
FORMATS: dict[str, frozenset[str]] = {
    "philly": PHILLY_COLUMNS,
    "alibaba": ALIBABA_COLUMNS,
    "generic": GENERIC_COLUMNS,
}


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the flag, line and field."""


@dataclass(frozen=True)
class TraceJob:
    key: str
    # Seconds since the first submission in the (windowed) trace.
    submit: float
    # Run time on dedicated GPUs, seconds.
    duration: float
    gpus: int
    queue: str = "default"
    # Alibaba: LS, BE, Burstable, Guaranteed.
    qos: str | None = None
    # Alibaba: per-GPU share requested by a 1-GPU pod, in thousandths; < 1000 is fractional.
    gpu_milli: int | None = None
    # Generic traces may say the class outright.
    service_class: ServiceClass | None = None
    priority: int = 0
    gpu_memory_mib: int | None = None
    # Generic: seconds of a run between two checkpoints; None: the simulator's flag.
    checkpoint_interval: float | None = None
    # Alibaba gpu_spec: the GPU models the job may run on (any one of them); empty: any.
    gpu_models: tuple[str, ...] = ()


@dataclass
class Trace:
    kind: str
    source: str
    jobs: list[TraceJob]
    # Rows left out, by reason (a count per reason).
    dropped: dict[str, int] = field(default_factory=dict)
    # Absolute time (epoch seconds) of t=0, when the trace has one.
    epoch: float | None = None

    def head(self, count: int) -> Trace:
        """The first `count` jobs by submission (for scaling runs)."""
        return Trace(self.kind, self.source, self.jobs[:count], dict(self.dropped), self.epoch)

    @property
    def pinned(self) -> int:
        """Jobs that name the GPU models they may run on (Alibaba gpu_spec)."""
        return sum(1 for j in self.jobs if j.gpu_models)


def detect_format(columns: set[str]) -> str:
    for kind, needed in FORMATS.items():
        if needed <= columns:
            return kind
    # The closest format (most columns found, then fewest missing) first: likely the one meant.
    closest = sorted(FORMATS, key=lambda k: (-len(FORMATS[k] & columns), len(FORMATS[k] - columns)))
    lacks = "; ".join(f"{k} lacks {', '.join(sorted(FORMATS[k] - columns))}" for k in closest)
    raise TraceError(
        f"--trace: unrecognised columns {sorted(columns)}; missing column(s) for each "
        f"format: {lacks}"
    )


def load_trace(
    path: Path, window: tuple[datetime, datetime] | None = None, kind: str | None = None
) -> Trace:
    """Read a trace file; `window` keeps Philly jobs submitted in [start, end]."""
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            columns = {c.strip() for c in reader.fieldnames or []}
            kind = kind or detect_format(columns)
            missing = FORMATS[kind] - columns
            if missing:
                raise TraceError(
                    f"--trace: {kind} trace needs column(s) {sorted(missing)}, missing from "
                    f"{sorted(columns)}"
                )
            rows = _numbered(reader)
            if kind == "philly":
                trace = _philly(rows, str(path), window)
            elif kind == "alibaba":
                trace = _alibaba(rows, str(path))
            else:
                trace = _generic(rows, str(path))
    except OSError as err:
        raise TraceError(f"--trace: cannot read {path} ({err.strerror or err})") from None
    except csv.Error as err:
        raise TraceError(f"--trace: {path} is not a CSV file ({err})") from None
    if window is not None and kind != "philly":
        raise TraceError("--window: only Philly traces carry calendar time")
    if not trace.jobs:
        raise TraceError(f"--trace: {path} has no GPU jobs to replay")
    return trace


# ----- field parsing -----------------------------------------------------------------------


def _numbered(reader: csv.DictReader[str]) -> Iterator[tuple[int, Mapping[str, str]]]:
    # Line 1 is the header, so data starts on line 2.
    for offset, row in enumerate(reader):
        yield offset + 2, row


def _number(row: Mapping[str, str], line: int, name: str, positive: bool = False) -> float:
    raw = (row.get(name) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"--trace: line {line}: {name}: must be a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise TraceError(
            f"--trace: line {line}: {name}: must be a non-negative number, got {raw!r}"
        )
    if positive and value <= 0:
        raise TraceError(f"--trace: line {line}: {name}: must be a positive number, got {raw!r}")
    return value


def _integer(row: Mapping[str, str], line: int, name: str, low: int = 0) -> int:
    value = _number(row, line, name)
    if value != int(value) or value < low:
        raise TraceError(
            f"--trace: line {line}: {name}: must be an integer >= {low}, got {row.get(name)!r}"
        )
    return int(value)


def _sorted(jobs: list[TraceJob]) -> list[TraceJob]:
    """Jobs by submission, t=0 at the first one; ties keep file order (keys are row-numbered)."""
    if not jobs:
        return jobs
    first = min(j.submit for j in jobs)
    shifted = [_shift(j, first) for j in jobs]
    return sorted(shifted, key=lambda j: j.submit)


def _shift(job: TraceJob, first: float) -> TraceJob:
    if first == 0:
        return job
    return replace(job, submit=job.submit - first)


def _count(dropped: dict[str, int], reason: str) -> None:
    dropped[reason] = dropped.get(reason, 0) + 1


# ----- the three formats -------------------------------------------------------------------


def _philly(
    rows: Iterator[tuple[int, Mapping[str, str]]],
    source: str,
    window: tuple[datetime, datetime] | None,
) -> Trace:
    jobs: list[TraceJob] = []
    dropped: dict[str, int] = {}
    stamps: dict[str, float] = {}  # ~75k distinct stamps in 82k rows: parse each once
    for line, row in rows:
        raw = (row.get("timestamp") or "").strip()
        when = stamps.get(raw)
        if when is None:
            when = _philly_time(raw, line)
            stamps[raw] = when
        if window is not None and not window[0].timestamp() <= when <= window[1].timestamp():
            _count(dropped, "outside --window")
            continue
        gpus = _integer(row, line, "num_gpus")
        if gpus == 0:
            _count(dropped, "no GPU")
            continue
        queue = (row.get("cluster") or "").strip()
        if not queue:
            raise TraceError(f"--trace: line {line}: cluster: must name the virtual cluster")
        jobs.append(
            TraceJob(f"philly-{line - 2}", when, _number(row, line, "duration", True), gpus, queue)
        )
    epoch = min((j.submit for j in jobs), default=None)
    return Trace("philly", source, _sorted(jobs), dropped, epoch)


def _philly_time(raw: str, line: int) -> float:
    try:
        return datetime.fromisoformat(raw).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(
            f"--trace: line {line}: timestamp: expected YYYY-MM-DD HH:MM:SS, got {raw!r}"
        ) from None


def _alibaba(rows: Iterator[tuple[int, Mapping[str, str]]], source: str) -> Trace:
    jobs: list[TraceJob] = []
    dropped: dict[str, int] = {}
    for line, row in rows:
        gpus = _integer(row, line, "num_gpu")
        if gpus == 0:
            _count(dropped, "CPU-only pod")
            continue
        if not (row.get("scheduled_time") or "").strip():
            _count(dropped, "never scheduled")
            continue
        started = _number(row, line, "scheduled_time")
        ended = _number(row, line, "deletion_time")
        if ended <= started:
            _count(dropped, "no run time")
            continue
        milli = _integer(row, line, "gpu_milli")
        if not 0 < milli <= 1000:
            raise TraceError(f"--trace: line {line}: gpu_milli: must be 1..1000, got {milli}")
        qos = (row.get("qos") or "").strip() or "LS"
        jobs.append(
            TraceJob(
                key=(row.get("name") or "").strip() or f"pod-{line - 2}",
                submit=_number(row, line, "creation_time"),
                duration=ended - started,
                gpus=gpus,
                qos=qos,
                gpu_milli=milli,
                gpu_models=gpu_models(optional(row, "gpu_spec")),
            )
        )
    return Trace("alibaba", source, _sorted(jobs), dropped)


def gpu_models(spec: str) -> tuple[str, ...]:
    """gpu_spec's models, sorted and once each: `V100M32|V100M16` -> (V100M16, V100M32).

    Empty and `nan` (how pandas writes an empty cell) mean no constraint.
    """
    if spec.lower() == "nan":
        return ()
    return tuple(sorted({m.strip() for m in spec.split("|") if m.strip()}))


def _service_class(raw: str, line: int) -> ServiceClass | None:
    if not raw:
        return None
    for cls in ServiceClass:
        if raw.lower() == cls.value.lower():
            return cls
    choices = ", ".join(c.value for c in ServiceClass)
    raise TraceError(f"--trace: line {line}: service_class: must be {choices}, got {raw!r}")


def optional(row: Mapping[str, str], name: str) -> str:
    return (row.get(name) or "").strip()


def _generic(rows: Iterator[tuple[int, Mapping[str, str]]], source: str) -> Trace:
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for line, row in rows:
        key = optional(row, "job_id") or f"job-{line - 2}"
        if key in seen:
            raise TraceError(f"--trace: line {line}: job_id: {key!r} appears twice")
        seen.add(key)
        memory = optional(row, "gpu_memory_mib")
        checkpoint = optional(row, "checkpoint_interval")
        priority = optional(row, "priority")
        jobs.append(
            TraceJob(
                key=key,
                submit=_number(row, line, "submit_time"),
                duration=_number(row, line, "duration", True),
                gpus=_integer(row, line, "num_gpus", 1),
                queue=optional(row, "queue") or "default",
                service_class=_service_class(optional(row, "service_class"), line),
                priority=int(_number(row, line, "priority")) if priority else 0,
                gpu_memory_mib=_integer(row, line, "gpu_memory_mib", 1) if memory else None,
                checkpoint_interval=(
                    _number(row, line, "checkpoint_interval") if checkpoint else None
                ),
                gpu_models=gpu_models(optional(row, "gpu_spec")),
            )
        )
    return Trace("generic", source, _sorted(jobs))
