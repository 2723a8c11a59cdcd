"""The reclaim scenario every queued kind is put through: a gang runs on its cohort's idle quota,
the lender's own job arrives, the gang is reclaimed whole (suspended and requeued, keeping its
place) and resumed whole once there is room again."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, phase_is, status, trainingjob


def reclaimed_and_resumed(
    crd: Kube,
    pool: NodePool,
    namespace: str,
    tmp_path: Path,
    queues: Any,
    submit: Callable[[str], None],
    record: str,
    suspended: Callable[[], bool] | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Run the scenario for the gang `submit(queue)` creates, queued as TrainingJob `record`;
    `suspended` says whether its object was suspended by the reclaim. Returns the record's
    final status and the pods of its last attempt."""
    pool.nodes(1, 8)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=8, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        submit(borrower)
        running = eventually(
            lambda: phase_is(crd, namespace, record, "Running"),
            timeout=90,
            what="the gang running on its cohort's idle quota",
        )
        assert running["borrowed"] is True
        create(
            crd,
            namespace,
            trainingjob("lender-job", 1, 8, run_for="2s", queue=lender, gpuModel=pool.model),
        )
        eventually(
            lambda: (status(crd, namespace, record).get("preemptions") or 0) >= 1 or None,
            timeout=60,
            what="the gang reclaimed and requeued",
        )
        if suspended is not None:
            eventually(lambda: suspended() or None, timeout=30, what="its object suspended")
        # The borrower's pods go first, through every controller between its object and
        # them (a TrainJob's: Trainer, JobSet, the Job controller), on busy cores.
        assert eventually(
            lambda: phase_is(crd, namespace, "lender-job", "Running", "Succeeded"),
            timeout=120,
            what="the lender's job started on its own quota",
        )
        done = eventually(
            lambda: phase_is(crd, namespace, record, "Succeeded", "Failed"),
            timeout=150,
            what="the gang resumed and finished",
        )
        assert done["phase"] == "Succeeded" and done["attempt"] >= 1, done
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector=f"gangshare.io/job={record}"
        ).items
        last = [
            p for p in pods if p.metadata.labels.get("gangshare.io/attempt") == str(done["attempt"])
        ]
        return done, last
    finally:
        operator.stop()
