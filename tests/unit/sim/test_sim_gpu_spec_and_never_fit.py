"""Trace inputs that must not vanish: Alibaba's gpu_spec, jobs the cluster can never hold
(reported on stdout, in summary.md and summary.json alike), and refused traces that name
the columns they lack."""

import json

import pytest
from simkit import model, setup

from gangshare.cli import main
from gangshare.core.annotations import GPU_PRODUCT_LABEL
from gangshare.core.constraints import UNCONSTRAINED, SelectorOperator
from gangshare.core.spec import SpecError
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.engine import Simulation
from gangshare.sim.outcome import Outcome
from gangshare.sim.outputs import markdown, never_held
from gangshare.sim.policy import parse_policy
from gangshare.sim.report import EXPERIMENTS
from gangshare.sim.report_md import setup_section
from gangshare.sim.run import rejection_reasons, simulate
from gangshare.sim.trace import Trace, TraceError, TraceJob, gpu_models, load_trace
from gangshare.sim.workload import model_constraints, prepare_jobs
from lucid_inputs import write_lucid

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
# Two 1-GPU V100M16 nodes' worth of models: one T4 node (2 GPUs), one V100M16, one V100M32.
NODES = (
    "sn,cpu_milli,memory_mib,gpu,model\nt4-0,1,1,2,T4\nv16-0,1,1,1,V100M16\nv32-0,1,1,1,V100M32\n"
)


FIFO = (parse_policy("fifo"), model())


def pod(i: int, spec: str, gpus: int = 1, start: int = 0, end: int = 1000) -> str:
    return f"pod-{i},1000,1024,{gpus},1000,{spec},LS,Running,{start},{end},{start}\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# ----- item 7: gpu_spec -------------------------------------------------------------------


def test_gpu_spec_is_read_as_the_set_of_models_a_pod_accepts(tmp_path):
    assert gpu_models("") == gpu_models("nan") == gpu_models("NaN") == ()
    assert gpu_models("T4") == ("T4",)
    # As in the published trace: unordered, and once with a model written twice.
    assert gpu_models("V100M32|V100M16|V100M32") == ("V100M16", "V100M32")
    text = HEADER + pod(0, "") + pod(1, "T4") + pod(2, "V100M16|V100M32") + pod(3, "nan")
    trace = load_trace(write(tmp_path, "pods.csv", text))
    assert [j.gpu_models for j in trace.jobs] == [(), ("T4",), ("V100M16", "V100M32"), ()]
    assert trace.pinned == 2
    # The column stays optional: the default pod list without it still loads.
    bare = (
        "name,num_gpu,gpu_milli,qos,creation_time,scheduled_time,deletion_time\np,1,1000,LS,0,0,9\n"
    )
    assert load_trace(write(tmp_path, "bare.csv", bare)).jobs[0].gpu_models == ()
    # A generic trace takes the same column (bench/gpu_models.py writes one).
    generic = "submit_time,duration,num_gpus,gpu_spec\n0,60,1,H100\n1,60,2,\n2,60,1,A10|H100\n"
    jobs = load_trace(write(tmp_path, "generic.csv", generic)).jobs
    assert [j.gpu_models for j in jobs] == [("H100",), (), ("A10", "H100")]


def test_one_model_pins_like_gpu_model_and_several_become_node_affinity():
    assert model_constraints((), None) == (None, UNCONSTRAINED)
    assert model_constraints((), "B") == ("B", UNCONSTRAINED)
    one, free = model_constraints(("T4",), None)
    assert one == "T4" and not free.affinity
    either, constraints = model_constraints(("V100M16", "V100M32"), None)
    assert either is None
    (term,) = constraints.affinity
    (requirement,) = term.expressions
    assert requirement.key == GPU_PRODUCT_LABEL
    assert requirement.operator is SelectorOperator.IN
    assert requirement.values == ("V100M16", "V100M32")
    # A queue pinned (cluster spec gpuModel) to a model the pod accepts keeps its pin ...
    assert model_constraints(("V100M16", "V100M32"), "V100M32")[0] == "V100M32"
    assert not model_constraints(("V100M16", "V100M32"), "V100M32")[1].affinity
    # ... and one outside them leaves the pod nowhere (both constraints hold).
    pin, outside = model_constraints(("T4",), "V100M32")
    assert pin == "V100M32" and outside.affinity


def test_node_list_nodes_carry_their_model_as_the_gpu_product_label(tmp_path):
    cluster = load_sim_cluster(write(tmp_path, "nodes.csv", NODES)).cluster
    assert {n.name: n.labels[GPU_PRODUCT_LABEL] for n in cluster.nodes.values()} == {
        "t4-0": "T4",
        "v16-0": "V100M16",
        "v32-0": "V100M32",
    }
    spec = "nodePools:\n  - {name: p, count: 1, gpusPerNode: 2, gpuModel: A100}\n"
    (node,) = load_sim_cluster(write(tmp_path, "c.yaml", spec)).cluster.nodes.values()
    assert node.labels[GPU_PRODUCT_LABEL] == "A100"
    assert node.labels["gangshare.io/pool"] == "p"


def test_pinned_pods_run_only_on_their_models_and_either_model_will_do(tmp_path):
    # At t=0: two "V100M16|V100M32" pods (one V100M16 and one V100M32 GPU: both run at once,
    # one on each), two T4 pods (the T4 node's two GPUs), and a pod that asks for "A10",
    # which no node has. Later, an unpinned pod takes whatever is free.
    text = HEADER + pod(0, "V100M16|V100M32") + pod(1, "V100M32|V100M16") + pod(2, "T4")
    text += pod(3, "T4") + pod(4, "A10") + pod(5, "", start=5000, end=6000)
    trace = load_trace(write(tmp_path, "pods.csv", text))
    specs = prepare_jobs(trace, model(), 1, antman=False, opportunistic_fraction=0.5)
    assert specs[2].gang.gpu_model == "T4"
    assert specs[0].gang.constraints is specs[1].gang.constraints  # one affinity, shared
    sim = Simulation(specs, load_sim_cluster(write(tmp_path, "nodes.csv", NODES)), *FIFO)
    reasons = rejection_reasons(sim, specs)
    placed: dict[str, set[str]] = {}

    def watch(sim: Simulation) -> None:
        for node in sim.cluster.nodes.values():
            for gpu in node.gpus:
                tenants = [gpu.guaranteed] if gpu.guaranteed else []
                for tenant in tenants + list(gpu.opportunistic):
                    placed.setdefault(tenant.owner, set()).add(gpu.gpu.model)

    sim.check = watch
    records = sim.run()
    assert placed["pod-0"] | placed["pod-1"] == {"V100M16", "V100M32"}
    assert placed["pod-2"] == placed["pod-3"] == {"T4"}
    assert "pod-4" not in placed
    assert placed["pod-5"]  # unpinned: anywhere
    # Nothing pinned waited: the V100 pods took one model each, side by side.
    queued = {r.key: r.queued for r in records}
    assert queued["pod-0"] == queued["pod-1"] == queued["pod-2"] == queued["pod-3"] == 0
    assert sim.rejected == ["pod-4"]
    assert reasons == {"gpu_spec A10: no node has that GPU model": 1}


def test_a_spec_of_several_absent_models_is_reported_with_all_of_them(tmp_path):
    # An unpinned pod of the same shape comes first: what fits is judged per constraint,
    # not per shape alone, or the pinned pod would wait for ever instead.
    text = HEADER + pod(0, "") + pod(1, "A10|G3", start=10) + pod(2, "T4", start=20)
    trace = load_trace(write(tmp_path, "pods.csv", text))
    cluster = write(tmp_path, "nodes.csv", NODES)
    result = simulate(
        trace, lambda: load_sim_cluster(cluster), parse_policy("fifo"), model(), seed=1
    )
    assert result.rejected == ["pod-1"] and not result.unfinished
    assert result.rejected_reasons == {"gpu_spec A10|G3: no node has any of those GPU models": 1}


# ----- item 6: jobs the cluster can never hold ---------------------------------------------

SPEC = """nodePools:
  - {name: n, count: 2, gpusPerNode: 4, gpuMemoryMiB: 16384}
"""


def test_the_cli_reports_never_fitting_jobs_on_stdout_and_in_both_summaries(tmp_path, capsys):
    write_lucid(tmp_path)
    trace = "job_id,submit_time,duration,num_gpus\n"
    trace += "small,0,100,2\nwide,10,100,8\nwider,20,100,8\nok,30,100,4\n"
    argv = ["simulate", "--trace", str(write(tmp_path, "jobs.csv", trace))]
    argv += ["--cluster", str(write(tmp_path, "c.yaml", SPEC))]
    argv += ["--colocation", str(tmp_path / "lucid"), "--out", str(tmp_path / "out")]
    assert main([*argv, "--no-progress", "--no-plots", "--policy", "fifo"]) == 0
    stdout = capsys.readouterr().out
    reason = "can never fit: 1 worker(s) x 8 GPU(s)"
    assert "jobs.csv: 4 jobs replayed; dropped rows: none" in stdout
    line = next(x for x in stdout.splitlines() if "can never hold" in x)
    assert "jobs the cluster can never hold (rejected on arrival): 2 (2: " in line
    assert reason in line and "node has 4 GPUs, worker needs 8" in line
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "- jobs the cluster can never hold (rejected on arrival): 2 (2: " in md
    assert reason in md
    (result,) = json.loads((tmp_path / "out" / "summary.json").read_text())["results"]
    assert result["rejected_jobs"] == 2 and result["jobs"] == 2
    ((why, count),) = result["rejected_reasons"].items()
    assert count == 2 and why.startswith(reason) and why in line and why in md


def test_the_cli_reports_pods_pinned_to_absent_models(tmp_path, capsys):
    write_lucid(tmp_path)
    text = HEADER + pod(0, "V100M16|V100M32") + pod(1, "A10") + pod(2, "") + pod(3, "")
    argv = ["simulate", "--trace", str(write(tmp_path, "pods.csv", text))]
    argv += ["--cluster", str(write(tmp_path, "nodes.csv", NODES))]
    argv += ["--colocation", str(tmp_path / "lucid"), "--out", str(tmp_path / "out")]
    argv += ["--no-progress", "--no-plots", "--policy", "fifo", "--policy", "antman"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    said = "1 (1: gpu_spec A10: no node has that GPU model)"
    assert stdout.count(f"jobs the cluster can never hold (rejected on arrival): {said}") == 2
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "- jobs pinned to GPU models (gpu_spec): 2" in md
    assert f"- jobs the cluster can never hold (rejected on arrival): {said}" in md
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["jobs pinned to GPU models (gpu_spec)"] == 2
    assert [r["rejected_jobs"] for r in doc["results"]] == [1, 1]


def test_policies_that_reject_differently_get_a_line_each_in_summary_md():
    jobs = [TraceJob("a", 0, 10, 2, "q"), TraceJob("b", 1, 10, 8)]
    trace = Trace("generic", "t.csv", jobs)
    quota = setup(nodes=2, gpus=4, quotas={"q": 1})
    strict = simulate(trace, quota, parse_policy("fifo"), model())
    loose = simulate(trace, setup(nodes=2, gpus=4), parse_policy("antman"), model())
    assert never_held(strict).startswith("2 (") and never_held(loose).startswith("1 (1: can")
    text = markdown({"trace": "t.csv"}, [strict, loose])
    assert "- jobs the cluster can never hold (rejected on arrival) under fifo: 2 (" in text
    assert "more than queue q's whole quota of 1" in text
    assert "(rejected on arrival) under antman: 1 (1: can never fit" in text


def test_the_results_setup_table_reports_them_with_their_reasons():
    jobs = [TraceJob("a", 0, 10, 2), TraceJob("b", 1, 10, 8), TraceJob("c", 2, 10, 1)]
    trace = Trace("philly", "tiny.csv", jobs, {})
    result = simulate(trace, setup(nodes=2, gpus=4), parse_policy("fifo"), model())
    experiment = next(e for e in EXPERIMENTS if e.name == "philly")
    (row,) = [
        x
        for x in setup_section([Outcome(experiment, trace, "2 nodes", [result])])
        if "`philly`" in x
    ]
    assert "| 3 | rejected on arrival: 1 (1: can never fit: 1 worker(s) x 8 GPU(s)" in row
    assert row.endswith("|") and row.count("|") == 6
    pinned = Trace("alibaba", "p.csv", [TraceJob("p", 0, 10, 1, gpu_models=("A10", "G3"))])
    nodes = setup(nodes=1, gpus=4)
    spec = simulate(pinned, nodes, parse_policy("fifo"), model())
    (row,) = [
        x for x in setup_section([Outcome(experiment, pinned, "1 node", [spec])]) if "`philly`" in x
    ]
    assert "gpu_spec A10\\|G3: no node has any of those GPU models" in row  # escaped for the table


# ----- item 8: refused traces name what they lack -------------------------------------------


def test_an_unrecognised_trace_names_each_formats_missing_columns(tmp_path):
    # The header of the published openb_pod_list_multigpu50.csv.
    path = write(
        tmp_path, "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1\n"
    )
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith("--trace: unrecognised columns ['cpu_milli', 'gpu_milli', ")
    # The closest format (most columns found) first.
    assert "alibaba lacks creation_time, deletion_time, qos, scheduled_time; " in message
    assert "generic lacks duration, num_gpus, submit_time" in message
    assert "philly lacks cluster, duration, num_gpus, timestamp" in message
    assert message.index("alibaba lacks") < message.index("generic lacks")
    with pytest.raises(TraceError, match=r"philly trace needs column\(s\) \['cluster'\], missing"):
        load_trace(write(tmp_path, "p.csv", "timestamp,duration,num_gpus\n"), kind="philly")


def test_the_cli_refuses_such_a_trace_in_one_line_naming_the_missing_columns(tmp_path, capsys):
    path = write(tmp_path, "odd.csv", "submit,duration,gpus\n0,1,1\n")
    argv = ["simulate", "--trace", str(path), "--cluster", str(write(tmp_path, "c.yaml", SPEC))]
    assert main([*argv, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --trace: unrecognised columns ['duration', 'gpus', 'submit']")
    assert "generic lacks num_gpus, submit_time;" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_a_node_list_without_its_columns_names_the_missing_ones(tmp_path):
    path = write(tmp_path, "nodes.csv", "sn,gpus,model\nn,8,G2\n")
    with pytest.raises(
        SpecError, match=r"needs columns \['gpu', 'model', 'sn'\], missing \['gpu'\]"
    ):
        load_sim_cluster(path)
