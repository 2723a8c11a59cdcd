"""`gangshare agent` refuses bad input with one line naming it, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangshare.cli import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--node-name: required"),
        (["--node-name", "n", "--nvml", "fake"], "--fake-spec: required with --nvml fake"),
        (["--node-name", "n", "--share-slots", "0"], "--share-slots: must be at least 1, got 0"),
        (["--node-name", "n", "--publish-interval", "0"], "--publish-interval: must be positive"),
        (
            ["--node-name", "n", "--nvml", "fake", "--fake-spec", "{spec}"],
            "nodePools[0].gpusPerNode: must be between 1 and 64, got 0",
        ),
    ],
)
def test_bad_input_is_one_line_that_names_it(
    args: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    spec = tmp_path / "gpus.yaml"
    spec.write_text("nodePools: [{name: n, gpusPerNode: 0}]")
    code = main(["agent", *[a.format(spec=spec) for a in args]])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gangshare agent: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1
