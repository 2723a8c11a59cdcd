"""Two operator replicas on one Lease: one acts, the other takes over when it dies."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.operator.leader import LEASE_DURATION_SECONDS, RETRY_INTERVAL_SECONDS
from kube import Kube, OperatorProcess, eventually
from tj import create, job_pods, partial_gangs, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
H100 = "NVIDIA-H100-80GB-HBM3"


def holder(kube: Kube, namespace: str, lease: str) -> str | None:
    try:
        found = client.CoordinationV1Api(kube.api_client).read_namespaced_lease(lease, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return found.spec.holder_identity or None


def identity(operator: OperatorProcess) -> str | None:
    found = re.search(r"leader election on Lease \S+ as (\S+)", operator.logs())
    return found.group(1) if found else None


def metric(operator: OperatorProcess, line_start: str) -> float | None:
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return None


def events_of(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    # Raw JSON: kube-scheduler's events in the namespace have no eventTime, which the client's
    # model refuses.
    response = client.EventsV1Api(kube.api_client).list_namespaced_event(
        namespace, _preload_content=False
    )
    events: list[dict[str, Any]] = json.loads(response.data)["items"]
    return [e for e in events if (e.get("regarding") or {}).get("name") == job]


def test_a_standby_takes_over_a_killed_leader_mid_admission_and_duplicates_nothing(
    crd: Kube, namespace: str, tmp_path: Path
):
    lease = f"gangshare-operator-{uuid.uuid4().hex[:6]}"
    flags = ("--leader-elect", "--lease-name", lease, "--lease-namespace", namespace)
    # Slow pod creation, so the kill lands between the two workers of the gang.
    slow = ("--pod-create-delay", "1.0")
    replicas = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        replicas.append(OperatorProcess(crd, tmp_path / name, *flags, faults=slow))
    first, second, third = replicas

    def both_identities() -> tuple[str, str] | None:
        one, two = identity(first), identity(second)
        return (one, two) if one and two else None

    try:
        first.start()
        second.start()
        ids = eventually(both_identities, what="both replicas started")
        leader_id = eventually(lambda: holder(crd, namespace, lease), what="a leader")
        assert leader_id in ids
        leader, standby = (first, second) if leader_id == ids[0] else (second, first)
        standby_id = identity(standby)
        eventually(lambda: "standby" in standby.logs(), what="the standby waiting")
        eventually(lambda: metric(standby, "gangshare_operator_leader ") == 0, what="standby 0")
        assert metric(leader, "gangshare_operator_leader ") == 1

        create(crd, namespace, trainingjob("gang", 2, 4, run_for="2s", gpuModel=H100))
        eventually(
            lambda: len(job_pods(crd, namespace, "gang")) == 1,
            timeout=60,
            interval=0.05,
            what="the gang half created",
        )
        leader.kill()
        killed_at = time.time()
        assert partial_gangs(crd, namespace, {"gang": 2}) == []
        seen: dict[str, str] = {}

        def watch_pods() -> None:
            names = [p.metadata.name for p in job_pods(crd, namespace, "gang")]
            assert len(names) <= 2 and len(set(names)) == len(names), names
            seen.update({p.metadata.uid: p.metadata.name for p in job_pods(crd, namespace, "gang")})
            assert partial_gangs(crd, namespace, {"gang": 2}) == []

        # The standby takes the Lease once the killed leader's renewal has expired.
        deadline = killed_at + LEASE_DURATION_SECONDS + RETRY_INTERVAL_SECONDS + 5
        while holder(crd, namespace, lease) != standby_id:
            watch_pods()
            assert time.time() < deadline, f"no takeover: {standby.logs()[-3000:]}"
            time.sleep(0.1)
        took_over_after = time.time() - killed_at

        end = time.monotonic() + 90
        while not phase_is(crd, namespace, "gang", "Succeeded", "Failed"):
            watch_pods()
            assert time.monotonic() < end, standby.logs()[-4000:]
            time.sleep(0.1)
        watch_pods()
        done = status(crd, namespace, "gang")
        assert done["phase"] == "Succeeded", done
        # The new leader finished the half-created gang: no pod made twice, no restart.
        assert sorted(seen.values()) == ["gang-worker-0", "gang-worker-1"], seen
        assert (done["attempt"], done["restarts"]) == (0, 0)
        events = events_of(crd, namespace, "gang")
        reasons = [e["reason"] for e in events]
        # Admitted once, at its first turn (its condition says it, no event: #39), never
        # released and admitted again, and committed once.
        assert reasons.count("GangScheduled") == 1, reasons
        assert not {"Admitted", "Requeued"} & set(reasons), reasons
        assert {e["reportingInstance"] for e in events} <= {leader_id, standby_id}
        # The standby acted on nothing while it waited.
        early = [
            e["reason"]
            for e in events
            if e["reportingInstance"] == standby_id and _at(e.get("eventTime")) < killed_at
        ]
        assert early == []
        assert metric(standby, "gangshare_operator_leader ") == 1
        succeeded = 'gangshare_trainingjobs{kind="TrainingJob",phase="Succeeded",queue="default",'
        eventually(
            lambda: (metric(standby, succeeded) or 0) >= 1,
            what="the new leader's metrics see the job finished",
        )

        # A graceful stop hands the Lease over at once, not after its 15 s.
        third.start()
        eventually(lambda: "standby" in third.logs(), what="a new standby waiting")
        stopped = time.monotonic()
        standby.stop()
        eventually(
            lambda: holder(crd, namespace, lease) == identity(third),
            timeout=LEASE_DURATION_SECONDS,
            interval=0.1,
            what="the Lease handed over",
        )
        handed_over = time.monotonic() - stopped
        assert "Lease " in standby.logs() and "released" in standby.logs()
        print(f"takeover after a kill: {took_over_after:.1f}s; after a stop: {handed_over:.1f}s")
        assert handed_over < LEASE_DURATION_SECONDS - 5
        for operator in replicas:
            assert "scheduling pass failed" not in operator.logs()
    finally:
        for operator in replicas:
            operator.stop()


def _at(value: str | None) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0
