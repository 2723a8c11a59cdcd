"""State checks run after every instant when asked (`--check-invariants`, and in the tests).

Each raises InvariantError naming the GPU or job: O(GPUs + jobs) per instant, so
they are for small replays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gangshare.core.queues import CohortBook
from gangshare.core.verdicts import stale_bounds
from gangshare.sim.decide import borrowed_usage, free_guaranteed_gpus, guaranteed_usage
from gangshare.sim.sharing import share_gpu

if TYPE_CHECKING:
    from gangshare.sim.engine import Simulation


class InvariantError(AssertionError):
    pass


def _fail(message: str) -> None:
    raise InvariantError(message)


def check_kept_bounds(sim: Simulation) -> None:
    """What the cluster keeps of each node across cycles (core/verdicts.py) is what judging it
    afresh gives: every change the replay makes in place was told to the cluster."""
    stale = stale_bounds(sim.cluster)
    if stale:
        _fail(f"nodes {stale[:5]}: kept placement bound differs from a fresh one (no touch)")


def check_gpus(sim: Simulation) -> None:
    """No GPU over-allocated: share slots and memory within limits, no job on a GPU twice; each
    GPU's duty is the coordinator's (its floor while settling) and its speeds are up to date."""
    ledger = sim.ledger
    for gid, gpu in ledger.gpus.items():
        if gpu.guaranteed is not None and not gpu.gpu.healthy:
            _fail(f"GPU {gid}: guaranteed tenant on an unhealthy GPU")
        if len(gpu.opportunistic) > gpu.share_slots:
            _fail(f"GPU {gid}: {len(gpu.opportunistic)} tenants in {gpu.share_slots} share slots")
        owners = [t.owner for t in gpu.tenants()]
        if len(owners) != len(set(owners)):
            _fail(f"GPU {gid}: a job holds it twice: {owners}")
        memory = ledger.share[gid].memory_mib
        if memory > gpu.gpu.memory_mib:
            _fail(f"GPU {gid}: {memory} MiB in use of {gpu.gpu.memory_mib}")
        guaranteed, opportunistic = ledger.tenants(gid)
        if gid in ledger.settling:
            duty = ledger.coordinator.params.floor_duty
        else:
            g = None if guaranteed is None else guaranteed[1]
            duty = ledger.coordinator.duty(g, [w for _, w in opportunistic])
        if ledger.duty[gid] != duty:
            _fail(f"GPU {gid}: duty {ledger.duty[gid]}, the coordinator's is {duty}")
        expected = share_gpu(guaranteed, opportunistic, duty, ledger.model)
        if expected != ledger.share[gid]:
            _fail(f"GPU {gid}: ledger is stale: {ledger.share[gid]} != {expected}")


def check_books(sim: Simulation) -> None:
    """The engine's running counts agree with the cluster and the running jobs."""
    if sim.free_gpus != free_guaranteed_gpus(sim.cluster):
        _fail(f"free GPUs: tracked {sim.free_gpus}, cluster {free_guaranteed_gpus(sim.cluster)}")
    usage = {q: n for q, n in sim.usage.items() if n}
    if usage != guaranteed_usage(list(sim.running.values())):
        _fail(f"quota usage: tracked {usage}")
    ledger = sim.ledger
    busy = sum(1 for gpu in ledger.gpus.values() if gpu.tenants())
    slots = sum(len(gpu.opportunistic) for gpu in ledger.gpus.values())
    held = sum(1 for gpu in ledger.gpus.values() if gpu.guaranteed is not None)
    beside = sum(len(g.opportunistic) for g in ledger.gpus.values() if g.guaranteed is not None)
    tracked = (ledger.busy, ledger.slots_used, ledger.guaranteed, ledger.beside)
    if tracked != (busy, slots, held, beside):
        _fail(f"ledger totals: tracked {tracked}, counted {(busy, slots, held, beside)}")
    speed = sum(
        ledger.share[gid].speeds[t.owner]
        for gid, g in ledger.gpus.items()
        if g.guaranteed is not None
        for t in g.opportunistic
    )
    if abs(ledger.beside_speed - speed) > 1e-6 * max(1.0, speed):
        _fail(f"opportunistic speed beside guaranteed jobs: tracked {ledger.beside_speed}, {speed}")
    for key, job in sim.running.items():
        placed = sorted((a.node, g) for a in sim.cluster.allocations_of(key) for g in a.gpu_indices)
        if placed != sorted(sim.jobs[key].gpus) or len(placed) != job.gpus:
            _fail(f"job {key}: holds {placed}, expected {job.gpus} GPU(s)")
    for key in sim.cluster.owners():
        if key not in sim.running:
            _fail(f"job {key}: holds GPUs but is not running")


def check_quotas(sim: Simulation) -> None:
    """Guaranteed GPUs per queue within its quota; every cohort lends at least what its
    queues borrow (after the instant's reclaims) unless none of its borrowers may be
    reclaimed yet (minimum run time, eviction cap); only cohort queues borrow."""
    policy = sim.queue_policy
    guaranteed = guaranteed_usage(list(sim.running.values()))
    for queue, quota in policy.quota_map().items():
        if guaranteed.get(queue, 0) > quota:
            _fail(f"queue {queue}: {guaranteed[queue]} guaranteed GPUs over its quota of {quota}")
    borrowed = borrowed_usage(list(sim.running.values()))
    if {q: n for q, n in sim.borrowed.items() if n} != borrowed:
        _fail(f"borrowed GPUs: tracked {sim.borrowed}, running {borrowed}")
    book = CohortBook(policy.queues, guaranteed, borrowed)
    for queue in borrowed:
        spec = policy.queues.get(queue)
        if spec is None or spec.cohort is None:
            _fail(f"queue {queue} borrows {borrowed[queue]} GPUs but is in no cohort")
        elif spec.borrowing_limit is not None and borrowed[queue] > spec.borrowing_limit:
            _fail(f"queue {queue} borrows {borrowed[queue]} of at most {spec.borrowing_limit}")
    for cohort in sorted({s.cohort for s in policy.queues.values() if s.cohort is not None}):
        if book.borrowed_in(cohort) <= book.lent(cohort):
            continue
        members = {q.name for q in book.members(cohort)}
        reclaimable = sorted(
            j.key
            for j in sim.running.values()
            if j.borrowed and j.queue in members and policy.reclaimable(j, sim.clock.now())
        )
        if reclaimable:
            _fail(
                f"cohort {cohort}: borrowers hold {book.borrowed_in(cohort)} GPUs, "
                f"its queues lend {book.lent(cohort)}, and {', '.join(reclaimable)} "
                "could be reclaimed"
            )


def check_progress(sim: Simulation) -> None:
    """A running job's work: its checkpoint <= what it has done <= its solo duration; a run
    restarts only after an eviction."""
    for key in sim.running:
        job = sim.jobs[key]
        if not -1e-6 <= job.saved <= job.done + 1e-6:
            _fail(f"job {key}: checkpointed {job.saved} s of work, has done {job.done} s")
        if job.done > job.spec.trace.duration + 1e-6:
            _fail(f"job {key}: has done {job.done} s of {job.spec.trace.duration} s")
        if job.resume_at > job.start and not job.evictions:
            _fail(f"job {key}: restarts, but was never evicted")


def check_state(sim: Simulation) -> None:
    check_gpus(sim)
    check_kept_bounds(sim)
    check_books(sim)
    check_quotas(sim)
    check_progress(sim)
