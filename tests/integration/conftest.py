"""The TrainingJob CRD installed once per session, and a running operator per test."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube import Kube, OperatorProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crd(kube: Kube) -> Kube:
    subprocess.run(
        kube.kubectl("apply", "-f", str(ROOT / "crds" / "trainingjob.yaml")),
        check=True,
        capture_output=True,
    )
    subprocess.run(
        kube.kubectl(
            "wait", "--for=condition=Established", "crd/trainingjobs.gangshare.io", "--timeout=60s"
        ),
        check=True,
        capture_output=True,
    )
    return kube


@pytest.fixture
def operator(
    crd: Kube, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(crd, tmp_path).start()
    yield process
    process.stop()
    logs = process.logs()
    if request.node.stash.get(FAILED, False):
        print(logs[-6000:])
    # A pass that failed for any reason is a bug even when the test's own checks held.
    assert "scheduling pass failed" not in logs, logs[logs.index("scheduling pass failed") - 200 :][
        :3000
    ]


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report
