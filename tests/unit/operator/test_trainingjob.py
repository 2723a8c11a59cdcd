"""TrainingJob parsing: the operator's own validation names the field."""

import pytest
from jobs import make_job

from gangshare.core import ServiceClass, TopologyPolicy, TopologyScope
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob


def test_parses_into_core_objects():
    job = parse_trainingjob(
        make_job("llm")
        .spec(
            serviceClass="Opportunistic",
            workers=2,
            gpusPerWorker=4,
            gpuMemory="8Gi",
            topology={"policy": "Required", "scope": "Rack", "relaxAfterSeconds": 60},
        )
        .build()
    )
    gang = job.gang()
    assert (gang.owner, gang.workers, gang.gpus_per_worker) == ("team/llm", 2, 4)
    assert gang.service_class is ServiceClass.OPPORTUNISTIC and gang.gpu_memory_mib == 8192
    assert (
        gang.topology.policy is TopologyPolicy.REQUIRED
        and gang.topology.scope is TopologyScope.RACK
    )
    assert gang.topology.relax_after_seconds == 60
    assert job.total_gpus == 8


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpuMemory": "8Gi"}, "spec.gpuMemory: only Opportunistic jobs set gpuMemory"),
        (
            {"serviceClass": "Opportunistic", "gpuMemory": "lots"},
            "spec.gpuMemory: 'lots' is not a quantity",
        ),
        ({"workers": 0}, "spec.workers: must be between 1 and 1024, got 0"),
        ({"gpusPerWorker": "two"}, "spec.gpusPerWorker: must be an integer"),
        ({"serviceClass": "Gold"}, "spec.serviceClass: must be one of Guaranteed, Opportunistic"),
        (
            {"template": {"spec": {"containers": []}}},
            "spec.template.spec.containers: at least one container",
        ),
        ({"slowdownTolerance": 2}, "spec.slowdownTolerance: must be between 0 and 1"),
    ],
)
def test_invalid_specs_name_the_field(fields, message):
    with pytest.raises(InvalidSpec) as err:
        parse_trainingjob(make_job().spec(**fields).build())
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("name", ["resnet.v2", "ResNet", "9lives", "train-", "a_b"])
def test_a_name_that_cannot_name_a_service_and_hostnames_is_refused(name):
    job = make_job(name).build()
    with pytest.raises(InvalidSpec) as err:
        parse_trainingjob(job)
    assert str(err.value).startswith("metadata.name: must be a DNS-1035 label")


@pytest.mark.parametrize(
    ("template_meta", "message"),
    [
        (
            {"annotations": {"gangshare.io/assigned-gpus": "0,1,2,3"}},
            "spec.template.metadata.annotations: gangshare.io/assigned-gpus is reserved",
        ),
        (
            {"annotations": {"gangshare.io/planned-node": "h100-0"}},
            "spec.template.metadata.annotations: gangshare.io/planned-node is reserved",
        ),
        (
            {"labels": {"gangshare.io/job": "someone-elses"}},
            "spec.template.metadata.labels: gangshare.io/job is reserved",
        ),
    ],
)
def test_a_template_cannot_claim_gangshares_own_keys(template_meta, message):
    template = {"metadata": template_meta, "spec": {"containers": [{"name": "t", "image": "i"}]}}
    with pytest.raises(InvalidSpec) as err:
        parse_trainingjob(make_job().spec(template=template).build())
    assert str(err.value).startswith(message)


def test_the_simulation_markers_are_the_only_gangshare_keys_a_template_may_set():
    markers = {"gangshare.io/kwok-exit-code": "0", "gangshare.io/kwok-run-for": "2s"}
    template = {"metadata": {"annotations": markers}, "spec": {"containers": [{"name": "t"}]}}
    assert parse_trainingjob(make_job().spec(template=template).build()).template == template


def test_a_template_cannot_pick_its_node():
    template = {"spec": {"nodeName": "h100-0", "containers": [{"name": "t", "image": "i"}]}}
    with pytest.raises(InvalidSpec) as err:
        parse_trainingjob(make_job().spec(template=template).build())
    assert str(err.value).startswith("spec.template.spec.nodeName: gangshare places every worker")


@pytest.mark.parametrize(
    ("pod_spec", "message"),
    [
        (
            {
                "initContainers": [
                    {
                        "name": "side",
                        "restartPolicy": "Always",
                        "resources": {"limits": {"nvidia.com/gpu": "4"}},
                    }
                ],
                "containers": [{"name": "t", "image": "i"}],
            },
            "spec.template.spec.initContainers[0].resources: may not ask for nvidia.com/gpu",
        ),
        (
            {
                "containers": [
                    {"name": "t", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}},
                    {"name": "h", "resources": {"requests": {"gangshare.io/gpu-share": "1"}}},
                ]
            },
            "spec.template.spec.containers[1].resources: may not ask for gangshare.io/gpu-share",
        ),
    ],
    ids=["sidecar", "second-container"],
)
def test_gpus_anywhere_but_the_first_container_are_refused(pod_spec, message):
    with pytest.raises(InvalidSpec) as err:
        parse_trainingjob(make_job().spec(template={"spec": pod_spec}).build())
    assert str(err.value).startswith(message)
