"""One real kubelet node per machine: its device-plugin socket path is fixed, whatever
--root-dir says. A lock file names the node folder that owns the machine's kubelet paths."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gangshare.dev import processes
from gangshare.dev.realnode_config import NodeLayout, RealNodeState

LOCK = Path("/run/gangshare/real-node.lock")
# Held only while reading or changing LOCK, so two processes never both take it.
GUARD = LOCK.with_suffix(".guard")


@dataclass
class Holder:
    root: Path
    owner: int
    # Its owner (the process that ran `up`), kubelet or containerd still runs; a holder that
    # is not live crashed without `down` and left its node's leftovers on the host.
    live: bool


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    GUARD.parent.mkdir(parents=True, exist_ok=True)
    with GUARD.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def holder() -> Holder | None:
    """Who holds the lock, if anyone; call under `guarded()`."""
    try:
        recorded = json.loads(LOCK.read_text())
        root, owner = Path(recorded["root"]), int(recorded["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    pids = [owner]
    with contextlib.suppress(OSError, ValueError, TypeError):
        pids += RealNodeState.load(NodeLayout(root).state).pids.values()
    # Our own process only holds it through the node's children: a node whose `down` failed
    # in this process must not block a retry here forever.
    live = any(
        pid > 0 and pid != os.getpid() and processes.Child("", pid, Path()).alive() for pid in pids
    )
    return Holder(root, owner, live)


def take(root: Path) -> None:
    LOCK.write_text(json.dumps({"root": str(root), "owner": os.getpid()}))


def release() -> None:
    LOCK.unlink(missing_ok=True)
