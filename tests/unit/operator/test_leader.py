"""Leader election: the pure Lease rule, and the elector against an in-memory Lease store."""

from __future__ import annotations

import pytest
from kubernetes import client
from lease_fakes import NOW, Clock, FakeLeases, elector

from gangshare.operator.leader import (
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RENEW_INTERVAL_SECONDS,
    RETRY_INTERVAL_SECONDS,
    Decision,
    LeaseRecord,
    decide,
    lease_of,
    next_record,
    record_of,
)

ME, OTHER = "op-a-123456", "op-b-654321"
HOUR = 3600.0


# ----- the pure rule ----------------------------------------------------------------------------


def test_a_missing_lease_is_created():
    assert decide(None, ME, 0.0) is Decision.CREATE


def test_our_own_lease_is_renewed_however_long_unchanged():
    assert decide(LeaseRecord(ME, NOW - 1), ME, 1.0) is Decision.RENEW
    assert decide(LeaseRecord(ME, NOW - 100), ME, 100.0) is Decision.RENEW


def test_a_lease_of_someone_else_is_waited_on_until_unchanged_for_its_duration():
    assert decide(LeaseRecord(OTHER, NOW), ME, 0.0) is Decision.WAIT
    # Exactly a duration unchanged it is still theirs: taken only once strictly past it.
    assert decide(LeaseRecord(OTHER, NOW), ME, LEASE_DURATION_SECONDS) is Decision.WAIT
    assert decide(LeaseRecord(OTHER, NOW), ME, LEASE_DURATION_SECONDS + 0.001) is Decision.TAKE
    # The holder's renewTime does not enter: long past or far ahead, only our observation counts.
    assert decide(LeaseRecord(OTHER, NOW - HOUR), ME, 1.0) is Decision.WAIT
    assert decide(LeaseRecord(OTHER, None), ME, 1.0) is Decision.WAIT
    assert decide(LeaseRecord(OTHER, NOW + HOUR), ME, 16.0) is Decision.TAKE


def test_a_free_lease_is_taken_at_once_and_the_holders_duration_counts():
    assert decide(LeaseRecord(None, NOW), ME, 0.0) is Decision.TAKE  # released
    assert decide(LeaseRecord(OTHER, NOW, duration_seconds=1), ME, 1.5) is Decision.TAKE


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
    assert decide(released, OTHER, 0.0) is Decision.TAKE


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
    # a dies (no more renewals): b takes over only once 15 s have passed, on its own clock,
    # since it saw the last renewal.
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
    assert not a.try_once()  # first seen now: a whole duration of our own to wait
    real_replace = leases.replace_lease

    def someone_was_faster(namespace: str, name: str, lease: client.V1Lease) -> bool:
        leases.version += 1  # another standby replaced it between our read and our write
        return real_replace(namespace, name, lease)

    leases.replace_lease = someone_was_faster  # type: ignore[method-assign]
    clock.t = LEASE_DURATION_SECONDS + 0.5
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


# ----- the standby's own clock: no wall clock of another replica enters ---------------------------


def take_over_time(
    holder_skew: float, holder_renews_until: float, until: float = 60.0
) -> float | None:
    """Two replicas, each trying as its loop would (the holder renews every 5 s until it dies,
    the standby tries every 2 s); when the standby first leads, on the shared monotonic time."""
    leases, clock, lost = FakeLeases(), Clock(), []
    holder = elector(leases, clock, ME, lost, skew=holder_skew)
    standby = elector(leases, clock, OTHER, lost)
    assert holder.try_once()
    renewed, tried = 0.0, -RETRY_INTERVAL_SECONDS
    while clock.t < until:
        clock.t = round(clock.t + 0.25, 2)
        if clock.t <= holder_renews_until and clock.t - renewed >= RENEW_INTERVAL_SECONDS:
            renewed = clock.t
            assert holder.try_once()
        if clock.t - tried >= RETRY_INTERVAL_SECONDS:
            tried = clock.t
            if standby.try_once():
                return clock.t
    return None


@pytest.mark.parametrize("skew", [-HOUR, -12.0, 12.0, HOUR])
def test_a_standby_never_takes_over_a_holder_that_keeps_renewing_whatever_its_clock_says(skew):
    # A holder whose clock is behind writes renewTimes that look long expired (the old rule
    # took over at once from a live leader); one ahead writes renewTimes far in the future.
    assert take_over_time(skew, holder_renews_until=60.0) is None


@pytest.mark.parametrize("skew", [-HOUR, -12.0, 0.0, 12.0, HOUR])
def test_a_standby_takes_over_a_dead_holder_one_duration_after_it_saw_the_last_renewal(skew):
    # The holder's last renewal is at 20 s: the standby sees it at 20 s (its tries are every
    # 2 s) and takes over at its first try past 35 s, whatever renewTime the holder wrote.
    taken = take_over_time(skew, holder_renews_until=20.0)
    assert taken is not None
    assert 20.0 + LEASE_DURATION_SECONDS < taken <= 20.0 + LEASE_DURATION_SECONDS + 2.0


def test_a_standby_started_beside_a_stale_lease_waits_a_whole_duration_of_its_own():
    # The holder may be alive with a clock far behind: nothing says otherwise before a whole
    # duration has passed here without a change.
    leases, clock, lost = FakeLeases(), Clock(), []
    stale = lease_of(LeaseRecord(OTHER, NOW - HOUR, 15, 3, NOW - HOUR), "gs", "gangshare-operator")
    leases._store(stale)
    standby = elector(leases, clock, ME, lost)
    for t in (0.0, 5.0, 10.0, LEASE_DURATION_SECONDS):
        clock.t = t
        assert not standby.try_once(), t
    # A change of the record (any write of its holder's, a renewal) restarts the wait.
    leases._store(
        lease_of(LeaseRecord(OTHER, NOW - HOUR + 1, 15, 3, NOW - HOUR), "gs", "gangshare-operator")
    )
    clock.t = LEASE_DURATION_SECONDS + 1
    assert not standby.try_once()
    clock.t = 2 * LEASE_DURATION_SECONDS + 1
    assert not standby.try_once()
    clock.t += 0.5
    assert standby.try_once()
    assert record_of(leases.lease).transitions == 4
