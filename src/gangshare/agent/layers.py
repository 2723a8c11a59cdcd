"""Which enforcement layers this node has, found once at start and published on the Node.

1. sdk: the agent serves the SDK socket that Allocate mounts (cooperative caps);
2. mps: a CUDA MPS control daemon's pipe folder exists (static per-client limits at start);
3. stopContinue: the agent may signal other users' processes (root or CAP_KILL), so it can
   duty-cycle a pod that ignores its caps;
4. eviction: always, through the API server's Eviction API.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# The capability bit of CAP_KILL in /proc/self/status's CapEff mask.
CAP_KILL = 5


@dataclass(frozen=True)
class Layers:
    sdk: bool
    mps: bool
    stop_continue: bool
    eviction: bool = True

    def annotation(self) -> str:
        return json.dumps(
            {
                "sdk": self.sdk,
                "mps": self.mps,
                "stopContinue": self.stop_continue,
                "eviction": self.eviction,
            },
            separators=(",", ":"),
        )


def detect_layers(socket_dir: Path | None, mps_pipe_dir: Path | None) -> Layers:
    mps = mps_pipe_dir is not None and (mps_pipe_dir / "control").exists()
    return Layers(sdk=socket_dir is not None, mps=mps, stop_continue=_may_signal_others())


def _may_signal_others() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << CAP_KILL))
    except (OSError, ValueError, IndexError):
        pass
    return False
