"""Leader election: the pure Lease rule, and the elector against an in-memory Lease store."""

from __future__ import annotations

import pytest
from kubernetes import client

from gangshare.operator.leader import (
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    Decision,
    LeaderElector,
    LeaseRecord,
    decide,
    lease_of,
    next_record,
    record_of,
)

NOW = 1_800_000_000.0
ME, OTHER = "op-a-123456", "op-b-654321"


# ----- the pure rule ----------------------------------------------------------------------------


def test_a_missing_lease_is_created():
    assert decide(None, ME, NOW) is Decision.CREATE


def test_our_own_lease_is_renewed_even_when_expired():
    assert decide(LeaseRecord(ME, NOW - 1), ME, NOW) is Decision.RENEW
    assert decide(LeaseRecord(ME, NOW - 100), ME, NOW) is Decision.RENEW


def test_a_fresh_lease_of_someone_else_is_waited_on():
    assert decide(LeaseRecord(OTHER, NOW), ME, NOW) is Decision.WAIT
    # Exactly at its expiry it is still theirs: expired means renewTime + duration < now.
    assert decide(LeaseRecord(OTHER, NOW - LEASE_DURATION_SECONDS), ME, NOW) is Decision.WAIT


def test_an_expired_or_free_lease_is_taken():
    expired = LeaseRecord(OTHER, NOW - LEASE_DURATION_SECONDS - 0.001)
    assert decide(expired, ME, NOW) is Decision.TAKE
    # A released Lease (holder cleared) and one never renewed are free.
    assert decide(LeaseRecord(None, NOW), ME, NOW) is Decision.TAKE
    assert decide(LeaseRecord(OTHER, None), ME, NOW) is Decision.TAKE
    # The holder's own duration counts, not ours.
    assert decide(LeaseRecord(OTHER, NOW - 2, duration_seconds=1), ME, NOW) is Decision.TAKE


def test_the_written_record_counts_transitions_and_keeps_the_acquire_time():
    created = next_record(None, ME, NOW)
    assert (created.holder, created.renew_time, created.acquire_time) == (ME, NOW, NOW)
    assert (created.duration_seconds, created.transitions) == (LEASE_DURATION_SECONDS, 0)
    renewed = next_record(LeaseRecord(ME, NOW, 15, 3, NOW - 60, "7"), ME, NOW + 5)
    assert (renewed.renew_time, renewed.acquire_time, renewed.transitions) == (NOW + 5, NOW - 60, 3)
    assert renewed.resource_version == "7"  # the write is conditional on what was read
    taken = next_record(LeaseRecord(OTHER, NOW - 60, 15, 3, NOW - 600, "8"), ME, NOW)
    assert (taken.holder, taken.acquire_time, taken.transitions) == (ME, NOW, 4)
    released = next_record(renewed, ME, NOW + 6, release=True)
    assert (released.holder, released.duration_seconds) == (None, 1)
    assert decide(released, OTHER, NOW + 6) is Decision.TAKE


def test_a_record_survives_the_round_trip_through_the_lease_object():
    record = LeaseRecord(ME, NOW + 0.25, 15, 2, NOW - 29.5, "42")
    lease = lease_of(record, "gs", "gangshare-operator")
    assert lease.metadata.resource_version == "42"
    assert record_of(lease) == record
    # A whole second would lose its fraction on the wire, which MicroTime refuses.
    on_the_second = lease_of(LeaseRecord(ME, NOW), "gs", "x").spec.renew_time
    assert on_the_second.microsecond == 1
    serialized = client.ApiClient().sanitize_for_serialization(lease)
    assert serialized["spec"]["renewTime"].startswith("2027-01-15T08:00:00.250000")


# ----- the elector -----------------------------------------------------------------------------


class FakeLeases:
    """One Lease with resourceVersion semantics, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0
        self.fail = False

    def get_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        if self.fail:
            raise ConnectionError("API server unreachable")
        return self.lease

    def create_lease(self, namespace: str, lease: client.V1Lease) -> bool:
        if self.lease is not None:
            return False
        self._store(lease)
        return True

    def replace_lease(self, namespace: str, name: str, lease: client.V1Lease) -> bool:
        if self.fail:
            raise ConnectionError("API server unreachable")
        if self.lease is None or lease.metadata.resource_version != str(self.version):
            return False  # 409
        self._store(lease)
        return True

    def _store(self, lease: client.V1Lease) -> None:
        self.version += 1
        lease.metadata.resource_version = str(self.version)
        self.lease = lease

    def holder(self) -> str | None:
        return None if self.lease is None else record_of(self.lease).holder


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> float:
        return NOW + self.t

    def mono(self) -> float:
        return self.t


def elector(leases: FakeLeases, clock: Clock, identity: str, lost: list[str]) -> LeaderElector:
    return LeaderElector(
        leases, "gs", "gangshare-operator", identity, lost.append, clock.wall, clock.mono
    )


def test_one_of_two_replicas_leads_and_the_other_takes_over_once_the_lease_expires():
    leases, clock, lost = FakeLeases(), Clock(), []
    a, b = elector(leases, clock, ME, lost), elector(leases, clock, OTHER, lost)
    elected: list[str] = []
    a.on_elected = lambda: elected.append(ME)
    b.on_elected = lambda: elected.append(OTHER)
    assert a.try_once() and not b.try_once()
    assert leases.holder() == ME and elected == [ME]
    clock.t = 5
    assert a.try_once() and not b.try_once()  # renewed: b keeps waiting
    # a dies (no more renewals): b takes over only once renewTime + 15 s has passed.
    clock.t = 5 + LEASE_DURATION_SECONDS
    assert not b.try_once()
    clock.t += 0.5
    assert b.try_once()
    assert leases.holder() == OTHER and elected == [ME, OTHER]
    assert record_of(leases.lease).transitions == 1
    assert lost == []


def test_a_leader_that_cannot_renew_stops_acting_before_anyone_may_take_over():
    leases, clock, lost = FakeLeases(), Clock(), []
    a = elector(leases, clock, ME, lost)
    assert a.try_once()
    leases.fail = True
    clock.t = RENEW_DEADLINE_SECONDS - 1
    assert a.try_once() and lost == []  # not renewed, but still within the deadline
    # Past the deadline is_leader is False by itself, even before the elector notices ...
    clock.t = RENEW_DEADLINE_SECONDS
    assert not a.is_leader() and lost == []
    # ... which happens on its next attempt: lost for good (the operator then exits).
    assert not a.try_once()
    assert len(lost) == 1 and "not renewed" in lost[0]
    assert RENEW_DEADLINE_SECONDS < LEASE_DURATION_SECONDS
    leases.fail = False
    assert not a.try_once()  # a lost elector never comes back in this process


def test_a_leader_that_finds_the_lease_taken_loses_at_once():
    leases, clock, lost = FakeLeases(), Clock(), []
    a = elector(leases, clock, ME, lost)
    assert a.try_once()
    leases.lease = lease_of(
        LeaseRecord(OTHER, NOW + 1, 15, 1, NOW + 1, str(leases.version)), "gs", "gangshare-operator"
    )
    clock.t = 1
    assert not a.try_once()
    assert lost == [f"the Lease is held by {OTHER}"]


def test_a_lost_race_is_not_leadership():
    leases, clock, lost = FakeLeases(), Clock(), []
    a = elector(leases, clock, ME, lost)
    stale = lease_of(LeaseRecord(OTHER, NOW - 100, 15, 0, NOW - 100), "gs", "gangshare-operator")
    leases._store(stale)
    real_replace = leases.replace_lease

    def someone_was_faster(namespace: str, name: str, lease: client.V1Lease) -> bool:
        leases.version += 1  # another standby replaced it between our read and our write
        return real_replace(namespace, name, lease)

    leases.replace_lease = someone_was_faster  # type: ignore[method-assign]
    assert not a.try_once() and not a.is_leader() and lost == []


def test_release_hands_the_lease_over_without_waiting():
    leases, clock, lost = FakeLeases(), Clock(), []
    a, b = elector(leases, clock, ME, lost), elector(leases, clock, OTHER, lost)
    assert a.try_once() and not b.try_once()
    a.release()
    assert leases.holder() is None and not a.is_leader()
    clock.t = 0.1
    assert b.try_once()
    a.release()  # not the holder any more: nothing written
    assert leases.holder() == OTHER


@pytest.mark.parametrize("fail_first", [True, False])
def test_a_standby_that_cannot_reach_the_api_server_simply_waits(fail_first):
    leases, clock, lost = FakeLeases(), Clock(), []
    b = elector(leases, clock, OTHER, lost)
    leases.fail = fail_first
    assert b.try_once() is not fail_first
    assert lost == []


def test_the_renew_deadline_counts_from_the_renew_time_written_not_from_a_slow_answer():
    leases, clock, lost = FakeLeases(), Clock(), []
    a = elector(leases, clock, ME, lost)
    slow_get = leases.get_lease

    def slow(namespace: str, name: str) -> client.V1Lease | None:
        clock.t += 4  # the API server takes 4 s to answer
        return slow_get(namespace, name)

    leases.get_lease = slow  # type: ignore[method-assign]
    assert a.try_once()
    # What was written is the attempt's start (to the microsecond), not the answer's time.
    assert record_of(leases.lease).renew_time == pytest.approx(NOW, abs=1e-3)
    # A standby may take over at NOW + 15; this leader stops acting at NOW + 10 already.
    clock.t = RENEW_DEADLINE_SECONDS - 0.1
    assert a.is_leader()
    clock.t = RENEW_DEADLINE_SECONDS
    assert not a.is_leader()
