"""Every node's filter verdict and score for one request shape, kept current between requests.

kube-scheduler names thousands of nodes in every filter call, and between two pods only
the nodes of the last binds have changed. Judging each named node again, even through a
per-node memo, cost a Python loop per name per request (3 ms on 5,000 nodes, and a tuple
per node per request for the garbage collector). Here the verdicts of *all* nodes are kept
for a request shape, keyed by node name in the form a filter answer needs (a rank per
node: its score, or a mark for failed and unresolvable; the reasons apart), and brought up
to date before each answer by judging only the nodes whose version moved. What remains per
request is done in C: reading every node's version, one dict lookup per name, a few
identity scans of the answer's ranks, and a scan of the names that stops at the first
MAX_BEST_NODES of the best score. The answer is the name-by-name one (decisions.py), order
included; test_verdicts.py checks that through random changes.

Staleness: a node's `version` comes from one process-wide counter and is bumped by every
change to the node (core.node.NodeState.recount), so equal version lists mean the same
nodes, in the same order, in the same state; a position whose version differs holds a
node that is judged again. Nothing else is trusted: not the cluster object, not the
ledger's own bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from itertools import compress, islice, repeat
from json.encoder import encode_basestring_ascii
from operator import is_

from gangshare.core.cluster import Cluster
from gangshare.core.fit import filter_worker
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.core.score import score_worker, to_extender_score
from gangshare.extender.decisions import MAX_BEST_NODES, NOT_A_GPU_NODE, TIE

# A node that did not pass ranks below every score, as one of three objects told apart by
# identity (operator.is_ in C, where a dict lookup per name cost three times as much). A name
# gangshare does not know reads as MISSING: a NaN, found by identity and equal to no score,
# then ranks as UNKNOWN.
FAILED = float("-inf")
UNRESOLVABLE = float("-inf")
UNKNOWN = float("-inf")
MISSING = float("nan")
SLICE = 128


@dataclass(frozen=True)
class FilterAnswer:
    best: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    passed: int


class ShapeVerdicts:
    """The verdicts of every node of a cluster for one WorkerRequest (call with the cache's
    lock held: `refresh` and the answers read nodes the watches change)."""

    def __init__(self, request: WorkerRequest) -> None:
        self.request = request
        # The cluster's node versions, in its order, as of the last refresh.
        self._versions: list[int] = []
        # name -> the version its verdict below was judged at.
        self._judged: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        # name -> score of every judged node; FAILED or UNRESOLVABLE for one that did not pass.
        self.rank: dict[str, float] = {}
        # name -> its HostPriority entry as JSON, for prioritize.
        self.priority: dict[str, str] = {}

    def refresh(self, cluster: Cluster) -> int:
        """Judge again the nodes that changed since the last refresh; returns how many."""
        nodes = cluster.nodes
        versions = [node.version for node in nodes.values()]
        old = self._versions
        if versions == old:
            return 0
        judged, count = self._judged, 0
        for node in _moved(nodes.values(), versions, old):
            if judged.get(node.name) != node.version:
                self._judge(node)
                count += 1
        self._versions = versions
        if len(judged) != len(nodes):
            for name in [name for name in judged if name not in nodes]:
                self._drop(name)
        return count

    def _judge(self, node: NodeState) -> None:
        name = node.name
        self.failed.pop(name, None)
        self.unresolvable.pop(name, None)
        rejection = filter_worker(node, self.request)
        score = score_worker(node, self.request)
        if rejection is None:
            self.rank[name] = score
        else:
            if rejection.resolvable:
                self.rank[name], self.failed[name] = FAILED, rejection.reason
            else:
                self.rank[name], self.unresolvable[name] = UNRESOLVABLE, rejection.reason
        self.priority[name] = _priority_entry(name, to_extender_score(score))
        self._judged[name] = node.version

    def _drop(self, name: str) -> None:
        for table in (self._judged, self.failed, self.unresolvable, self.rank, self.priority):
            table.pop(name, None)

    def filter(self, names: list[str]) -> FilterAnswer:
        """Filter's answer for these names (refresh first): what filter_nodes and best_nodes
        answer, name for name, in C-level passes over the names (no Python loop per name)."""
        ranks = list(map(self.rank.get, names, repeat(MISSING)))
        unknown: list[str] = []
        if MISSING in ranks:
            unknown = list(compress(names, map(is_, ranks, repeat(MISSING))))
            ranks = [UNKNOWN if r is MISSING else r for r in ranks]
        failing = _marked(names, ranks, FAILED) if self.failed else []
        hopeless = _marked(names, ranks, UNRESOLVABLE) if self.unresolvable else []
        unresolvable = dict.fromkeys(unknown, NOT_A_GPU_NODE)
        unresolvable.update(
            zip(hopeless, map(self.unresolvable.__getitem__, hopeless), strict=True)
        )
        failed = dict(zip(failing, map(self.failed.__getitem__, failing), strict=True))
        # Counted as filter_nodes counts: a repeated name (kube-scheduler sends none) twice.
        passed = len(names) - len(unknown) - len(failing) - len(hopeless)
        if not passed:
            return FilterAnswer([], failed, unresolvable, 0)
        good = map((max(ranks) - TIE).__le__, ranks)
        best = list(islice(compress(names, good), MAX_BEST_NODES))
        return FilterAnswer(best, failed, unresolvable, passed)

    def priorities(self, names: list[str]) -> bytes:
        """Prioritize's HostPriorityList as JSON (refresh first); unknown nodes score 0."""
        entries = self.priority
        try:
            parts = list(map(entries.__getitem__, names))
        except KeyError:
            parts = [entries.get(n) or _priority_entry(n, 0) for n in names]
        return ("[" + ",".join(parts) + "]").encode()


def _moved(nodes: Collection[NodeState], versions: list[int], old: list[int]) -> list[NodeState]:
    """The nodes at positions whose version differs from `old` (every node when the count
    changed). An unchanged node's version is the very int object read last time, so equal
    slices compare in C at a pointer comparison a node; a call per node cost four times as
    much, and only the slices that differ are looked at one by one."""
    if len(versions) != len(old):
        return list(nodes)
    moved: list[NodeState] = []
    indexed: list[NodeState] | None = None
    for start in range(0, len(versions), SLICE):
        end = min(start + SLICE, len(versions))
        if versions[start:end] != old[start:end]:
            indexed = list(nodes) if indexed is None else indexed
            moved.extend(indexed[i] for i in range(start, end) if versions[i] != old[i])
    return moved


def _marked(names: list[str], ranks: list[float], mark: float) -> list[str]:
    """The names whose rank is `mark` itself (not merely equal to it), in the names' order."""
    return list(compress(names, map(is_, ranks, repeat(mark))))


def _priority_entry(host: str, score: int) -> str:
    return f'{{"Host":{encode_basestring_ascii(host)},"Score":{score}}}'


class Verdicts:
    """ShapeVerdicts per request shape, the most recently used kept (call with the lock held)."""

    MAX_SHAPES = 16

    def __init__(self) -> None:
        self._shapes: OrderedDict[WorkerRequest, ShapeVerdicts] = OrderedDict()

    def current(self, cluster: Cluster, request: WorkerRequest) -> ShapeVerdicts:
        """The verdicts for `request`, refreshed against `cluster` now."""
        shape = self._shapes.get(request)
        if shape is None:
            shape = self._shapes[request] = ShapeVerdicts(request)
            while len(self._shapes) > self.MAX_SHAPES:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(request)
        shape.refresh(cluster)
        return shape
