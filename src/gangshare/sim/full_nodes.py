"""Nodes with no GPU free for guaranteed work, and the gangs that can run only there.

A guaranteed job that can run only on such nodes is refused in this cycle, and nothing the
cycle admits changes what those nodes hold (only guaranteed work counts, and none fits
there): PendingIndex.candidates uses it to hand a cycle only the first of such jobs alike.
"""

from __future__ import annotations

from gangshare.core import Cluster
from gangshare.core.held import nodes_for
from gangshare.core.job import GangRequest
from gangshare.core.queueing import QueuedJob


class FullNodes:
    """Which nodes have no GPU free for guaranteed work in this cycle, and each gang's nodes
    and shape there (what PendingIndex.candidates needs to leave out repeats)."""

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
        return nodes is not None and self._free(nodes) < job.gpus

    def full(self, nodes: frozenset[str]) -> bool:
        return self._free(nodes) == 0

    def _free(self, nodes: frozenset[str]) -> int:
        free = self._free_on.get(nodes)
        if free is None:
            nodes_of = self.cluster.nodes
            free = self._free_on[nodes] = sum(nodes_of[n].free_guaranteed for n in nodes)
        return free


def _shape_token(cluster: Cluster, gang: GangRequest) -> object:
    # All that never_fits and the planner see of the gang, and where it may run.
    key = ("full-nodes-shape", nodes_for(cluster, gang), gang.whole_gpus, *gang.fit_shape)
    return cluster.kept_while_nodes_stand(key, object)
