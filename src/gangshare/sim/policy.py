"""`--policy`: comma-separated policy names, mapped onto the core's QueuePolicy and job classes.

| name          | what it sets                                                              |
| ------------- | ------------------------------------------------------------------------- |
| fifo          | Ordering.FIFO (the default order): strict arrival order in each lane       |
| priority      | Ordering.PRIORITY: higher priority first, FIFO among equals               |
| qssf (sjf)    | Ordering.SHORTEST by *predicted* GPU-time (RuntimeEstimator history)      |
| sjf-oracle    | Ordering.SHORTEST by the trace's true GPU-time (an oracle, for reference) |
| multi-queue   | QueuePolicy.small_job_max_gpus = 2: small jobs wait in their own lane     |
| fair-share    | QueuePolicy.fair_share: lanes visited least-served queue first            |
| backfill      | QueuePolicy.backfill: EASY backfill with predicted run times              |
| antman        | jobs get Guaranteed/Opportunistic classes; opportunistic jobs share GPUs  |

Without `antman` every job is Guaranteed on whole GPUs (no sharing). Orderings
exclude each other; the rest combine, e.g. `multi-queue,backfill,antman`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gangshare.core.queueing import Ordering, QueuePolicy

SMALL_JOB_MAX_GPUS = 2
DEFAULT_RUNTIME_SECONDS = 3600.0

ORDERINGS = {
    "fifo": Ordering.FIFO,
    "priority": Ordering.PRIORITY,
    "qssf": Ordering.SHORTEST,
    "sjf": Ordering.SHORTEST,
    "sjf-oracle": Ordering.SHORTEST,
}
FEATURES = ("multi-queue", "fair-share", "backfill", "antman")
NAMES = (*ORDERINGS, *FEATURES)


class PolicyError(ValueError):
    """An unusable --policy value; the message names the flag."""


@dataclass(frozen=True)
class SimPolicy:
    name: str
    ordering: Ordering = Ordering.FIFO
    # The scheduler sees true run times (sjf-oracle); otherwise only predictions.
    oracle: bool = False
    multi_queue: bool = False
    fair_share: bool = False
    backfill: bool = False
    antman: bool = False

    def queue_policy(self, quotas: Mapping[str, int], weights: Mapping[str, float]) -> QueuePolicy:
        return QueuePolicy(
            ordering=self.ordering,
            small_job_max_gpus=SMALL_JOB_MAX_GPUS if self.multi_queue else None,
            fair_share=self.fair_share,
            backfill=self.backfill,
            quotas=dict(quotas),
            weights=dict(weights),
            default_runtime_seconds=DEFAULT_RUNTIME_SECONDS,
        )


def parse_policy(text: str) -> SimPolicy:
    tokens = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not tokens:
        raise PolicyError("--policy: empty; choose from " + ", ".join(NAMES))
    for token in tokens:
        if token not in NAMES:
            raise PolicyError(f"--policy: unknown policy {token!r}; choose from {', '.join(NAMES)}")
    orders = list(dict.fromkeys(t if t != "sjf" else "qssf" for t in tokens if t in ORDERINGS))
    if len(orders) > 1:
        raise PolicyError(f"--policy: {' and '.join(orders)} both set the order; pick one")
    order = orders[0] if orders else "fifo"
    features = [f for f in FEATURES if f in tokens]
    name = ",".join(([order] if orders or not features else []) + features)
    return SimPolicy(
        name=name,
        ordering=ORDERINGS[order],
        oracle=order == "sjf-oracle",
        multi_queue="multi-queue" in features,
        fair_share="fair-share" in features,
        backfill="backfill" in features,
        antman="antman" in features,
    )
