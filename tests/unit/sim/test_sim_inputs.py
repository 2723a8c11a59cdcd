"""Reading traces, cluster specs, co-location data and --policy; errors name the flag and field."""

from datetime import UTC, datetime

import pytest

from gangshare.core import ServiceClass
from gangshare.core.spec import SpecError
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.colocation import build_model
from gangshare.sim.policy import PolicyError, parse_policy
from gangshare.sim.trace import TraceError, load_trace
from gangshare.sim.workload import gang_shape, prepare_jobs, seeded_unit, service_class

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,8,23608.0,6214e9
2017-09-29 07:58:32,860.0,1,860.0,6c71a0
2017-10-09 06:13:03,10.0,0,0.0,6214e9
"""

ALIBABA = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,\
deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,100,1100,100
openb-pod-0001,6000,12288,1,460,,LS,Running,150,400,160
openb-pod-0002,6000,12288,0,0,,BE,Running,150,400,160
openb-pod-0003,6000,12288,1,1000,,BE,Pending,170,400,
openb-pod-0004,6000,12288,8,1000,,BE,Failed,200,260,205
"""


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_philly_rows_become_jobs_in_submission_order_with_the_vc_as_queue(tmp_path):
    trace = load_trace(write(tmp_path, PHILLY))
    assert trace.kind == "philly"
    assert [(j.key, j.submit, j.duration, j.gpus, j.queue) for j in trace.jobs] == [
        ("philly-2", 0.0, 860.0, 1, "6c71a0"),
        ("philly-1", 857671.0, 2951.0, 8, "6214e9"),
        ("philly-0", 860603.0, 66.0, 1, "11cb48"),
    ]
    assert trace.dropped == {"no GPU": 1}


def test_a_philly_window_keeps_jobs_submitted_inside_it(tmp_path):
    window = (datetime(2017, 10, 1, tzinfo=UTC), datetime(2017, 10, 9, 6, 30, tzinfo=UTC))
    trace = load_trace(write(tmp_path, PHILLY), window)
    assert [j.key for j in trace.jobs] == ["philly-1"]
    assert trace.dropped == {"outside --window": 2, "no GPU": 1}


def test_alibaba_pods_run_from_scheduled_to_deletion_time(tmp_path):
    trace = load_trace(write(tmp_path, ALIBABA))
    assert trace.kind == "alibaba"
    got = [(j.key, j.submit, j.duration, j.gpus, j.qos, j.gpu_milli) for j in trace.jobs]
    assert got == [
        ("openb-pod-0000", 0.0, 1000.0, 1, "LS", 1000),
        ("openb-pod-0001", 50.0, 240.0, 1, "LS", 460),
        ("openb-pod-0004", 100.0, 55.0, 8, "BE", 1000),
    ]
    assert trace.dropped == {"CPU-only pod": 1, "never scheduled": 1}


def test_alibaba_classes_follow_qos_and_fractional_gpus(tmp_path):
    jobs = load_trace(write(tmp_path, ALIBABA)).jobs
    classes = [service_class(j, "alibaba", 0, 0.5) for j in jobs]
    assert classes == [
        ServiceClass.GUARANTEED,
        ServiceClass.OPPORTUNISTIC,
        ServiceClass.OPPORTUNISTIC,
    ]


def test_generic_csv_takes_classes_and_priorities_from_its_columns(tmp_path):
    text = "job_id,submit_time,duration,num_gpus,queue,service_class,priority\n"
    text += "a,5,10,2,team,opportunistic,3\nb,0,20,1,,,\n"
    jobs = load_trace(write(tmp_path, text)).jobs
    assert [(j.key, j.submit, j.queue, j.service_class, j.priority) for j in jobs] == [
        ("b", 0.0, "default", None, 0),
        ("a", 5.0, "team", ServiceClass.OPPORTUNISTIC, 3),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "--trace: unrecognised columns ['a', 'b']"),
        ("submit_time,duration,num_gpus\n0,x,1\n", "--trace: line 2: duration: must be a number"),
        ("submit_time,duration,num_gpus\n0,0,1\n", "--trace: line 2: duration: must be a positive"),
        (
            "submit_time,duration,num_gpus\n0,5,1.5\n",
            "--trace: line 2: num_gpus: must be an integer",
        ),
        (
            "submit_time,duration,num_gpus,service_class\n0,5,1,Gold\n",
            "--trace: line 2: service_class: must be Guaranteed, Opportunistic, got 'Gold'",
        ),
        ("timestamp,duration,num_gpus,cluster\nyesterday,5,1,x\n", "--trace: line 2: timestamp"),
        ("submit_time,duration,num_gpus\n", "has no GPU jobs to replay"),
    ],
)
def test_bad_traces_say_which_line_and_field(tmp_path, text, message):
    with pytest.raises(TraceError) as err:
        load_trace(write(tmp_path, text))
    assert message in str(err.value)


def test_a_missing_trace_file_is_named(tmp_path):
    with pytest.raises(TraceError, match=r"--trace: cannot read .*nope.csv"):
        load_trace(tmp_path / "nope.csv")


SPEC = """nodePools:
  - {name: n, count: 2, gpusPerNode: 4, gpuModel: A, gpuMemoryMiB: 16384}
  - {name: m, count: 1, gpusPerNode: 8, gpuModel: B}
queues:
  - {name: "6214e9", quota: 8}
  - {name: team, weight: 2.5, gpuModel: B}
"""


def test_cluster_specs_carry_queue_quotas_weights_and_pins(tmp_path):
    setup = load_sim_cluster(write(tmp_path, SPEC, "c.yaml"))
    assert setup.gpu_count == 16
    assert setup.quotas == {"6214e9": 8}
    assert setup.weights == {"6214e9": 8.0, "team": 2.5}
    assert setup.pins == {"team": "B"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodePools: []\n", "--cluster: nodePools: must be a non-empty list"),
        (SPEC + "  - {name: x, quota: -1}\n", "--cluster: queues[2].quota: must be a non-negative"),
        (SPEC + "  - {name: team}\n", "--cluster: queues[2].name: queue team is listed twice"),
        (SPEC.replace("gpuModel: B}\n", "gpuModel: C}\n", 1), "team: no node has GPU model B"),
    ],
)
def test_bad_cluster_specs_name_the_field(tmp_path, text, message):
    with pytest.raises(SpecError) as err:
        load_sim_cluster(write(tmp_path, text, "c.yaml"))
    assert message in str(err.value)


def test_a_node_list_csv_becomes_a_cluster_and_a_fraction_keeps_a_share_of_each_group(tmp_path):
    rows = "sn,cpu_milli,memory_mib,gpu,model\n"
    rows += "".join(f"node-{i:02d},1,1,8,G2\n" for i in range(10))
    rows += "".join(f"node-t{i},1,1,2,T4\n" for i in range(4)) + "cpu-0,1,1,0,\n"
    path = write(tmp_path, rows, "nodes.csv")
    assert load_sim_cluster(path).gpu_count == 88
    half = load_sim_cluster(path, 0.5)
    assert sorted(half.cluster.nodes) == [f"node-{i:02d}" for i in range(5)] + [
        "node-t0",
        "node-t1",
    ]
    node = half.cluster.node("node-00")
    assert (node.gpus[0].gpu.memory_mib, node.islands) == (32768, ((0, 1, 2, 3), (4, 5, 6, 7)))
    with pytest.raises(SpecError, match=r"--cluster-fraction: 0\.01 keeps no node"):
        load_sim_cluster(path, 0.01)


def test_colocation_pairs_are_clipped_and_unmeasured_pairs_fall_back():
    single = [
        {"model": m, "dataset": "d", "batchsize": "32", "amp": "0", "gpu_util": u, "gmem": g}
        for m, u, g in (("A", "50", "4000"), ("B", "30", "2000"), ("C", "20", "1000"))
    ]

    def pair(a, b, s1, s2, util):
        row = {"gpu_util": util, "speed1": s1, "speed2": s2}
        for side, name in (("1", a), ("2", b)):
            row |= {f"model{side}": name, f"dataset{side}": "d", f"batchsize{side}": "32"}
            row[f"amp{side}"] = "0"
        return row

    model = build_model(
        single, [pair("A", "B", "1.2", "0.5", "70"), pair("A", "C", "0.8", "0.9", "60")]
    )
    a, b, c = (i for i, w in enumerate(model.workloads) if w.name.startswith(("A", "B", "C")))
    assert model.speed(a, b) == 1.0  # measured 1.2: noise around "no slowdown"
    assert model.speed(b, a) == 0.5
    assert model.pair_util(b, a) == 70.0
    assert model.speed(b, c) == 0.5  # unmeasured: B's mean measured speed
    assert model.pair_util(b, c) == pytest.approx(30 + 0.26 * 20)


def test_policy_names_combine_and_map_onto_the_core():
    policy = parse_policy("antman, backfill,multi-queue,sjf")
    assert policy.name == "qssf,multi-queue,backfill,antman"
    queue_policy = policy.queue_policy({"a": 8}, {"a": 8.0})
    assert (queue_policy.small_job_max_gpus, queue_policy.backfill, queue_policy.fair_share) == (
        2,
        True,
        False,
    )
    assert parse_policy("fifo").name == "fifo"
    assert parse_policy("sjf-oracle").oracle
    with pytest.raises(PolicyError, match="--policy: priority and qssf both set the order"):
        parse_policy("priority,qssf")
    with pytest.raises(PolicyError, match="--policy: unknown policy 'lifo'"):
        parse_policy("lifo")


def test_oracle_runtimes_gives_backfill_true_run_times_and_keeps_the_order():
    policy = parse_policy("fifo,oracle-runtimes,backfill")
    assert policy.name == "fifo,backfill,oracle-runtimes"
    assert policy.exact_runtimes and policy.oracle_runtimes and not policy.oracle
    assert policy.queue_policy({}, {}).ordering is parse_policy("fifo,backfill").ordering
    assert not parse_policy("fifo,backfill").exact_runtimes
    # sjf-oracle already sees true run times: the token adds nothing there.
    assert parse_policy("sjf-oracle,oracle-runtimes") == parse_policy("sjf-oracle")
    assert parse_policy("sjf-oracle").exact_runtimes
    with pytest.raises(PolicyError, match="use sjf-oracle"):
        parse_policy("qssf,backfill,oracle-runtimes")


def test_gangs_split_into_workers_of_at_most_eight_gpus():
    assert [gang_shape(n) for n in (1, 4, 8, 12, 16, 24, 128)] == [
        (1, 1),
        (1, 4),
        (1, 8),
        (2, 6),
        (2, 8),
        (3, 8),
        (16, 8),
    ]


def test_philly_classes_are_drawn_from_the_seed_and_only_for_single_gpu_jobs(tmp_path):
    trace = load_trace(write(tmp_path, PHILLY))
    solo = {"model": "A", "dataset": "d", "batchsize": "1", "amp": "0", "gpu_util": "9"}
    model = build_model(
        [solo | {"gmem": "9"}],
        [
            {
                "model1": "A", "dataset1": "d", "batchsize1": "1", "amp1": "0", "speed1": "1",
                "model2": "A", "dataset2": "d", "batchsize2": "1", "amp2": "0", "speed2": "1",
                "gpu_util": "9",
            }
        ],
    )  # fmt: skip
    seeds = {}
    for seed in range(40):
        specs = prepare_jobs(trace, model, seed, antman=True, opportunistic_fraction=0.5)
        seeds[seed] = tuple(s.service_class for s in specs)
        assert specs[1].service_class is ServiceClass.GUARANTEED  # 8 GPUs
        assert specs[1].gang.gpu_memory_mib is None
    assert len(set(seeds.values())) > 1
    assert 0.4 < sum(seeded_unit(7, "class", f"k{i}") < 0.5 for i in range(2000)) / 2000 < 0.6
    exclusive = prepare_jobs(trace, model, 3, antman=False, opportunistic_fraction=1.0)
    assert {s.service_class for s in exclusive} == {ServiceClass.GUARANTEED}
