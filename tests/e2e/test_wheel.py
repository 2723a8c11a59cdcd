"""The wheel of this checkout, installed into a fresh virtual environment, works on its own.

What the Dockerfile and the release image install is `pip wheel .` of the checkout
(gangshare.dev.wheel), so a module, a data file or a generated stub missing from the wheel would
only show in the image. Here the wheel goes into a new `python -m venv` (its dependencies from
the package index) and everything runs from a folder outside the checkout, with no PYTHONPATH
and no checkout folder on PATH: nothing can come from the source tree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gangshare.dev.wheel import REQUIRED_STUBS, build_wheel, wheel_files

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "src" / "gangshare"
SUBCOMMANDS = ("plan", "queue", "simulate", "dev", "operator", "extender", "agent", "demo")
COMPONENTS = (
    "gangshare.operator.main",
    "gangshare.extender.main",
    "gangshare.agent.main",
    "gangshare.agent.kubeletapi.deviceplugin_pb2",
    "gangshare.sim.cli",
)
# Files under src/gangshare that are not the package's: the stubs' generation stamp.
NOT_SHIPPED = {"agent/kubeletapi/.generated"}


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    package: Path  # the installed gangshare folder in the venv's site-packages
    cwd: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def gangshare(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "gangshare"), *args)


def _outside_checkout(path: str) -> bool:
    resolved = Path(path).resolve()
    return not resolved.is_relative_to(REPO) and resolved != Path(sys.executable).parent.resolve()


def clean_env(venv: Path) -> dict[str, str]:
    """This process's environment less PYTHON* and VIRTUAL_ENV, with no checkout folder on PATH.

    PIP_* stays: it says where the package index is."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PYTHON") and key != "VIRTUAL_ENV"
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and _outside_checkout(p)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    return env


def checked(done: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    assert not tmp.resolve().is_relative_to(REPO)
    wheel = build_wheel(tmp / "dist")
    venv, cwd = tmp / "venv", tmp / "elsewhere"
    cwd.mkdir()
    env = clean_env(venv)
    base = Installed(wheel, venv, Path(), cwd, env)
    # No pip inside the new venv: this process's pip installs into it (`pip --python`), which
    # saves ensurepip, and --no-compile saves half a minute of byte-compiling the dependencies.
    checked(
        base.run(sys.executable, "-m", "venv", "--without-pip", str(venv), timeout=120),
        "python -m venv",
    )
    python = str(venv / "bin" / "python")
    install = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    checked(
        base.run(*install, "--no-compile", str(wheel), timeout=900), f"pip install {wheel.name}"
    )
    where = checked(
        base.run(python, "-c", "import gangshare; print(gangshare.__file__)"), "import gangshare"
    )
    package = Path(where.stdout.strip()).parent
    # Installed into the fresh venv, not picked up from the checkout.
    assert package.resolve().is_relative_to(venv.resolve()), package
    assert package.parent.name == "site-packages", package
    yield Installed(wheel, venv, package, cwd, env)


def test_help_lists_every_subcommand(installed: Installed) -> None:
    done = checked(installed.gangshare("--help"), "gangshare --help")
    listed = re.findall(r"^    (\w+) ", done.stdout, flags=re.MULTILINE)
    assert listed == list(SUBCOMMANDS), done.stdout


def test_plan_runs_on_the_embedded_demo_cluster(installed: Installed) -> None:
    done = checked(installed.gangshare("plan", "--workers", "2", "--gpus", "8"), "gangshare plan")
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["RANK", "NODE", "RACK", "GPUS"], done.stdout
    rows = [line.split() for line in lines[1:-1]]
    assert [row[0] for row in rows] == ["0", "1"], done.stdout
    # Two of the demo cluster's 8-GPU H100 nodes, all eight GPUs each.
    assert all(row[1].startswith("h100-") and row[3] == "0,1,2,3,4,5,6,7" for row in rows)
    assert lines[-1].startswith("2 node(s), 1 rack(s)"), done.stdout


def test_every_installed_module_imports(installed: Installed) -> None:
    report = installed.cwd / "imports.json"
    script = textwrap.dedent(
        f"""
        import importlib, json, pkgutil, traceback
        import gangshare

        walk_errors = []
        names = ["gangshare"] + [
            m.name
            for m in pkgutil.walk_packages(gangshare.__path__, "gangshare.", walk_errors.append)
        ]
        failed = {{}}
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:
                failed[name] = traceback.format_exc(limit=-4)
        with open({str(report)!r}, "w") as out:
            json.dump({{"path": list(gangshare.__path__), "modules": names,
                       "failed": failed, "walk_errors": walk_errors}}, out)
        """
    )
    checked(
        installed.run(str(installed.venv / "bin" / "python"), "-c", script, timeout=300),
        "the import walk",
    )
    result = json.loads(report.read_text())
    assert [Path(p).resolve() for p in result["path"]] == [installed.package.resolve()]
    failed = result["failed"]
    assert not failed, (
        "modules that do not import from the installed wheel: "
        + ", ".join(failed)
        + "\n\n"
        + "\n".join(failed.values())
    )
    assert result["walk_errors"] == []
    modules = set(result["modules"])
    assert set(COMPONENTS) <= modules, sorted(set(COMPONENTS) - modules)
    # The walk saw every module the wheel holds, and nothing else.
    in_wheel = {
        name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in wheel_files(installed.wheel)
        if name.startswith("gangshare/") and name.endswith(".py")
    }
    assert modules == in_wheel


def test_data_files_and_stubs_are_installed(installed: Installed) -> None:
    data = installed.package / "dev" / "data"
    for name in ("demo-cluster.yaml", "kwok-stages.yaml"):
        assert (data / name).read_bytes() == (SOURCES / "dev" / "data" / name).read_bytes()
    stubs = installed.package / "agent" / "kubeletapi"
    for name in (*REQUIRED_STUBS, "podresources_pb2_grpc.py", "deviceplugin_pb2.pyi"):
        assert (stubs / name).is_file(), name
    assert (installed.package / "py.typed").is_file()
    done = checked(installed.gangshare("dev", "--help"), "gangshare dev --help")
    actions = re.findall(r"^    (\w+) ", done.stdout, flags=re.MULTILINE)
    assert actions == ["up", "down", "status", "build"], done.stdout


def test_the_wheel_holds_every_file_of_the_package_sources(installed: Installed) -> None:
    """A file added under src/gangshare that the package-data patterns miss fails here."""
    shipped = set(wheel_files(installed.wheel))
    sources = {
        path.relative_to(SOURCES).as_posix()
        for path in SOURCES.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    missing = sorted(sources - NOT_SHIPPED - {s.removeprefix("gangshare/") for s in shipped})
    assert missing == [], f"in src/gangshare but not in {installed.wheel.name}: {missing}"
