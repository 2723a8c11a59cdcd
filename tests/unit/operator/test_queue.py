"""Queue parsing: API object into a core QueueSpec, the operator's own checks naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gangshare.core.queues import DEFAULT_QUEUE, Ordering, QueueSpec, by_name, most_borrowable
from gangshare.kube.queue import (
    API_VERSION,
    MAX_GPUS,
    MAX_PRIORITY,
    MAX_RUNTIME_SECONDS,
    QUEUE_KIND,
    QUEUE_PLURAL,
    InvalidSpec,
    default_queue_object,
    parse_queue,
)

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "queue.yaml").read_text())
EXAMPLES = ROOT / "examples" / "queues"


def queue(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def test_an_empty_spec_is_a_queue_without_quota_or_cohort_that_follows_the_global_settings():
    assert parse_queue(queue("default")) == QueueSpec(name="default")
    # The API server omits an empty spec only when nothing defaulted it; both mean the same.
    assert parse_queue({"metadata": {"name": "q"}}) == QueueSpec(name="q")
    parsed = parse_queue(queue())
    assert (parsed.weight, parsed.min_job_gpus, parsed.max_job_gpus) == (1.0, 1, None)
    assert parsed.ordering is parsed.backfill is parsed.max_priority is None


def test_every_field_is_read():
    parsed = parse_queue(
        queue(
            "team-a",
            nominalGPUs=16,
            borrowingLimitGPUs=8,
            lendingLimitGPUs=4,
            weight=2.5,
            cohort="research",
            jobSizes={"minGPUs": 2, "maxGPUs": 32},
            ordering="ShortestFirst",
            backfill=True,
            maxPriority=100,
            defaultRuntimeSeconds=3600,
        )
    )
    assert parsed == QueueSpec(
        name="team-a",
        nominal_gpus=16,
        borrowing_limit=8,
        lending_limit=4,
        weight=2.5,
        cohort="research",
        min_job_gpus=2,
        max_job_gpus=32,
        ordering=Ordering.SHORTEST,
        backfill=True,
        max_priority=100,
        default_runtime_seconds=3600.0,
    )


def test_a_whole_number_written_as_a_float_is_an_integer_and_an_integer_weight_a_float():
    parsed = parse_queue(queue(nominalGPUs=8.0, weight=3))
    assert parsed.nominal_gpus == 8 and isinstance(parsed.nominal_gpus, int)
    assert parsed.weight == 3.0 and isinstance(parsed.weight, float)


def test_a_zero_quota_queue_in_a_cohort_only_borrows():
    parsed = parse_queue(queue(nominalGPUs=0, cohort="research", borrowingLimitGPUs=0))
    assert (parsed.nominal_gpus, parsed.borrowing_limit, parsed.most_lendable()) == (0, 0, 0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"nominalGPUs": -1}, "spec.nominalGPUs: must be between 0 and"),
        ({"nominalGPUs": "8"}, "spec.nominalGPUs: must be an integer, got '8'"),
        ({"nominalGPUs": 2.5}, "spec.nominalGPUs: must be an integer"),
        ({"nominalGPUs": True}, "spec.nominalGPUs: must be an integer"),
        ({"nominalGPUs": MAX_GPUS + 1}, "spec.nominalGPUs: must be between"),
        ({"cohort": "c", "borrowingLimitGPUs": -2}, "spec.borrowingLimitGPUs: must be between"),
        (
            {"nominalGPUs": 4, "cohort": "c", "lendingLimitGPUs": "all"},
            "spec.lendingLimitGPUs: must be an integer",
        ),
        ({"weight": 0}, "spec.weight: must be above 0"),
        ({"weight": -1.5}, "spec.weight: must be above 0"),
        ({"weight": "heavy"}, "spec.weight: must be a number"),
        ({"weight": float("nan")}, "spec.weight: must be a number"),
        ({"weight": False}, "spec.weight: must be a number"),
        ({"cohort": "Research"}, "spec.cohort: must be a DNS-1123 label"),
        ({"cohort": ""}, "spec.cohort: must be a DNS-1123 label"),
        ({"cohort": 7}, "spec.cohort: must be a DNS-1123 label"),
        ({"cohort": "x" * 64}, "spec.cohort: must be a DNS-1123 label"),
        ({"jobSizes": []}, "spec.jobSizes: must be an object"),
        ({"jobSizes": {"minGPUs": 0}}, "spec.jobSizes.minGPUs: must be between 1 and"),
        ({"jobSizes": {"maxGPUs": 0}}, "spec.jobSizes.maxGPUs: must be between 1 and"),
        (
            {"jobSizes": {"minGPUs": 4, "maxGPUs": 2}},
            "spec.jobSizes.maxGPUs: must be at least spec.jobSizes.minGPUs (4), got 2",
        ),
        ({"ordering": "fifo"}, "spec.ordering: must be one of FIFO, Priority, ShortestFirst"),
        ({"backfill": "yes"}, "spec.backfill: must be true or false, got 'yes'"),
        ({"maxPriority": MAX_PRIORITY + 1}, "spec.maxPriority: must be between"),
        ({"defaultRuntimeSeconds": 0}, "spec.defaultRuntimeSeconds: must be between 1 and"),
        (
            {"defaultRuntimeSeconds": MAX_RUNTIME_SECONDS + 1},
            "spec.defaultRuntimeSeconds: must be between",
        ),
        (
            {"borrowingLimitGPUs": 4},
            "spec.borrowingLimitGPUs: only a queue in a cohort borrows (set spec.cohort)",
        ),
        (
            {"nominalGPUs": 8, "lendingLimitGPUs": 4},
            "spec.lendingLimitGPUs: only a queue in a cohort lends (set spec.cohort)",
        ),
        (
            {"nominalGPUs": 8, "cohort": "c", "lendingLimitGPUs": 9},
            "spec.lendingLimitGPUs: must not exceed spec.nominalGPUs",
        ),
        (
            {"cohort": "c", "lendingLimitGPUs": 0},
            "spec.lendingLimitGPUs: must not exceed spec.nominalGPUs",
        ),
    ],
)
def test_invalid_specs_name_the_field(spec, message):
    with pytest.raises(InvalidSpec) as err:
        parse_queue(queue(**spec))
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("name", ["Team-A", "team.a", "-a", "a-", "", "x" * 64, None, 3])
def test_a_name_no_trainingjob_could_use_in_spec_queue_is_refused(name):
    with pytest.raises(InvalidSpec) as err:
        parse_queue(queue(name))
    assert str(err.value).startswith("metadata.name: must be a DNS-1123 label")


def test_a_spec_that_is_not_an_object_is_refused():
    with pytest.raises(InvalidSpec) as err:
        parse_queue({"metadata": {"name": "q"}, "spec": "nominalGPUs=8"})
    assert str(err.value).startswith("spec: must be an object")


def test_the_default_queue_object_is_the_example_and_parses_to_the_default_queue():
    obj = default_queue_object()
    assert obj == yaml.safe_load((EXAMPLES / "default.yaml").read_text())
    assert parse_queue(obj) == QueueSpec(name=DEFAULT_QUEUE)
    # Callers may add labels or owner data to what they get without changing the next one.
    obj["metadata"]["labels"] = {"x": "y"}
    assert "labels" not in default_queue_object()["metadata"]


def test_the_example_queues_parse_and_form_the_research_cohort():
    docs = [
        d
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]
    assert {d["kind"] for d in docs} == {QUEUE_KIND}
    queues = by_name(parse_queue(d) for d in docs)
    assert set(queues) >= {"default", "team-a", "team-b", "small", "large"}
    assert [q.name for q in queues.values() if q.cohort == "research"] == ["team-a", "team-b"]
    assert queues["team-a"].nominal_gpus == queues["team-b"].nominal_gpus == 8
    # team-b lends at most 6 of its 8 and borrows at most 4; team-a lends all 8, no limit.
    assert most_borrowable(queues, "team-a") == 6
    assert most_borrowable(queues, "team-b") == 4
    assert queues["small"].accepts(2) is None and queues["small"].accepts(3) is not None
    assert queues["large"].accepts(3) is None and queues["large"].accepts(2) is not None


def test_the_crd_matches_the_parser():
    assert (CRD["spec"]["names"]["plural"], CRD["spec"]["names"]["kind"]) == (
        QUEUE_PLURAL,
        QUEUE_KIND,
    )
    assert CRD["spec"]["scope"] == "Cluster"
    assert "q" not in CRD["spec"]["names"]["shortNames"]
    [version] = CRD["spec"]["versions"]
    assert f"{CRD['spec']['group']}/{version['name']}" == API_VERSION
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["ordering"]["enum"] == [m.value for m in Ordering]
    for field in ("nominalGPUs", "borrowingLimitGPUs", "lendingLimitGPUs"):
        assert (spec[field]["minimum"], spec[field]["maximum"]) == (0, MAX_GPUS)
    assert spec["maxPriority"]["maximum"] == MAX_PRIORITY
    assert spec["defaultRuntimeSeconds"]["maximum"] == MAX_RUNTIME_SECONDS
    # The CEL messages are the parser's, so either refusal reads the same.
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    for rule in rules:
        field = rule["message"].split(":")[0]
        assert field == "spec" + rule["fieldPath"], rule
    columns = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert columns == ["Cohort", "Nominal", "In Use", "Borrowed", "Pending", "Admitted", "Age"]
