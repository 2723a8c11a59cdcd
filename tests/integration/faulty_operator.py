"""`gangshare operator` with faults injected from the outside, for tests only.

Fault injection stays out of the production code path: this launcher patches the
real operator in its own process, then runs the real command line.

    python tests/integration/faulty_operator.py [--pod-create-delay S] [--hang-after-passes N]
        -- operator --kubeconfig ... (the usual arguments)
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pod-create-delay", type=float, default=0.0)
    parser.add_argument("--hang-after-passes", type=int, default=None)
    faults, rest = parser.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]

    from gangshare import cli
    from gangshare.operator import kubeapi, scheduler

    if faults.pod_create_delay:
        create = kubeapi.KubeApi.create
        # One pod at a time (the operator creates a gang's pods side by side): a test that
        # kills it "between two workers" needs the window. The wait comes before each pod
        # appears: an admitted gang has no pod for that long (a one-worker gang's pod is made
        # ungated, so a wait after it would leave no unstarted gang to race).
        one_at_a_time = threading.Lock()

        def slow_create(self: Any, kind: str, namespace: str, body: dict[str, Any]) -> bool:
            if kind != "Pod":
                return create(self, kind, namespace, body)
            with one_at_a_time:
                time.sleep(faults.pod_create_delay)
                return bool(create(self, kind, namespace, body))

        kubeapi.KubeApi.create = slow_create  # type: ignore[method-assign]

    if faults.hang_after_passes is not None:
        cycle = scheduler.schedule_cycle
        passes = iter(range(10**9))
        forever = threading.Event()

        def hanging_cycle(*args: Any, **kwargs: Any) -> Any:
            if next(passes) >= faults.hang_after_passes:
                forever.wait()  # a scheduling loop stuck for good
            return cycle(*args, **kwargs)

        scheduler.schedule_cycle = hanging_cycle  # type: ignore[assignment]

    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main())
