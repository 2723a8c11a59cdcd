"""The Grafana dashboards name only series the code exports, and are well-formed for import."""

from __future__ import annotations

import pytest

import dashboards
from dashboards import GRAFANA, ROOT

CHART_DASHBOARDS = ROOT / "deploy" / "helm" / "gangshare" / "dashboards"


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    return dashboards.exported_series()


def test_there_are_dashboards_with_queries():
    boards = dashboards.load()
    assert set(boards) == {
        "gangshare-overview.json",
        "gangshare-queues.json",
        "gangshare-jobs.json",
        "gangshare-scheduler.json",
        "gangshare-node-sharing.json",
    }
    for name, board in boards.items():
        assert [q for q in dashboards.queries({name: board})], f"{name} has no query"


def test_every_query_names_only_exported_series(exported: dict[str, str]):
    unknown = {
        q.where(): sorted(names)
        for q in dashboards.queries()
        if (names := dashboards.unknown_names(q.expr, exported))
    }
    assert unknown == {}
    for board in dashboards.load().values():
        for metric, _label in dashboards.variable_queries(board):
            assert metric in exported, (board["title"], metric)


def test_every_exported_family_is_on_some_dashboard(exported: dict[str, str]):
    used = {
        exported.get(n, n) for q in dashboards.queries() for n in dashboards.metric_names(q.expr)
    }
    assert used == set(exported.values())


def test_queries_over_the_series_of_jobs_sum_the_kind_label_away(exported: dict[str, str]):
    """The series of jobs carry `kind`; every query over them aggregates (sums by the labels
    it means), so the label does not split a panel's series into one per kind."""
    kinded = dashboards.labelled("kind")
    assert kinded >= {
        "gangshare_trainingjobs",
        "gangshare_admissions",
        "gangshare_requeues",
        "gangshare_preemptions",
        "gangshare_gang_failures",
    }
    split = [
        q.where()
        for q in dashboards.queries()
        for name in dashboards.metric_names(q.expr)
        if exported.get(name) in kinded and name not in dashboards.aggregated(q.expr)
    ]
    assert split == []
    assert dashboards.aggregated('sum by (kind) (gangshare_trainingjobs{phase=~"(A|B)"})')
    assert not dashboards.aggregated('gangshare_trainingjobs{phase="Running"}')
    assert not dashboards.aggregated("rate(gangshare_requeues_total[5m])")
    assert not dashboards.aggregated("sum(gangshare_a) + gangshare_a")


def test_jobs_of_every_kind_are_shown_under_it_and_other_panels_count_them_once():
    """A plain TrainingJob and the records of a JobSet, a PyTorchJob and a TrainJob, as the
    operator exports them; each gauge query answered as Prometheus would."""
    from prometheus_client import CollectorRegistry

    from gangshare.operator.metrics import OperatorMetrics

    def job(name: str, phase: str, ref: tuple[str, str] | None = None) -> dict:
        spec: dict = {"queue": "research"}
        if ref is not None:
            spec["jobRef"] = {"apiVersion": ref[0], "kind": ref[1], "name": name, "uid": name}
        return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}

    operator = OperatorMetrics(CollectorRegistry())
    operator.set_trainingjobs(
        [
            job("own", "Running"),
            job("sweep", "Running", ("jobset.x-k8s.io/v1alpha2", "JobSet")),
            job("ddp", "Running", ("kubeflow.org/v1", "PyTorchJob")),
            job("ddp-2", "Queued", ("kubeflow.org/v1", "PyTorchJob")),
            job("llm", "Succeeded", ("trainer.kubeflow.org/v1alpha1", "TrainJob")),
        ]
    )
    series = [(s.name, s.labels, s.value) for f in operator.registry.collect() for s in f.samples]
    boards = dashboards.load()

    def answer(board: str, title: str) -> dict[str, float]:
        panel = dashboards.panel(boards[board], title)
        (target,) = panel["targets"]
        found = dashboards.instant_sum(target["expr"], series)
        return {dashboards.legend(target["legendFormat"], dict(k)): v for k, v in found.items()}

    assert answer("gangshare-jobs.json", "Active jobs by kind") == {
        "TrainingJob": 1,
        "JobSet": 1,
        "PyTorchJob": 2,
        "TrainJob": 0,  # finished: every phase of a kind seen is reported, 0 included
    }
    by_phase = answer("gangshare-jobs.json", "TrainingJobs by phase")
    assert (by_phase["Running"], by_phase["Queued"], by_phase["Succeeded"]) == (3, 1, 1)
    assert answer("gangshare-jobs.json", "Active TrainingJobs by class") == {"Guaranteed": 4}
    assert list(answer("gangshare-overview.json", "Running jobs").values()) == [3]
    # Admissions by kind: one series per kind of the counter, per interval.
    (target,) = dashboards.panel(boards["gangshare-jobs.json"], "Admissions by kind")["targets"]
    assert (
        target["expr"].startswith("sum by (kind) (")
        and "gangshare_admissions_total" in target["expr"]
    )
    assert target["legendFormat"] == "{{kind}}"


def test_the_check_catches_a_name_the_code_does_not_export(exported: dict[str, str]):
    assert dashboards.unknown_names("rate(gangshare_bogus_total[5m])", exported) == {
        "gangshare_bogus_total"
    }
    # A histogram's family name is no series; only its _bucket/_sum/_count are.
    assert dashboards.unknown_names("gangshare_queue_wait_seconds", exported) == {
        "gangshare_queue_wait_seconds"
    }
    assert dashboards.unknown_names("gangshare_admissions", exported) == {"gangshare_admissions"}
    assert not dashboards.unknown_names(
        "sum(rate(gangshare_queue_wait_seconds_bucket[1m])) + gangshare_gpu_memory_used_bytes",
        exported,
    )


def test_dashboards_take_their_data_source_from_a_variable():
    seen_uids = set()
    for name, board in dashboards.load().items():
        assert board["uid"] not in seen_uids and len(board["uid"]) <= 40, name
        seen_uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["DS_PROMETHEUS"]["type"] == "datasource", name
        ids = [p["id"] for p in dashboards.panels(board)]
        assert len(ids) == len(set(ids)), name
        for panel in dashboards.panels(board):
            for target in [panel, *panel.get("targets", [])]:
                assert target["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, (
                    name,
                    panel["title"],
                )
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), (name, panel["title"])


def test_the_chart_ships_every_dashboard_through_a_symlink():
    shipped = {path.name: path for path in CHART_DASHBOARDS.iterdir()}
    assert set(shipped) == {path.name for path in GRAFANA.glob("*.json")}
    for name, link in shipped.items():
        assert link.is_symlink() and link.resolve() == (GRAFANA / name).resolve(), name


def test_concrete_fills_in_intervals_and_variables():
    expr = 'rate(x_bucket{queue=~"$queue", node=~"${node}"}[$__rate_interval])'
    assert dashboards.concrete(expr, "90s") == 'rate(x_bucket{queue=~".*", node=~".*"}[90s])'
