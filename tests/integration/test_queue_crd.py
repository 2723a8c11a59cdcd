"""The Queue CRD (crds/queue.yaml) in the real API server: schema and CEL refusals name the
field (the same field the operator's own parser names), defaults, and what `kubectl get queues`
prints, and when a TrainingJob may change queue. No operator runs here: these are the API
server's answers alone.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gangshare.kube.queue import (
    API_VERSION,
    GROUP,
    QUEUE_KIND,
    QUEUE_PLURAL,
    VERSION,
    InvalidSpec,
    parse_queue,
)
from kube import Kube
from tj import trainingjob

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def queue(name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": QUEUE_KIND,
        "metadata": {"name": name},
    }
    if spec is not None:
        body["spec"] = spec
    return body


def kubectl(kube: Kube, *args: str, body: Any = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        kube.kubectl(*args),
        input=None if body is None else yaml.safe_dump(body),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def queues(crd: Kube) -> Iterator[Callable[[str], str]]:
    """Queue names unique to the test (Queues are cluster-scoped); whatever was made is deleted."""
    suffix = uuid.uuid4().hex[:6]
    names: list[str] = []

    def name(stem: str) -> str:
        names.append(f"{stem}-{suffix}")
        return names[-1]

    yield name
    for made in names:
        kubectl(crd, "delete", "queue", made, "--ignore-not-found", "--wait=false")


@pytest.mark.parametrize(
    ("name", "spec", "field"),
    [
        ("team.a", {}, "metadata.name: must be a DNS-1123 label"),
        ("q", {"nominalGPUs": -1}, "spec.nominalGPUs"),
        ("q", {"nominalGPUs": "8"}, "spec.nominalGPUs"),
        ("q", {"weight": 0}, "spec.weight"),
        ("q", {"cohort": "Research"}, "spec.cohort"),
        ("q", {"ordering": "fifo"}, "spec.ordering"),
        ("q", {"backfill": "yes"}, "spec.backfill"),
        ("q", {"maxPriority": 2000000}, "spec.maxPriority"),
        ("q", {"defaultRuntimeSeconds": 0}, "spec.defaultRuntimeSeconds"),
        ("q", {"jobSizes": {"minGPUs": 0}}, "spec.jobSizes.minGPUs"),
        (
            "q",
            {"jobSizes": {"minGPUs": 4, "maxGPUs": 2}},
            "spec.jobSizes.maxGPUs: must be at least spec.jobSizes.minGPUs",
        ),
        (
            "q",
            {"cohort": "c", "nominalGPUs": 4, "lendingLimitGPUs": 6},
            "spec.lendingLimitGPUs: must not exceed spec.nominalGPUs",
        ),
        (
            "q",
            {"cohort": "c", "lendingLimitGPUs": 2},
            "spec.lendingLimitGPUs: must not exceed spec.nominalGPUs",
        ),
        (
            "q",
            {"borrowingLimitGPUs": 4},
            "spec.borrowingLimitGPUs: only a queue in a cohort borrows",
        ),
        (
            "q",
            {"nominalGPUs": 8, "lendingLimitGPUs": 4},
            "spec.lendingLimitGPUs: only a queue in a cohort lends",
        ),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else None,
)
def test_refused_at_the_api_naming_the_field_the_parser_names(crd: Kube, name, spec, field):
    body = queue(name, spec)
    # Server-side dry run: the whole admission chain, schema and CEL included, nothing stored.
    done = kubectl(crd, "apply", "--dry-run=server", "-f", "-", body=body)
    assert done.returncode != 0 and field in done.stderr, done.stderr
    # The operator's second line of defence blames the same field.
    with pytest.raises(InvalidSpec) as refused:
        parse_queue(body)
    assert str(refused.value).startswith(field.split(":")[0] + ":"), str(refused.value)


def test_every_example_queue_is_accepted_and_parses(crd: Kube):
    folder = ROOT / "examples" / "queues"
    done = kubectl(crd, "apply", "--dry-run=server", "-o", "yaml", "-f", str(folder))
    assert done.returncode == 0, done.stderr
    stored = yaml.safe_load(done.stdout)
    items = stored["items"] if stored.get("kind") == "List" else [stored]
    names = {q["metadata"]["name"] for q in items}
    assert {"default", "team-a", "team-b", "small", "large"} <= names
    # What the API server would store (defaults applied) is what the operator parses.
    parsed = {q.name: q for q in map(parse_queue, items)}
    assert parsed["team-b"].cohort == "research" and parsed["team-b"].lending_limit == 6
    assert parsed["large"].min_job_gpus == 3 and parsed["small"].max_job_gpus == 2


def test_defaults_fill_an_empty_or_missing_spec(crd: Kube, queues: Callable[[str], str]):
    bare, sized = queues("bare"), queues("sized")
    crd.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, queue(bare, None))
    crd.custom.create_cluster_custom_object(
        GROUP, VERSION, QUEUE_PLURAL, queue(sized, {"jobSizes": {"maxGPUs": 2}})
    )
    stored = crd.custom.get_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, bare)
    assert stored["spec"] == {"weight": 1}
    assert "namespace" not in stored["metadata"]  # cluster-scoped
    stored = crd.custom.get_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, sized)
    assert stored["spec"]["jobSizes"] == {"minGPUs": 1, "maxGPUs": 2}
    assert parse_queue(stored).accepts(3) is not None


def test_kubectl_get_queues_shows_quota_use_and_borrowing(crd: Kube, queues: Callable[[str], str]):
    name = queues("team")
    spec = {"cohort": "research", "nominalGPUs": 8, "weight": 2}
    crd.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, queue(name, spec))
    status = {
        "guaranteedGPUs": 6,
        "borrowedGPUs": 2,
        "lentGPUs": 0,
        "pendingJobs": 3,
        "admittedJobs": 4,
        "headJob": "ns/big",
        "headReason": "QuotaExceeded",
    }
    crd.custom.patch_cluster_custom_object_status(
        GROUP, VERSION, QUEUE_PLURAL, name, {"status": status}
    )
    # Status is a subresource: a write to the main resource leaves it alone.
    crd.custom.patch_cluster_custom_object(
        GROUP, VERSION, QUEUE_PLURAL, name, {"status": {"pendingJobs": 99}}
    )

    table = kubectl(crd, "get", "queues", name).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "COHORT",
        "NOMINAL",
        "IN",
        "USE",
        "BORROWED",
        "PENDING",
        "ADMITTED",
        "AGE",
    ], table
    assert table[1].split()[:7] == [name, "research", "8", "6", "2", "3", "4"], table
    wide = kubectl(crd, "get", "gq", name, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-4:] == ["LENT", "WEIGHT", "HEAD", "REASON"], wide
    assert wide[1].split()[-4:] == ["0", "2", "ns/big", "QuotaExceeded"], wide
    # The gangshare category lists queues beside TrainingJobs.
    listed = kubectl(crd, "get", "gangshare", "-A", "-o", "name")
    assert f"queue.gangshare.io/{name}" in listed.stdout.splitlines(), listed


def test_no_quota_reads_blank_and_a_zero_quota_reads_zero(crd: Kube, queues: Callable[[str], str]):
    plain, borrower = queues("plain"), queues("borrower")
    crd.custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, queue(plain, {}))
    crd.custom.create_cluster_custom_object(
        GROUP, VERSION, QUEUE_PLURAL, queue(borrower, {"cohort": "c", "nominalGPUs": 0})
    )
    table = kubectl(crd, "get", "queues", plain, borrower).stdout.splitlines()
    at = table[0].index("NOMINAL")
    rows = {line.split()[0]: line for line in table[1:]}
    # A queue with no quota is unlimited, one with quota 0 only borrows: the table must differ.
    assert rows[plain][at : at + len("NOMINAL")].strip() == "", table
    assert rows[borrower][at : at + len("NOMINAL")].strip() == "0", table


@pytest.mark.parametrize("phase", ["Queued", "Admitted", "Running", "Restarting", "Succeeded"])
def test_a_job_changes_queue_or_priority_only_while_queued(crd: Kube, namespace: str, phase: str):
    """Keyed on the phase: admittedAt, which every requeue clears, is left out of the status
    on purpose (the operator puts a job moved while Queued at the back of its new line)."""
    name = f"job-{phase.lower()}"
    crd.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", trainingjob(name, 1, 1)
    )
    crd.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "trainingjobs", name, {"status": {"phase": phase}}
    )
    for change in ({"queue": "elsewhere"}, {"priority": 7}):
        patch = ["--type=merge", "-p", json.dumps({"spec": change})]
        done = kubectl(crd, "patch", "trainingjob", name, "-n", namespace, *patch)
        if phase == "Queued":
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode != 0, (phase, change, done.stdout)
            refusal = "spec.queue and spec.priority are immutable once the job is admitted"
            assert f"{refusal}: they may change only while it is Queued" in done.stderr, done.stderr
