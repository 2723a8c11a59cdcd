"""An in-memory Lease store and a clock pair for leader election tests."""

from __future__ import annotations

from kubernetes import client

from gangshare.operator.leader import LeaderElector, record_of

NOW = 1_800_000_000.0


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


def elector(
    leases: FakeLeases, clock: Clock, identity: str, lost: list[str], skew: float = 0.0
) -> LeaderElector:
    """`skew`: how far this replica's wall clock is ahead of the others' (behind if < 0)."""
    return LeaderElector(
        leases,
        "gs",
        "gangshare-operator",
        identity,
        lost.append,
        lambda: clock.wall() + skew,
        clock.mono,
    )
