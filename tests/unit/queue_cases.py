"""Small builders shared by the queue and cohort tests."""

from builders import make_cluster, make_gang, make_node

from gangshare.core import ServiceClass
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import QueueSpec, by_name


def job(key, gpus=1, workers=1, at=0.0, queue="default", priority=0, runtime=None):
    gang = make_gang(key).workers(workers).gpus(gpus).build()
    return QueuedJob(key, gang, at, queue, priority, runtime)


def admitted(result):
    return [a.job.key for a in result.admitted]


def pending(result):
    return {p.job.key: (p.kind, p.reason) for p in result.pending}


def policy(*specs, **settings):
    return QueuePolicy(queues=by_name(specs), **settings)


def cohort(a=8, b=8, **b_limits):
    return policy(
        QueueSpec("a", nominal_gpus=a, cohort="c"),
        QueueSpec("b", nominal_gpus=b, cohort="c", **b_limits),
    )


def borrower(key, gpus=8, queue="b", priority=0, started=0.0):
    return RunningJob(
        key,
        queue,
        gpus,
        ServiceClass.OPPORTUNISTIC,
        borrowed=True,
        priority=priority,
        started_at=started,
    )


def split_islands():
    # Two islands of 4; GPUs 0, 1, 4 and 5 held: 4 GPUs free, but only across islands.
    builder = make_cluster().node(make_node("node-0").gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]))
    for index, gpu in enumerate((0, 1, 4, 5)):
        builder.holding(f"held{index}", "node-0", (gpu,))
    return builder.build()
