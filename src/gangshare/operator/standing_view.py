"""The scheduling pass's snapshot, kept from the watch-fed stores' changes and audited.

Each pass takes what changed in the stores since the last (Informers.take_changes) and
applies only that to a snapshot that lives across passes (kube/standing.py); its cycle
plans on that cluster inside `undone_after`, and an admission is held again from the job's
status once written. Every `audit_seconds` a pass also rebuilds the snapshot from everything
the stores hold at the same moment, compares (kube/snapshot_drift.py), counts what drifted
in gangshare_snapshot_drift_total, logs it, and starts afresh from the rebuild. The TrainingJob
counts the metrics report are kept from the same changes (operator/job_counts.py) and audited
with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gangshare.kube.snapshot import Snapshot, build_snapshot
from gangshare.kube.snapshot_drift import AUDIT_SECONDS, snapshot_drift
from gangshare.kube.standing import StandingSnapshot
from gangshare.operator.informers import Informers, object_key
from gangshare.operator.job_counts import JobCounts
from gangshare.operator.metrics import OperatorMetrics

log = logging.getLogger("gangshare.operator")


class StandingView:
    def __init__(
        self,
        informers: Informers,
        default_runtime_seconds: float,
        metrics: OperatorMetrics,
        audit_seconds: float = AUDIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.informers = informers
        self.default_runtime_seconds = default_runtime_seconds
        self.metrics = metrics
        self.audit_seconds = audit_seconds
        self.clock = clock
        self.standing: StandingSnapshot | None = None
        self.job_counts = JobCounts()
        self._audited_at = clock()
        self.audits = 0
        self.drift_found = 0

    def snapshot(self) -> tuple[Snapshot, list[dict[str, Any]]]:
        """This pass's snapshot (the standing one with the stores' changes applied), and the
        jobs the stores held at that same moment."""
        due = self.standing is not None and self.clock() - self._audited_at >= self.audit_seconds
        taken = self.informers.take_changes(with_items=due)
        jobs, nodes, pods = taken.changes
        if self.standing is None:  # the first take brings everything the stores hold
            self.standing = StandingSnapshot(self.default_runtime_seconds)
            self.job_counts = JobCounts()
        try:
            self.job_counts.apply(jobs)
            self.standing.apply(nodes, pods, jobs)
        except Exception:
            # Half applied, and the changes are taken: the next pass starts from everything.
            self.standing = None
            self.informers.restart_changes()
            raise
        if taken.nodes is not None and taken.pods is not None:
            self._audit(taken.jobs, taken.nodes, taken.pods)
        return self.standing.snapshot(), taken.jobs

    def _audit(
        self,
        jobs: list[dict[str, Any]],
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
    ) -> None:
        self._audited_at = self.clock()
        assert self.standing is not None
        live = [j for j in jobs if not (j.get("metadata") or {}).get("deletionTimestamp")]
        rebuilt = build_snapshot(nodes, pods, live, self.default_runtime_seconds)
        drift = snapshot_drift(self.standing.snapshot(), rebuilt)
        counted = JobCounts()
        counted.apply({object_key(job): job for job in jobs})
        if counted.counts() != self.job_counts.counts():
            drift.append(("trainingjobs", "the TrainingJob counts differ from a count afresh"))
        self.audits += 1
        self.metrics.snapshot_audits.inc()
        if not drift:
            log.info(
                "snapshot audit: no drift (%d nodes, %d pods, %d jobs rebuilt and compared)",
                len(nodes),
                len(pods),
                len(jobs),
            )
            return
        self.drift_found += len(drift)
        for kind, _ in drift:
            self.metrics.snapshot_drift.labels(kind).inc()
        log.warning(
            "snapshot audit: %d difference(s) between the kept snapshot and its rebuild, "
            "repaired from the rebuild: %s",
            len(drift),
            "; ".join(what for _, what in drift[:5]),
        )
        self.standing = StandingSnapshot.of(nodes, pods, jobs, self.default_runtime_seconds)
        self.job_counts = counted
