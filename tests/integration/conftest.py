"""A running operator per test (the CRD comes from the session fixture in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kube import Kube, OperatorProcess


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
