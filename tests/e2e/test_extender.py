"""The extender behind the real kube-scheduler (gangshare-scheduler) on KWOK GPU nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gangshare.core.annotations import NODE_UTILIZATION, encode_utilization
from gangshare.kube.snapshot import build_snapshot
from kube import Kube, NodePool, eventually, gpu_pod

TJ = ("gangshare.io", "v1alpha1", "trainingjobs")

pytestmark = pytest.mark.e2e


@pytest.fixture
def pool(kube: Kube, namespace: str) -> Iterator[NodePool]:
    created = NodePool(kube, namespace)
    yield created
    created.cleanup()


def test_one_gpu_pods_are_packed_best_fit(pool: NodePool):
    a, b, c, _d, _e = pool.nodes(5, 4)
    pool.occupy(a, [0])  # 3 free
    pool.occupy(b, [0, 1])  # 2 free
    pool.occupy(c, [3])  # 3 free
    names = [f"one-{i}" for i in range(8)]
    for name in names:
        pool.pod(name, 1)
    placed = pool.wait_bound(names)
    touched = {placed[n][0] for n in names}
    # The 8 pods fill the partly used nodes exactly; both free nodes stay whole.
    assert touched == {a, b, c}
    used = sorted((node, g) for node, gpus in placed.values() for g in gpus)
    assert len(used) == len(set(used)) == 8 + 4


def test_a_four_gpu_pod_gets_one_whole_nvlink_island(pool: NodePool):
    x, _y = pool.nodes(2, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    pool.occupy(x, [0])
    pool.pod("island", 4)
    placed = pool.wait_bound(["island"])
    assert placed["island"] == (x, (4, 5, 6, 7))  # best-fit node, the island nobody touched


def test_opportunistic_pods_go_to_the_least_utilized_gpus(pool: NodePool, kube: Kube):
    busy, calm = pool.nodes(2, 2)

    def publish(node: str, report: dict[int, tuple[float, int]], version: int) -> None:
        encoded = encode_utilization(report, version)
        kube.core.patch_node(node, {"metadata": {"annotations": {NODE_UTILIZATION: encoded}}})
        eventually(
            lambda: kube.core.read_node(node).metadata.annotations[NODE_UTILIZATION] == encoded
        )

    publish(busy, {0: (0.9, 20000), 1: (0.8, 20000)}, 1)
    publish(calm, {0: (0.1, 4000), 1: (0.7, 9000)}, 1)
    memory = {"gangshare.io/gpu-memory-mib": "4096"}
    pool.pod("opp-1", 1, resource="gangshare.io/gpu-share", annotations=memory)
    assert pool.wait_bound(["opp-1"])["opp-1"] == (calm, (0,))
    # The node agents publish a new picture: now GPU 1 of the other node is the idlest.
    publish(calm, {0: (0.95, 30000), 1: (0.9, 20000)}, 2)
    publish(busy, {0: (0.6, 20000), 1: (0.05, 2000)}, 2)
    pool.pod("opp-2", 1, resource="gangshare.io/gpu-share", annotations=memory)
    # The extender picks the node; on a node with no agent, every ledger counts the pod on the
    # GPU the node's own choice (the same core function) would give it.
    assert pool.wait_bound(["opp-2"])["opp-2"] == (busy, (1,))


def test_fifty_pods_at_once_on_exactly_fifty_free_gpus(pool: NodePool):
    pool.nodes(6, 8)
    pool.nodes(7, 2)  # one more node (the 7th) with 2 GPUs: 50 in all
    names = [f"burst-{i}" for i in range(50)]
    for name in names:
        pool.pod(name, 1)
    placed = pool.wait_bound(names, timeout=120)
    used = [(node, gpu) for node, gpus in placed.values() for gpu in gpus]
    assert len(used) == 50 and len(set(used)) == 50, "a GPU index was handed out twice"


def displaced_now(kube: Kube) -> dict[str, str]:
    """The gangs whose plan the cluster as it is now breaks, as the operator's ledger says."""
    raw = kube.api_client.sanitize_for_serialization
    snapshot = build_snapshot(
        [raw(n) for n in kube.core.list_node().items],
        [raw(p) for p in kube.core.list_pod_for_all_namespaces().items],
        kube.custom.list_cluster_custom_object(*TJ[:2], TJ[2])["items"],
    )
    return snapshot.displaced


def admit_by_hand(kube: Kube, namespace: str, name: str, placement: list[tuple[str, list[int]]]):
    """A TrainingJob whose admission is committed (status written as the operator writes it);
    no operator runs, so nothing else happens to it."""
    job = kube.custom.create_namespaced_custom_object(
        *TJ[:2],
        namespace,
        TJ[2],
        {
            "apiVersion": "gangshare.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {
                "workers": len(placement),
                "gpusPerWorker": len(placement[0][1]),
                "template": {"spec": {"containers": [{"name": "t", "image": "t:1"}]}},
            },
        },
    )
    status = {
        "phase": "Admitted",
        "attempt": 0,
        "admittedAt": "2026-01-01T00:00:00Z",
        "placement": [
            {"rank": r, "node": node, "gpus": gpus} for r, (node, gpus) in enumerate(placement)
        ],
    }
    kube.custom.patch_namespaced_custom_object_status(
        *TJ[:2], namespace, TJ[2], name, {"status": status}
    )
    return job


def worker_pod(job: dict[str, Any], rank: int, gpus: int, pool: NodePool) -> client.V1Pod:
    """A gang worker as the operator creates it: named, labelled, controlled by its job."""
    name = job["metadata"]["name"]
    body = gpu_pod(
        f"{name}-worker-{rank}",
        gpus,
        labels={
            "gangshare.io/job": name,
            "gangshare.io/rank": str(rank),
            "gangshare.io/attempt": "0",
        },
        scheduler="gangshare-scheduler",
        node_selector={"gangshare.io/pool": pool.label},
    )
    body.metadata.owner_references = [
        client.V1OwnerReference(
            api_version="gangshare.io/v1alpha1",
            kind="TrainingJob",
            name=name,
            uid=job["metadata"]["uid"],
            controller=True,
        )
    ]
    return body


def test_rejection_reasons_reach_the_pods_events(pool: NodePool, crd: Kube, namespace: str):
    kube = crd
    x, _y = pool.nodes(2, 4)
    pool.occupy(x, [0])
    job = admit_by_hand(kube, namespace, "stuck", [(x, [0, 1])])
    kube.core.create_namespaced_pod(namespace, worker_pod(job, 0, 2, pool))

    def failed_scheduling() -> Any:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=stuck-worker-0"
        )
        return next((e.message for e in events.items if e.reason == "FailedScheduling"), None)

    message = eventually(failed_scheduling, what="FailedScheduling event")
    assert f"planned GPU 0 on {x} is held by pod:{namespace}/holder-{x}-0" in message
    assert f"gang plan places this worker on {x}" in message


def test_an_admitted_plan_holds_its_gpus_before_its_pods_exist(
    pool: NodePool, crd: Kube, namespace: str
):
    """The two-ledgers race: a bare GPU pod arriving between a gang's admission and its pods."""
    kube = crd
    (x,) = pool.nodes(1, 4)
    job = admit_by_hand(kube, namespace, "early", [(x, [0, 1, 2, 3])])
    pool.pod("bare", 2)

    def refused() -> Any:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=bare"
        )
        return next((e.message for e in events.items if e.reason == "FailedScheduling"), None)

    assert "0 of 4 GPUs free, worker needs 2" in eventually(refused, what="bare pod refused")
    assert kube.core.read_namespaced_pod("bare", namespace).spec.node_name is None
    # The gang's own worker is placed on its plan; once the job is done, the bare pod fits.
    kube.core.create_namespaced_pod(namespace, worker_pod(job, 0, 4, pool))
    assert pool.wait_bound(["early-worker-0"])["early-worker-0"] == (x, (0, 1, 2, 3))
    kube.custom.patch_namespaced_custom_object_status(
        *TJ[:2], namespace, TJ[2], "early", {"status": {"phase": "Succeeded"}}
    )
    kube.core.delete_namespaced_pod("early-worker-0", namespace, grace_period_seconds=0)
    assert pool.wait_bound(["bare"])["bare"][0] == x


def test_a_burst_of_bare_pods_never_displaces_an_admitted_plan(
    pool: NodePool, crd: Kube, namespace: str
):
    """20 one-GPU pods at once beside a 2x4 plan whose workers do not exist yet (kube-scheduler
    counts nothing for them). The tightest place for a one-GPU pod is the last free GPU beside
    each rank's plan; what filter hands out is held until the binding comes back, so no two
    pods get one such GPU and the gang is never displaced."""
    kube = crd
    a, b, c = pool.nodes(3, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    pool.occupy(a, [0, 1, 2])
    pool.occupy(b, [0, 1, 2])
    admit_by_hand(kube, namespace, "big", [(a, [4, 5, 6, 7]), (b, [4, 5, 6, 7])])
    names = [f"burst-{i}" for i in range(20)]
    for name in names:
        pool.pod(name, 1)

    def bare_placed() -> dict[str, tuple[str, tuple[int, ...]]]:
        return {k: v for k, v in pool.placements().items() if k.startswith("burst-")}

    # 1 + 1 + 8 GPUs are free: ten pods bound, ten left waiting, and nothing more.
    eventually(lambda: len(bare_placed()) >= 10, timeout=90, what="ten of 20 pods bound")
    time.sleep(3)  # anything over-bound would show by now
    placed = bare_placed()
    per_node = {node: sum(1 for n, _ in placed.values() if n == node) for node in (a, b, c)}
    assert per_node == {a: 1, b: 1, c: 8}, per_node
    displaced = displaced_now(kube)
    assert f"{namespace}/big" not in displaced, displaced


def test_bind_binds_only_gangshares_own_pending_gpu_pods(
    pool: NodePool, kube: Kube, namespace: str
):
    (x,) = pool.nodes(1, 2)
    pool.pod("elsewhere", 1, scheduler="nobody-schedules-this")
    verbs = f"http://127.0.0.1:{kube.state.ports['extender']}/bind"
    uid = kube.core.read_namespaced_pod("elsewhere", namespace).metadata.uid
    body = {"PodName": "elsewhere", "PodNamespace": namespace, "PodUID": uid, "Node": x}
    request = urllib.request.Request(
        verbs, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["Error"] == (
        f"pod {namespace}/elsewhere belongs to scheduler 'nobody-schedules-this', not gangshare's"
    )
    assert kube.core.read_namespaced_pod("elsewhere", namespace).spec.node_name is None


def test_the_verbs_are_not_reachable_from_another_address(kube: Kube):
    port = kube.state.ports["extender"]
    outside = (
        next(
            (
                a
                for a in socket.gethostbyname_ex(socket.gethostname())[2]
                if not a.startswith("127.")
            ),
            None,
        )
        or _first_global_address()
    )
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.settimeout(5)
        sock.connect((outside, port))
    # Nor can they be configured to listen there without TLS client certificates.
    refused = subprocess.run(
        [sys.executable, "-m", "gangshare.cli", "extender", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: --host 0.0.0.0: the verbs bind pods to nodes")


def _first_global_address() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    pytest.fail("this machine has no non-loopback IPv4 address to connect from")


def _tls_files(folder: Path, host: str) -> dict[str, Path]:
    """A CA, a serving certificate for `host`, and a client certificate signed by the CA."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])

    def issue(name: str, key: Any, usage: Any, ca: bool = False, alt: Any = None) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if alt is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    files: dict[str, Path] = {}

    def write(tag: str, cert: Any, key: Any) -> None:
        files[f"{tag}.crt"] = folder / f"{tag}.crt"
        files[f"{tag}.crt"].write_bytes(cert.public_bytes(pem))
        if key is not None:
            files[f"{tag}.key"] = folder / f"{tag}.key"
            files[f"{tag}.key"].write_bytes(
                key.private_bytes(
                    pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )

    write("ca", issue("test-ca", ca_key, None, ca=True), None)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    alt = [x509.IPAddress(ipaddress.ip_address(host))]
    write("server", issue("extender", server_key, x509.OID_SERVER_AUTH, alt=alt), server_key)
    write("client", issue("kube-scheduler", client_key, x509.OID_CLIENT_AUTH), client_key)
    return files


def test_over_tls_the_verbs_answer_only_callers_with_a_client_certificate(
    kube: Kube, tmp_path: Path
):
    import ssl

    from gangshare.dev import processes

    outside = _first_global_address()
    files = _tls_files(tmp_path, outside)
    port, metrics = processes.free_port(), processes.free_port()
    extender = processes.start(
        "tls-extender",
        [
            sys.executable,
            "-m",
            "gangshare.cli",
            "extender",
            f"--kubeconfig={kube.state.kubeconfig}",
            f"--host={outside}",
            f"--port={port}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={metrics}",
            f"--tls-cert={files['server.crt']}",
            f"--tls-key={files['server.key']}",
            f"--client-ca={files['ca.crt']}",
        ],
        tmp_path / "logs",
        attached=True,
    )
    try:

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=2) as r:
                return bool(r.status == 200)

        eventually(ready, timeout=60, what="TLS extender ready")
        body = json.dumps(
            {
                "Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}},
                "NodeNames": [],
            }
        )
        request = urllib.request.Request(
            f"https://{outside}:{port}/filter",
            data=body.encode(),
            headers={"content-type": "application/json"},
        )
        with_cert = ssl.create_default_context(cafile=str(files["ca.crt"]))
        with_cert.load_cert_chain(str(files["client.crt"]), str(files["client.key"]))
        with urllib.request.urlopen(request, context=with_cert, timeout=10) as answer:
            assert answer.status == 200 and json.loads(answer.read())["Error"] == ""
        without = ssl.create_default_context(cafile=str(files["ca.crt"]))
        with (
            pytest.raises((ssl.SSLError, ConnectionResetError, urllib.error.URLError)),
            urllib.request.urlopen(request, context=without, timeout=10) as answer,
        ):
            answer.read()
    finally:
        processes.stop([extender])
