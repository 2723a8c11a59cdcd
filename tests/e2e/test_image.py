"""`make image` (src/gangshare/dev/release_image.py) against the Dockerfile's contract.

No base image can be pulled here, so the Dockerfile cannot be built; the image `make image`
builds instead is held to what the Dockerfile says (entrypoint, command, user, Python minor, the
wheel installed), and then run: its own interpreter, in its own file system (chroot) as user
65532, parses the very arguments the chart gives each role and starts each role's `--help`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gangshare.dev import binaries, release_image
from gangshare.dev.wheel import build_wheel, wheel_files

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gangshare"
SITE = f"usr/local/lib/python{release_image.python_minor()}/site-packages"


def dockerfile_final_stage() -> dict[str, Any]:
    """FROM, ENTRYPOINT, CMD and USER of the Dockerfile's last stage."""
    stage: dict[str, Any] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word == "FROM":
            stage = {"FROM": rest.split()[0]}
        elif word in ("ENTRYPOINT", "CMD"):
            stage[word] = json.loads(rest)
        elif word == "USER":
            stage[word] = rest.strip()
    return stage


@pytest.fixture(scope="module")
def image() -> release_image.BuiltImage:
    return release_image.gangshare_image()


@pytest.fixture(scope="module")
def rootfs(image: release_image.BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's layers unpacked in order, as the runtime's snapshotter stacks them."""
    root = tmp_path_factory.mktemp("image") / "rootfs"
    root.mkdir()
    with tarfile.open(image.tarball) as archive:
        [manifest] = json.load(_member(archive, "manifest.json"))
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=_member(archive, layer)) as tar:
                tar.extractall(root, filter="tar")
    return root


def _member(archive: tarfile.TarFile, name: str) -> Any:
    data = archive.extractfile(name)
    assert data is not None, name
    return data


def image_config(image: release_image.BuiltImage) -> dict[str, Any]:
    with tarfile.open(image.tarball) as archive:
        [manifest] = json.load(_member(archive, "manifest.json"))
        assert manifest["RepoTags"] == [image.ref]
        config: dict[str, Any] = json.load(_member(archive, manifest["Config"]))
    return config


def run_in_image(
    rootfs: Path, *argv: str, user: str = "65532:65532"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("chroot") or "chroot", f"--userspec={user}", str(rootfs), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/gangshare"},
    )


def test_the_image_runs_what_the_dockerfile_says(image: release_image.BuiltImage):
    dockerfile = dockerfile_final_stage()
    run = image_config(image)["config"]
    assert run["Entrypoint"] == dockerfile["ENTRYPOINT"] == ["gangshare"]
    assert run["Cmd"] == dockerfile["CMD"]
    assert run["User"] == dockerfile["USER"] == "65532:65532"
    minor = re.fullmatch(r"python:(\d+\.\d+)-slim", dockerfile["FROM"])
    assert minor is not None, dockerfile["FROM"]
    assert minor.group(1) == release_image.python_minor()
    [path] = [e.removeprefix("PATH=") for e in run["Env"] if e.startswith("PATH=")]
    assert "/usr/local/bin" in path.split(":")


def test_the_image_holds_every_file_of_the_checkouts_wheel(rootfs: Path, tmp_path: Path):
    wheel = build_wheel(tmp_path / "wheel")
    files = wheel_files(wheel)
    # Package data and the generated kubelet stubs are in the wheel itself...
    assert "gangshare/dev/data/demo-cluster.yaml" in files
    assert "gangshare/agent/kubeletapi/deviceplugin_pb2.py" in files
    # ...and everything the wheel installs is in the image, byte for byte where it is code.
    site = rootfs / SITE
    missing = [f for f in files if ".dist-info/" not in f and not (site / f).is_file()]
    assert missing == []
    source = ROOT / "src" / "gangshare" / "agent" / "kubeletapi" / "deviceplugin_pb2.py"
    installed = site / "gangshare" / "agent" / "kubeletapi" / "deviceplugin_pb2.py"
    assert installed.read_bytes() == source.read_bytes()
    script = (rootfs / "usr/local/bin/gangshare").read_text().splitlines()[0]
    assert script == f"#!/usr/local/bin/python{release_image.python_minor()}"
    passwd = (rootfs / "etc/passwd").read_text()
    assert re.search(r"^gangshare:x:65532:65532:", passwd, re.M), passwd


def chart_roles() -> dict[str, list[str]]:
    """Each gangshare container of the chart's default render: its arguments."""
    helm = binaries.bin_dir(build=True) / "helm"
    out = subprocess.run(
        [str(helm), "template", "gangshare", str(CHART), "-n", "gangshare-system"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    roles = {}
    for doc in yaml.safe_load_all(out):
        if not doc or doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if container["image"].split(":")[0].endswith("/gangshare"):
                roles[container["args"][0]] = container["args"]
    return roles


def test_each_role_the_chart_runs_parses_and_starts_in_the_image(rootfs: Path):
    roles = chart_roles()
    assert sorted(roles) == ["agent", "extender", "operator"]
    parse = (
        "import json, sys\n"
        "from gangshare.cli import build_parser\n"
        "for argv in json.loads(sys.argv[1]).values():\n"
        "    build_parser().parse_args(argv)\n"
        "print('parsed', len(json.loads(sys.argv[1])))\n"
    )
    done = run_in_image(rootfs, "python3", "-c", parse, json.dumps(roles))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "parsed 3"
    for role in roles:
        done = run_in_image(rootfs, "gangshare", role, "--help")
        assert done.returncode == 0, (role, done.stderr)
        assert f"usage: gangshare {role}" in done.stdout


def test_the_images_byte_code_is_current(rootfs: Path):
    """The chart's root file systems are read-only, so byte code must be compiled into the image
    and valid there (an unwritable stale cache would recompile every start). Run as root, where
    the file system is writable: a stale .pyc would be rewritten, a missing one written."""
    modules = [
        "gangshare.operator.main",
        "gangshare.extender.main",
        "gangshare.agent.main",
        "gangshare.agent.kubeletapi.deviceplugin_pb2_grpc",
        "gangshare.sim.cli",
    ]
    code = (
        "import importlib, sys\n"
        "sys.dont_write_bytecode = False\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import gangshare.operator.main as op\n"
        "print(op.__cached__)\n"
    )
    before = {p: p.stat().st_mtime_ns for p in rootfs.rglob("*.pyc")}
    done = run_in_image(rootfs, "python3", "-c", code, user="0:0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"/{SITE}/gangshare/operator/__pycache__/")
    after = {p: p.stat().st_mtime_ns for p in rootfs.rglob("*.pyc")}
    assert after == before


def test_the_scheduler_image_is_the_built_kube_scheduler(tmp_path: Path):
    bins = binaries.bin_dir(build=True)
    image = release_image.scheduler_image(bins)
    assert image.ref == f"{release_image.SCHEDULER_REPOSITORY}:{bins.parent.name}"
    with tarfile.open(image.tarball) as archive:
        [manifest] = json.load(_member(archive, "manifest.json"))
        [layer] = manifest["Layers"]
        with tarfile.open(fileobj=_member(archive, layer)) as tar:
            data = _member(tar, "usr/local/bin/kube-scheduler").read()
    assert data == (bins / "kube-scheduler").read_bytes()
    # The same bytes give the same archive: cached by content, not rebuilt.
    assert release_image.scheduler_image(bins) == image
