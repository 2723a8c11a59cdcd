"""Run-time prediction for backfill and shortest-first ordering, from finished jobs' history.

The first rule that applies gives the prediction (`Source` names it, so status can say why):

1. history: a quantile of the recent runs of the same queue, GPU count and group, once the
   group has `min_samples` of them. A group is the user, or the job name without its
   generated suffix (`name_group`): the same experiment resubmitted tends to run alike.
2. history-queue: the same quantile over the queue and GPU count, any group, from its first
   run. Jobs of one team at one size repeat (Philly, Helios), and one run of the same shape
   still says more than a constant.
3. declared: the user's estimate. It comes after history because users' estimates are
   habitually loose (round numbers, generous limits) while history is measured.
4. default: the queue's default, else the global one.

A quantile of a bounded recent window, not a mean: run times are heavy-tailed and one
crashed or runaway run must not move the prediction far. The median (0.5) minimises the
absolute error; a higher quantile trades error for fewer underestimates, which are what
delay a backfill reservation. bench/predictor.py measures both on the shared traces.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

HISTORY_PER_KEY = 50
MIN_GROUP_SAMPLES = 3


class Source(StrEnum):
    HISTORY = "history"
    HISTORY_QUEUE = "history-queue"
    DECLARED = "declared"
    DEFAULT = "default"


@dataclass(frozen=True)
class Prediction:
    seconds: float
    source: Source
    # Runs the quantile was taken over; 0 unless the source is a history.
    samples: int = 0
    quantile: float = 0.5

    def explain(self) -> str:
        """One line for a job's status, e.g. 'median of 12 finished runs of its group'."""
        if self.source is Source.DECLARED:
            return "the job's declared estimate"
        if self.source is Source.DEFAULT:
            return "the default: no finished runs, no declared estimate"
        stat = "median" if self.quantile == 0.5 else f"p{round(self.quantile * 100)}"
        whose = "its group" if self.source is Source.HISTORY else "its queue at this GPU count"
        runs = "run" if self.samples == 1 else "runs"
        return f"{stat} of {self.samples} finished {runs} of {whose}"


class RuntimeEstimator:
    def __init__(
        self,
        default_seconds: float = 3600.0,
        history: int = HISTORY_PER_KEY,
        *,
        quantile: float = 0.5,
        min_samples: int = MIN_GROUP_SAMPLES,
        queue_defaults: Mapping[str, float] | None = None,
    ) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        if history < 1 or min_samples < 1:
            raise ValueError("history and min_samples must be at least 1")
        self.default_seconds = default_seconds
        self.quantile = quantile
        self.min_samples = min_samples
        self.queue_defaults = dict(queue_defaults or {})
        self._history = history
        # (queue, gpus, group) and (queue, gpus) -> the most recent run times.
        self._group_runs: dict[tuple[str, int, str], deque[float]] = {}
        self._queue_runs: dict[tuple[str, int], deque[float]] = {}
        # Quantiles already taken, dropped when their key's history changes: the simulator
        # asks for the same (queue, gpus) many times between two completions.
        self._taken: dict[tuple[str, int, str] | tuple[str, int], float] = {}

    def observe(self, queue: str, gpus: int, seconds: float, *, group: str = "") -> None:
        """Record a finished job's run time (successful runs only: failures say little)."""
        if not seconds > 0 or math.isinf(seconds):
            return
        shape = (queue, gpus)
        self._queue_runs.setdefault(shape, deque(maxlen=self._history)).append(seconds)
        self._taken.pop(shape, None)
        if group:
            key = (queue, gpus, group)
            self._group_runs.setdefault(key, deque(maxlen=self._history)).append(seconds)
            self._taken.pop(key, None)

    def predict(
        self, queue: str, gpus: int, declared: float | None = None, *, group: str = ""
    ) -> float:
        return self.prediction(queue, gpus, declared, group=group).seconds

    def prediction(
        self, queue: str, gpus: int, declared: float | None = None, *, group: str = ""
    ) -> Prediction:
        """The prediction with the rule that produced it (see the module's docstring)."""
        if group:
            key = (queue, gpus, group)
            runs = self._group_runs.get(key)
            if runs is not None and len(runs) >= self.min_samples:
                return Prediction(self._take(key, runs), Source.HISTORY, len(runs), self.quantile)
        shape = (queue, gpus)
        runs = self._queue_runs.get(shape)
        if runs:
            seconds = self._take(shape, runs)
            return Prediction(seconds, Source.HISTORY_QUEUE, len(runs), self.quantile)
        if declared is not None and declared > 0:
            return Prediction(declared, Source.DECLARED)
        return Prediction(self.queue_defaults.get(queue, self.default_seconds), Source.DEFAULT)

    def _take(self, key: tuple[str, int, str] | tuple[str, int], runs: deque[float]) -> float:
        value = self._taken.get(key)
        if value is None:
            value = self._taken[key] = quantile(sorted(runs), self.quantile)
        return value


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated between neighbours (numpy's 'linear')."""
    if not ordered:
        raise ValueError("quantile of no values")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    if fraction == 0.5:
        # Exactly statistics.median for an even count, so q=0.5 predicts what the median did.
        return (ordered[low] + ordered[high]) / 2
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


# Trailing name parts that a controller, a script or a person adds per submission.
_SEPARATORS = re.compile(r"([-_.])")
# Lowercase hex with a letter and a digit, 5+ long (git SHAs, UUID parts, "7f3a9c";
# "a100" stays, it names a GPU). Kubernetes' random suffixes use an alphabet without
# vowels (generateName: 5 characters; pod-template-hash: 8-10).
_HEX = re.compile(r"(?=.*[0-9])(?=.*[a-f])[0-9a-f]{5,}")
_KUBE_ALPHABET = "[bcdfghjklmnpqrstvwxz2456789]"
_KUBE_RANDOM = re.compile(rf"(?=.*[0-9])(?:{_KUBE_ALPHABET}{{5}}|{_KUBE_ALPHABET}{{8,10}})")
# A replica's role, stripped only when an index followed it ("-worker-0", "-ps-1").
_ROLES = frozenset({"worker", "master", "chief", "ps", "launcher", "evaluator", "replica", "rank"})


def name_group(name: str) -> str:
    """The job's name without generated suffixes: "bert-finetune-42" -> "bert-finetune".

    Strips trailing counters and dates ("-12", "-20240105"), hashes ("-7f3a9c") and
    Kubernetes' random suffixes, and a replica role before an index ("-worker-0").
    A name that is nothing but such parts has no group ("").
    """
    parts = _SEPARATORS.split(name.strip().lower())
    tokens, separators = parts[0::2], parts[1::2]
    kept = len(tokens)
    indexed = False
    while kept > 0:
        token = tokens[kept - 1]
        if not token or _generated(token):
            indexed = indexed or token.isdigit()
            kept -= 1
        elif indexed and token in _ROLES:
            indexed = False
            kept -= 1
        else:
            break
    out = tokens[0] if kept else ""
    for i in range(1, kept):
        out += separators[i - 1] + tokens[i]
    return out


def _generated(token: str) -> bool:
    return token.isdigit() or bool(_HEX.fullmatch(token) or _KUBE_RANDOM.fullmatch(token))
