"""Prometheus metrics of the extender (label values are documented in each help text)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "gangshare_extender_requests_total",
            "Extender requests by verb (filter, prioritize, bind) and result "
            "(ok; rejected: a 4xx for a malformed request; error: answered with Error set).",
            ["verb", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gangshare_extender_request_duration_seconds",
            "Time to answer one extender request, by verb (filter, prioritize, bind).",
            ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.nodes = Counter(
            "gangshare_extender_filtered_nodes_total",
            "Nodes judged by filter, by outcome (passed; failed: may fit later; "
            "unresolvable: cannot fit whatever is preempted).",
            ["outcome"],
            registry=self.registry,
        )
        # Children looked up once: labels() takes a lock and builds a key on every call, and
        # filter counts three outcomes per request.
        self.filtered = {o: self.nodes.labels(o) for o in ("passed", "failed", "unresolvable")}
        self.cache_nodes = Gauge(
            "gangshare_extender_cache_nodes",
            "GPU nodes in the extender's cache.",
            registry=self.registry,
        )
        self.assumed = Gauge(
            "gangshare_extender_assumed_pods",
            "Pods whose bind is in flight and whose GPUs the cache holds on assumption.",
            registry=self.registry,
        )
