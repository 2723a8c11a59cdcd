"""The what-if `gangshare plan` command on the embedded demo cluster spec."""

from pathlib import Path

from gangshare.cli import main

DEMO = (
    Path(__file__).resolve().parents[2] / "src" / "gangshare" / "dev" / "data" / "demo-cluster.yaml"
)


def test_plan_prints_a_placement_table(capsys):
    assert main(["plan", "--cluster", str(DEMO), "--workers", "2", "--gpus", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["RANK", "NODE", "RACK", "GPUS"]
    assert [line.split()[0] for line in out[1:3]] == ["0", "1"]
    assert out[-1] == "2 node(s), 1 rack(s) (topology preference relaxed)"


def test_plan_without_a_spec_uses_the_embedded_demo_cluster(capsys):
    assert main(["plan", "--cluster", str(DEMO), "--workers", "3", "--gpus", "4"]) == 0
    from_file = capsys.readouterr().out
    assert main(["plan", "--workers", "3", "--gpus", "4"]) == 0
    assert capsys.readouterr().out == from_file
    assert main(["plan", "--workers", "9", "--gpus", "8"]) == 1


def test_plan_reports_unschedulable_with_the_reason(capsys):
    assert main(["plan", "--cluster", str(DEMO), "--workers", "9", "--gpus", "8"]) == 1
    assert capsys.readouterr().out.startswith("unschedulable: needs 9 worker(s) x 8 GPU(s)")


def test_bad_spec_is_a_clear_error(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("nodePools:\n  - name: x\n    gpusPerNode: -1\n")
    assert main(["plan", "--cluster", str(spec)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: nodePools[0].gpusPerNode: must be between 1 and 64, got -1"
    )


def test_a_service_link_variable_in_a_flag_default_is_a_clear_error(monkeypatch, capsys):
    """Kubernetes sets <SERVICE>_PORT=tcp://ip:port in pods of a namespace with that Service
    (a Service `gangshare-extender` gives GANGSHARE_EXTENDER_PORT): the flag is named, no
    traceback, and every other command still parses."""
    monkeypatch.setenv("GANGSHARE_EXTENDER_PORT", "tcp://10.96.102.89:8889")
    assert main(["plan", "--workers", "1", "--gpus", "1"]) == 0
    try:
        main(["extender", "--scheduler-name", "s"])
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("a port of tcp://... was accepted")
    err = capsys.readouterr().err
    assert "argument --port: invalid int value: 'tcp://10.96.102.89:8889'" in err
    assert "Traceback" not in err
