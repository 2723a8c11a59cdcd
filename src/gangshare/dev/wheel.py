"""gangshare's wheel, built from this checkout: what the Dockerfile and `make image` install.

The kubelet API stubs are build output (scripts/gen-kubelet-api.sh, `make protos`), not
sources, so a wheel built before them would ship an agent that cannot import; building refuses
instead. The wheel's file list is what the image tests compare with the image's contents.

The build runs on a fresh copy of what the Dockerfile copies (pyproject.toml, README.md, src/),
never in the checkout: setuptools keeps build/lib between builds and packs whatever is left
there, so a module deleted from src/ would still ship, and two builds of one tree would race.
tests/e2e/test_wheel.py installs the wheel into a fresh virtual environment and runs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gangshare.dev.binaries import repo_root

STUBS = Path("src/gangshare/agent/kubeletapi")
REQUIRED_STUBS = ("deviceplugin_pb2.py", "deviceplugin_pb2_grpc.py", "podresources_pb2.py")
# What the Dockerfile's build stage copies; the build sees nothing else of the checkout.
SOURCES = ("pyproject.toml", "README.md", "src")


class WheelError(RuntimeError):
    pass


def missing_stubs(root: Path | None = None) -> list[str]:
    stubs = (root or repo_root()) / STUBS
    return [name for name in REQUIRED_STUBS if not (stubs / name).exists()]


def build_wheel(out_dir: Path, root: Path | None = None, python: str = sys.executable) -> Path:
    """`pip wheel --no-deps` of the checkout into `out_dir`; returns the wheel's path.

    Without build isolation (offline, about 3 s): `python` must have the build backend, which
    the dev extras carry (setuptools).
    """
    root = root or repo_root()
    missing = missing_stubs(root)
    if missing:
        raise WheelError(f"no kubelet API stubs ({', '.join(missing)}): run `make protos` first")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("gangshare-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gangshare-wheel-") as tmp:
        tree = Path(tmp) / "gangshare"
        _copy_sources(root, tree)
        pip = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        done = subprocess.run(
            [*pip, "-w", str(out_dir.resolve()), str(tree)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    wheels = sorted(out_dir.glob("gangshare-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise WheelError(f"pip wheel failed: {done.stderr.strip()[-2000:]}")
    return wheels[0]


def _copy_sources(root: Path, tree: Path) -> None:
    tree.mkdir(parents=True)
    for name in SOURCES:
        source = root / name
        if source.is_dir():
            shutil.copytree(
                source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(source, tree / name)


def wheel_files(wheel: Path) -> list[str]:
    """Every file the wheel installs, as paths relative to site-packages."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted(n for n in archive.namelist() if not n.endswith("/"))
