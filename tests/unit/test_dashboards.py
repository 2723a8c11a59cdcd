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
