"""What the snapshot skips is logged when it first appears, not on every scheduling pass."""

import logging

from gangshare.core.clock import ManualClock
from gangshare.core.queueing import QueuePolicy
from gangshare.operator.scheduler import SchedulerLoop


def test_snapshot_warnings_are_logged_once_per_appearance(caplog):
    loop = SchedulerLoop(None, None, QueuePolicy(), ManualClock())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="gangshare.operator"):
        loop._log_new_warnings(["ns/a: placement on unknown node x"])
        loop._log_new_warnings(["ns/a: placement on unknown node x"])
        loop._log_new_warnings([])
        loop._log_new_warnings(["ns/a: placement on unknown node x", "pod:ns/p: on unknown node y"])
    assert [r.getMessage() for r in caplog.records] == [
        "snapshot: ns/a: placement on unknown node x",
        "snapshot: ns/a: placement on unknown node x",
        "snapshot: pod:ns/p: on unknown node y",
    ]
