"""Leader election on a coordination.k8s.io/v1 Lease: one operator replica acts, others wait.

The operator's decisions are safe against a second writer (every admission is a write
conditional on the resourceVersion it was decided from, pod names are fixed per rank), but two
replicas would still race each other on every pass, post every event twice and fight over
Queue statuses. So only the holder of the Lease runs scheduling passes and reconciles.

- `decide` is the pure rule: take the Lease when it is absent, free, or unchanged for longer
  than its leaseDurationSeconds *as this replica observed it*; renew it when it is ours;
  otherwise wait. As client-go does, a standby never compares the holder's renewTime with its
  own wall clock (the two clocks may disagree by any amount): it notes on its own monotonic
  clock when it last saw the record change, and a holder that keeps renewing keeps it waiting
  whatever its renewTime says. A replica that just started waits a whole duration too.
- The holder renews every 5 s. A holder that could not renew for 10 s (the renew deadline,
  as client-go's) stops acting at once: `is_leader` turns False by itself, before any
  standby may take the Lease (15 s after it saw the last renewal, which is later still).
- `is_leader` is also the operator's write fence (KubeApi.fence): every mutating call checks
  it first, so a reconcile already in flight when the lead is lost writes nothing more.
- Every write is a replace conditional on the resourceVersion read (409: someone else won).
- On a graceful stop the holder gives the Lease up (holder cleared, 1 s duration), so a
  rolling update hands over at once instead of after 15 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from kubernetes import client

log = logging.getLogger("gangshare.operator")

LEASE_NAME = "gangshare-operator"
LEASE_DURATION_SECONDS = 15
RENEW_INTERVAL_SECONDS = 5.0
RETRY_INTERVAL_SECONDS = 2.0
RENEW_DEADLINE_SECONDS = 10.0


class Decision(StrEnum):
    CREATE = "Create"  # no Lease yet
    TAKE = "Take"  # free, or unchanged for a whole duration: take it over
    RENEW = "Renew"  # ours
    WAIT = "Wait"  # someone else holds it and renewed in time


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    renew_time: float | None  # seconds since the epoch, on the writer's clock
    duration_seconds: int = LEASE_DURATION_SECONDS
    transitions: int = 0
    acquire_time: float | None = None
    resource_version: str | None = None

    def content(self) -> LeaseRecord:
        """What a change of the record is judged on: every field its holder writes, not the
        resourceVersion (any write to the object moves that, a label too)."""
        return replace(self, resource_version=None)


def decide(record: LeaseRecord | None, identity: str, unchanged_for: float) -> Decision:
    """unchanged_for: seconds, on this replica's monotonic clock, since it last saw the
    record change (0 when it sees this record for the first time)."""
    if record is None:
        return Decision.CREATE
    if record.holder == identity:
        return Decision.RENEW
    if not record.holder or unchanged_for > record.duration_seconds:
        return Decision.TAKE
    return Decision.WAIT


def next_record(
    record: LeaseRecord | None, identity: str, now: float, release: bool = False
) -> LeaseRecord:
    """What we write: our renewal, our takeover (a new transition), or a release."""
    if release:
        return LeaseRecord(
            None,
            now,
            1,
            record.transitions if record else 0,
            record.acquire_time if record else None,
            record.resource_version if record else None,
        )
    ours = record is not None and record.holder == identity
    transitions = (record.transitions if record else 0) + (0 if ours or record is None else 1)
    acquired = record.acquire_time if ours and record is not None else now
    return LeaseRecord(
        identity,
        now,
        LEASE_DURATION_SECONDS,
        transitions,
        acquired,
        record.resource_version if record else None,
    )


def _seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _micro_time(seconds: float | None) -> datetime | None:
    if seconds is None:
        return None
    value = datetime.fromtimestamp(seconds, UTC)
    # The client writes a datetime without its fraction when the microseconds are 0, and the
    # API server's MicroTime insists on six digits: never let that one-in-a-million case fail.
    return value if value.microsecond else value.replace(microsecond=1)


def record_of(lease: client.V1Lease) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    return LeaseRecord(
        spec.holder_identity or None,
        _seconds(spec.renew_time),
        int(spec.lease_duration_seconds or LEASE_DURATION_SECONDS),
        int(spec.lease_transitions or 0),
        _seconds(spec.acquire_time),
        lease.metadata.resource_version if lease.metadata else None,
    )


def lease_of(record: LeaseRecord, namespace: str, name: str) -> client.V1Lease:
    return client.V1Lease(
        api_version="coordination.k8s.io/v1",
        kind="Lease",
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, resource_version=record.resource_version
        ),
        spec=client.V1LeaseSpec(
            holder_identity=record.holder,
            lease_duration_seconds=record.duration_seconds,
            renew_time=_micro_time(record.renew_time),
            acquire_time=_micro_time(record.acquire_time),
            lease_transitions=record.transitions,
        ),
    )


class LeaseApi(Protocol):
    def get_lease(self, namespace: str, name: str) -> client.V1Lease | None: ...
    def create_lease(self, namespace: str, lease: client.V1Lease) -> bool: ...
    def replace_lease(self, namespace: str, name: str, lease: client.V1Lease) -> bool: ...


class LeaderElector:
    """Acquires and renews the Lease in a thread of its own; `is_leader` gates all acting."""

    def __init__(
        self,
        api: LeaseApi,
        namespace: str,
        name: str,
        identity: str,
        on_lost: Callable[[str], None],
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.on_lost = on_lost
        # Called once leadership is gained (the scheduling loop starts a pass at once).
        self.on_elected: Callable[[], None] = lambda: None
        self.wall = wall
        self.monotonic = monotonic
        self._leading = False
        self._lost = False
        self._renewed_at = 0.0
        self._last_ok = False
        self._waiting_on: str | None = None
        # The Lease record as last seen, and when (monotonic) it was first seen as it is.
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._stop = threading.Event()

    def is_leader(self) -> bool:
        # The deadline is checked here too, so acting stops on time even while a renewal
        # hangs in the elector thread.
        return (
            self._leading
            and not self._lost
            and self.monotonic() - self._renewed_at < RENEW_DEADLINE_SECONDS
        )

    def try_once(self) -> bool:
        """One acquire-or-renew attempt; whether we lead afterwards."""
        if self._lost:
            return False
        # Both clocks are read before the calls: the deadline then counts from the renewTime
        # written, however slow the API server answers.
        now, attempted = self.wall(), self.monotonic()
        self._last_ok = False
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            record = None if lease is None else record_of(lease)
            unchanged_for = 0.0 if record is None else self._observe(record)
            decision = decide(record, self.identity, unchanged_for)
            if decision is Decision.WAIT:
                assert record is not None
                self._standby(record, unchanged_for)
                return False
            written = next_record(record, self.identity, now)
            body = lease_of(written, self.namespace, self.name)
            if decision is Decision.CREATE:
                self._last_ok = self.api.create_lease(self.namespace, body)
            else:
                self._last_ok = self.api.replace_lease(self.namespace, self.name, body)
            if self._last_ok:
                self._observed, self._observed_at = written.content(), attempted
        except Exception as err:  # an unreachable API server: retried until the deadline
            log.warning("leader election: Lease %s not renewed: %s", self._where(), err)
        if self._last_ok:
            self._renewed_at = attempted
            if not self._leading:
                self._leading = True
                log.info("leader election: %s leads (Lease %s)", self.identity, self._where())
                self.on_elected()
        elif self._leading and self.monotonic() - self._renewed_at >= RENEW_DEADLINE_SECONDS:
            self._lose(f"the Lease was not renewed for {RENEW_DEADLINE_SECONDS:.0f}s")
        return self.is_leader()

    def _observe(self, record: LeaseRecord) -> float:
        """Seconds the record has stood unchanged as this replica saw it. A change is timed
        when it is seen (after the read returned): late rather than early, so a standby may
        wait a little long but never takes over a holder that is still renewing."""
        seen = record.content()
        if seen != self._observed:
            self._observed, self._observed_at = seen, self.monotonic()
        return self.monotonic() - self._observed_at

    def run(self) -> None:
        while not self._stop.is_set() and not self._lost:
            self.try_once()
            healthy = self._leading and self._last_ok
            self._stop.wait(RENEW_INTERVAL_SECONDS if healthy else RETRY_INTERVAL_SECONDS)

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Give the Lease up (graceful stop), so a standby takes over without waiting."""
        if not self.is_leader():
            return
        self._leading = False
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is None or record_of(lease).holder != self.identity:
                return
            freed = next_record(record_of(lease), self.identity, self.wall(), release=True)
            freed_lease = lease_of(freed, self.namespace, self.name)
            if self.api.replace_lease(self.namespace, self.name, freed_lease):
                log.info("leader election: Lease %s released", self._where())
        except Exception as err:  # it expires by itself within its duration
            log.warning("leader election: Lease %s not released: %s", self._where(), err)

    def _standby(self, record: LeaseRecord, unchanged_for: float) -> None:
        if self._leading:
            self._lose(f"the Lease is held by {record.holder}")
            return
        if record.holder != self._waiting_on:
            self._waiting_on = record.holder
            left = record.duration_seconds - unchanged_for
            log.info(
                "leader election: standby; Lease %s held by %s (taken over in %.0fs unless "
                "renewed)",
                self._where(),
                record.holder,
                left,
            )

    def _lose(self, why: str) -> None:
        self._leading = False
        self._lost = True
        log.error("leader election: %s lost the lead: %s", self.identity, why)
        self.on_lost(why)

    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"
