"""`gangshare demo`'s closing lines: where its metrics are, and figures read from them."""

from prometheus_client import CollectorRegistry, generate_latest

from gangshare.demo import metrics_report
from gangshare.extender.metrics import ExtenderMetrics
from gangshare.operator.metrics import OperatorMetrics

ENDPOINTS = {
    "operator": "http://127.0.0.1:40001/metrics",
    "extender": "http://127.0.0.1:40002/metrics",
}


def test_the_report_names_both_endpoints_and_reads_figures_from_them():
    operator = OperatorMetrics(CollectorRegistry())
    for queue, service_class, borrowed in [
        ("prod", "Guaranteed", False),
        ("prod", "Guaranteed", False),
        ("research", "Guaranteed", False),
        ("research", "Opportunistic", True),
    ]:
        operator.admitted(queue, service_class, borrowed, 1.0, "TrainingJob")
    operator.preemptions.labels("research", "Reclaimed", "JobSet").inc()
    extender = ExtenderMetrics(CollectorRegistry())
    extender.requests.labels("filter", "ok").inc(7)
    extender.requests.labels("bind", "ok").inc(4)
    extender.requests.labels("bind", "error").inc()
    scraped = {
        "operator": generate_latest(operator.registry).decode(),
        "extender": generate_latest(extender.registry).decode(),
    }
    assert metrics_report(ENDPOINTS, scraped).splitlines() == [
        "metrics (Prometheus text format, served until the demo stops):",
        "  operator http://127.0.0.1:40001/metrics",
        "  extender http://127.0.0.1:40002/metrics",
        "  admissions 3 Guaranteed, 1 Opportunistic (1 on borrowed quota), 1 preempted; "
        "extender requests 5 bind, 7 filter",
    ]


def test_an_endpoint_that_cannot_be_read_is_said_so_and_the_urls_stay():
    empty = generate_latest(OperatorMetrics(CollectorRegistry()).registry).decode()
    report = metrics_report(ENDPOINTS, {"operator": empty, "extender": OSError("refused")})
    assert report.splitlines()[1:] == [
        "  operator http://127.0.0.1:40001/metrics",
        "  extender http://127.0.0.1:40002/metrics",
        "  admissions none (0 on borrowed quota), 0 preempted; unreadable extender: refused",
    ]


def test_the_demo_queues_the_sample_job_beside_the_trainingjobs_and_shows_it_by_name():
    from gangshare.demo import demo_jobs, status_table
    from gangshare.dev.binaries import repo_root
    from gangshare.kube.batchjob import parse_queued_job
    from gangshare.kube.queued import workload

    jobs = demo_jobs(repo_root() / "examples" / "trainingjobs", burst=0, run_seconds=2)
    (sample,) = [j for j in jobs if j["kind"] == "Job"]
    sample["metadata"].update({"namespace": "default", "uid": "u"})
    spec = parse_queued_job(sample)  # the sample is a gang gangshare queues
    assert (spec.queue, spec.workers, spec.gpus_per_worker) == ("vision", 2, 4)
    annotations = sample["spec"]["template"]["metadata"]["annotations"]
    assert "gangshare.io/kwok-run-for" in annotations  # it finishes on KWOK like the others
    shown = workload(spec)
    shown["status"] = {"phase": "Queued", "message": "waiting for 2x4 GPUs in queue vision"}
    row = status_table([shown]).splitlines()[1]
    assert row.startswith("Job/vit-sweep") and "2x4" in row and "Queued" in row


def test_the_demo_table_shows_a_reshaped_job_in_the_shape_it_runs_in():
    from gangshare.demo import demo_jobs, status_table
    from gangshare.dev.binaries import repo_root

    jobs = demo_jobs(repo_root() / "examples" / "trainingjobs", burst=0, run_seconds=2)
    (flexible,) = [j for j in jobs if j["metadata"]["name"] == "bert-flexible-shape"]
    assert "1x8" in status_table([flexible]).splitlines()[1]
    flexible["status"] = {"phase": "Running", "reshapedTo": {"workers": 2, "gpusPerWorker": 4}}
    assert "2x4" in status_table([flexible]).splitlines()[1]
