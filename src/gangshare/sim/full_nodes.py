"""GPUs free for guaranteed work on the nodes pinned gangs can run on, and those gangs' shapes.

Jobs alike (sim/pinned_lanes.py: shape, nodes, GPUs, priorities, estimate) pinned to nodes
with F GPUs free for guaranteed work, each needing G: a cycle admits at most F // G of
them, since admissions only take GPUs, so one of the first F // G + 1 is refused. Every job
alike behind a refused one is refused too, and changes nothing:
- refused by backfill, it is refused again, as reservations only grow in a cycle;
- refused a place, it finds no place again, as its nodes only fill and its topology is as
  strict (jobs alike stand in a lane in the order they came, so it waited no longer); the
  reservation it asks for is the one its refused elder asked for, or one no earlier and
  with no more to spare, as what was admitted since took GPUs from both alike
  (core/backfill.dominated).
PendingIndex.candidates hands a cycle only those first F // G + 1.
"""

from __future__ import annotations

from gangshare.core import Cluster
from gangshare.core.held import nodes_for
from gangshare.core.job import GangRequest
from gangshare.core.queueing import QueuedJob


class FullNodes:
    """GPUs free for guaranteed work on the nodes gangs are pinned to, in this cycle, and each
    gang's nodes and shape there (what PendingIndex.candidates needs to leave out repeats)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._free_on: dict[frozenset[str], int] = {}

    @property
    def generation(self) -> int:
        """What `where` answered holds while this stands."""
        return self.cluster.static_generation

    def where(self, gang: GangRequest) -> tuple[frozenset[str] | None, object]:
        """The nodes the gang can run on (None: every node), and a token of its shape there
        (one object per nodes and shape while the nodes stand)."""
        cluster = self.cluster
        return cluster.kept_for(
            "full-nodes", gang, lambda: (nodes_for(cluster, gang), _shape_token(cluster, gang))
        )

    def holds_back(self, job: QueuedJob) -> bool:
        """Whether the job can run only on nodes with fewer GPUs free for guaranteed work
        than it needs."""
        nodes, _ = self.where(job.gang)
        return nodes is not None and self.free(nodes) < job.gpus

    def free(self, nodes: frozenset[str]) -> int:
        """GPUs free for guaranteed work on these nodes, as the cycle starts."""
        free = self._free_on.get(nodes)
        if free is None:
            nodes_of = self.cluster.nodes
            free = self._free_on[nodes] = sum(nodes_of[n].free_guaranteed for n in nodes)
        return free


def _shape_token(cluster: Cluster, gang: GangRequest) -> object:
    # All that never_fits and the planner see of the gang, and where it may run.
    key = ("full-nodes-shape", nodes_for(cluster, gang), gang.whole_gpus, *gang.fit_shape)
    return cluster.kept_while_nodes_stand(key, object)
