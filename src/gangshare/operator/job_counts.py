"""TrainingJobs by (phase, service class, queue, kind), kept from the job store's changes.

Counting every job held at every pass was a walk over all of them (50,000 queued jobs: a
fifteenth of a steady pass, #39); the pass's standing view (operator/standing_view.py) hands
each change to `apply` instead, starts afresh from everything on a relist or restart, and its
audit holds the kept counts to a count made afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gangshare.kube.queued_kinds import workload_kind_name

TrainingJobKey = tuple[str, str, str, str]  # (phase, service_class, queue, kind)


def count_key(job: Mapping[str, Any]) -> TrainingJobKey | None:
    """Where the job is counted; None for one being deleted (it counts no more)."""
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return None
    spec, status = job.get("spec") or {}, job.get("status") or {}
    # As kube.claims.admitted_class: the class admission decided, else what the spec asks.
    service_class = str(status.get("serviceClass") or spec.get("serviceClass", "Guaranteed"))
    queue = str(spec.get("queue", "default"))
    return (str(status.get("phase") or "New"), service_class, queue, workload_kind_name(job))


class JobCounts:
    def __init__(self) -> None:
        self._keys: dict[str, TrainingJobKey] = {}
        self._counts: dict[TrainingJobKey, int] = {}

    @classmethod
    def of(cls, jobs: Iterable[Mapping[str, Any]]) -> JobCounts:
        counts = cls()
        for i, job in enumerate(jobs):
            counts._count(str(i), job)
        return counts

    def apply(self, changes: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Each job's change, by store key: the object now, None when it is gone."""
        for key, job in changes.items():
            old = self._keys.pop(key, None)
            if old is not None:
                left = self._counts[old] - 1
                if left:
                    self._counts[old] = left
                else:
                    del self._counts[old]
            if job is not None:
                self._count(key, job)

    def _count(self, key: str, job: Mapping[str, Any]) -> None:
        where = count_key(job)
        if where is not None:
            self._keys[key] = where
            self._counts[where] = self._counts.get(where, 0) + 1

    def counts(self) -> dict[TrainingJobKey, int]:
        """The counts, only those above 0."""
        return dict(self._counts)
