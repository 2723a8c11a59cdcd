"""`--policy`: comma-separated policy names, mapped onto the core's QueuePolicy and job classes.

| name            | what it sets                                                               |
| --------------- | -------------------------------------------------------------------------- |
| fifo            | Ordering.FIFO (the default order): strict arrival order in each lane       |
| priority        | Ordering.PRIORITY: higher priority first, FIFO among equals                |
| qssf (sjf)      | Ordering.SHORTEST by *predicted* GPU-time (RuntimeEstimator history)       |
| sjf-oracle      | Ordering.SHORTEST by the trace's true GPU-time (an oracle, for reference)  |
| multi-queue     | QueuePolicy.small_job_max_gpus = 2: small jobs wait in their own lane      |
| fair-share      | QueuePolicy.fair_share: lanes visited least-served queue first             |
| backfill        | QueuePolicy.backfill: EASY backfill with predicted run times               |
| antman          | jobs get Guaranteed/Opportunistic classes; opportunistic jobs share GPUs   |
| oracle-runtimes | true run times for backfill and expected ends, order unchanged (reference) |
| cohort          | idle quota lent within a cohort; borrowers run Opportunistic, reclaimable  |
| pool            | one pool without quotas: every queue keeps its lanes, none has a quota     |

Without `antman` every job is Guaranteed on whole GPUs (no sharing). Orderings
exclude each other; the rest combine, e.g. `multi-queue,backfill,antman`. `oracle-runtimes`
is implied by sjf-oracle and refused with qssf (one estimate per job both orders and reserves).
`cohort` puts every queue of the cluster spec that has a quota in one cohort, `all`, unless
the spec names cohorts (`queues[].cohort`); without it quotas are hard walls. `pool` drops
the spec's quotas (its weights stay, for fair-share): nothing is guaranteed to a queue,
nothing is borrowed or reclaimed; it excludes `cohort`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gangshare.core.queueing import Ordering, QueuePolicy
from gangshare.core.queues import QueueSpec

SMALL_JOB_MAX_GPUS = 2
DEFAULT_RUNTIME_SECONDS = 3600.0

ORDERINGS = {
    "fifo": Ordering.FIFO,
    "priority": Ordering.PRIORITY,
    "qssf": Ordering.SHORTEST,
    "sjf": Ordering.SHORTEST,
    "sjf-oracle": Ordering.SHORTEST,
}
FEATURES = (
    "multi-queue",
    "fair-share",
    "backfill",
    "antman",
    "cohort",
    "pool",
    "oracle-runtimes",
)
# The cohort `cohort` puts every queue with a quota in when the spec names none.
DEFAULT_COHORT = "all"
NAMES = (*ORDERINGS, *FEATURES)


class PolicyError(ValueError):
    """An unusable --policy value; the message names the flag."""


@dataclass(frozen=True)
class SimPolicy:
    name: str
    ordering: Ordering = Ordering.FIFO
    # The scheduler orders by true run times (sjf-oracle), which it then also sees.
    oracle: bool = False
    # The scheduler sees true run times without ordering by them (oracle-runtimes): what
    # backfill would gain from a perfect predictor, measured against the predicted runs.
    oracle_runtimes: bool = False
    multi_queue: bool = False
    fair_share: bool = False
    backfill: bool = False
    antman: bool = False
    # Queues lend idle quota to their cohort (QueuePolicy.queues with cohorts).
    cohort: bool = False
    # No queue has a quota (the cluster spec's are ignored); lanes stay per queue.
    pool: bool = False

    @property
    def exact_runtimes(self) -> bool:
        """Jobs carry their trace's run time instead of the estimator's prediction."""
        return self.oracle or self.oracle_runtimes

    def queue_policy(
        self,
        quotas: Mapping[str, int],
        weights: Mapping[str, float],
        cohorts: Mapping[str, str] | None = None,
        borrowing_limits: Mapping[str, int] | None = None,
        lending_limits: Mapping[str, int] | None = None,
        *,
        reclaim_min_runtime_seconds: float = 0.0,
        max_evictions_per_job: int | None = None,
        starvation_seconds: float | None = None,
    ) -> QueuePolicy:
        """The core's policy; the last two bound reclaim (QueuePolicy.reclaimable)."""
        if self.pool:
            quotas = {}
        queues: dict[str, QueueSpec] = {}
        if self.cohort:
            named = dict(cohorts or {})
            if not named:
                named = dict.fromkeys(quotas, DEFAULT_COHORT)
            borrowing, lending = borrowing_limits or {}, lending_limits or {}
            for queue in dict.fromkeys([*quotas, *weights, *named]):
                queues[queue] = QueueSpec(
                    queue,
                    nominal_gpus=quotas.get(queue),
                    borrowing_limit=borrowing.get(queue),
                    lending_limit=lending.get(queue),
                    weight=weights.get(queue, 1.0),
                    cohort=named.get(queue),
                )
        return QueuePolicy(
            ordering=self.ordering,
            small_job_max_gpus=SMALL_JOB_MAX_GPUS if self.multi_queue else None,
            fair_share=self.fair_share,
            backfill=self.backfill,
            quotas=dict(quotas),
            weights=dict(weights),
            default_runtime_seconds=DEFAULT_RUNTIME_SECONDS,
            queues=queues,
            reclaim_min_runtime_seconds=reclaim_min_runtime_seconds,
            max_evictions_per_job=max_evictions_per_job,
            starvation_seconds=starvation_seconds,
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
    if order == "qssf" and "oracle-runtimes" in tokens:
        # One estimate per job both orders and reserves: exact ones would order too.
        raise PolicyError(
            "--policy: qssf orders by predicted run times and oracle-runtimes would make "
            "them exact; use sjf-oracle for that"
        )
    features = [f for f in FEATURES if f in tokens]
    if "pool" in features and "cohort" in features:
        raise PolicyError(
            "--policy: pool has no quotas and cohort lends quotas; pick one "
            "(pool: one pool, no quotas; cohort: quotas, idle ones lent)"
        )
    if order == "sjf-oracle":
        features = [f for f in features if f != "oracle-runtimes"]  # already so
    name = ",".join(([order] if orders or not features else []) + features)
    return SimPolicy(
        name=name,
        ordering=ORDERINGS[order],
        oracle=order == "sjf-oracle",
        multi_queue="multi-queue" in features,
        fair_share="fair-share" in features,
        backfill="backfill" in features,
        antman="antman" in features,
        cohort="cohort" in features,
        pool="pool" in features,
        oracle_runtimes="oracle-runtimes" in features,
    )
