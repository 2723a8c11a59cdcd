"""gangshare's release images, built offline: what `make image` writes and the install test runs.

No base image can be pulled on the project's machines, so the Dockerfile's contract is met by
assembling the same file system from this machine: python:3.11-slim's layout (CPython under
/usr/local, libpython found through /etc/ld.so.cache) from the running interpreter and the
system libraries `ldd` names, then the wheel of this checkout with its dependencies from PyPI
installed into /usr/local as the Dockerfile's `pip install` does, byte code compiled ahead
(the chart's root file systems are read-only), entrypoint `gangshare`, user 65532. The chart's
kube-scheduler image holds the kube-scheduler binary scripts/build-k8s.sh builds, at the path
of the upstream image. Both are docker-archives that `ctr images import` takes, cached under
~/.cache/gangshare/images by what goes into them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gangshare.dev import binaries
from gangshare.dev.imagefs import Rootfs, file_digest, layer_tarball, loaded_libraries
from gangshare.dev.realnode_image import BUSYBOX, busybox_applets, cache_dir, write_docker_archive
from gangshare.dev.wheel import build_wheel

# Never pulled: the chart's CI values name these, and the install test imports them first.
GANGSHARE_REPOSITORY = "gangshare.local/gangshare"
GANGSHARE_TAG = "dev"
SCHEDULER_REPOSITORY = "gangshare.local/kube-scheduler"
# The Dockerfile's contract (tests/unit/test_release_image.py holds the two to each other).
ENTRYPOINT = ["gangshare"]
CMD = ["--help"]
USER = "65532:65532"
USER_NAME = "gangshare"
PYTHON_PREFIX = "usr/local"
# Part of every cache key: bump when what goes into an image changes without its inputs changing.
RECIPE = "1"
# Standard-library folders no component imports (tests, GUIs, packaging tools, build files).
STDLIB_SKIP = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__"}
)


class ReleaseImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    tarball: Path


def python_minor() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def gangshare_image(root: Path | None = None) -> BuiltImage:
    """The gangshare image of this checkout, built once per content (sources, interpreter)."""
    root = root or binaries.repo_root()
    ref = f"{GANGSHARE_REPOSITORY}:{GANGSHARE_TAG}"
    key = _source_key(root)
    path = cache_dir() / f"gangshare-{key}.tar"
    if path.exists():
        return BuiltImage(ref, path)
    with tempfile.TemporaryDirectory(dir=_workdir()) as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "wheel", root)
        base, app = Rootfs(work / "base"), Rootfs(work / "app")
        _stage_user(base)
        _stage_busybox(base)
        python = _stage_python(base)
        _install_wheel(app, wheel, python)
        _stage_libraries(base, [base.root, app.root])
        _compile(base, app)
        layers = [layer_tarball(base, work / "base.tar"), layer_tarball(app, work / "app.tar")]
        write_docker_archive(
            path,
            layers,
            ref,
            ("LANG=C.UTF-8", f"PYTHON_VERSION={sys.version.split()[0]}"),
            Entrypoint=ENTRYPOINT,
            Cmd=CMD,
            User=USER,
            WorkingDir="/",
        )
    _prune("gangshare-", path)
    return BuiltImage(ref, path)


def scheduler_image(bins: Path) -> BuiltImage:
    """kube-scheduler at /usr/local/bin, as registry.k8s.io/kube-scheduler has it."""
    binary = bins / "kube-scheduler"
    if not binary.exists():
        raise ReleaseImageError(f"no kube-scheduler in {bins}: run scripts/build-k8s.sh")
    version = bins.parent.name  # the build cache is keyed by the Kubernetes version
    ref = f"{SCHEDULER_REPOSITORY}:{version}"
    key = hashlib.sha256((RECIPE + ref + file_digest(binary)).encode()).hexdigest()[:16]
    path = cache_dir() / f"kube-scheduler-{key}.tar"
    if path.exists():
        return BuiltImage(ref, path)
    with tempfile.TemporaryDirectory(dir=_workdir()) as tmp:
        fs = Rootfs(Path(tmp) / "fs")
        _stage_user(fs)
        fs.copy(binary, "usr/local/bin/kube-scheduler", mode=0o755)
        layer = layer_tarball(fs, Path(tmp) / "layer.tar")
        write_docker_archive(
            path, [layer], ref, Entrypoint=["/usr/local/bin/kube-scheduler"], Cmd=[], User=USER
        )
    _prune("kube-scheduler-", path)
    return BuiltImage(ref, path)


# ----- the file system ----------------------------------------------------------------------


def _stage_user(fs: Rootfs) -> None:
    uid, gid = (int(n) for n in USER.split(":"))
    fs.write(
        "etc/passwd",
        f"root:x:0:0:root:/root:/bin/sh\n{USER_NAME}:x:{uid}:{gid}::/home/"
        f"{USER_NAME}:/usr/sbin/nologin\n".encode(),
    )
    fs.write("etc/group", f"root:x:0:\n{USER_NAME}:x:{gid}:\n".encode())
    fs.mkdir(f"home/{USER_NAME}", owner=(uid, gid))
    fs.mkdir("tmp", mode=0o1777)


def _stage_busybox(fs: Rootfs) -> None:
    # A shell and core tools for whoever debugs a pod (the slim base has them too).
    fs.copy(BUSYBOX, "bin/busybox", mode=0o755)
    for applet in busybox_applets(BUSYBOX):
        fs.symlink(f"bin/{applet}", "busybox")


def _stage_python(fs: Rootfs) -> Path:
    """The running interpreter under /usr/local; returns its path in the image."""
    minor = python_minor()
    executable = Path(sys.executable).resolve()
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    fs.copy(executable, f"{PYTHON_PREFIX}/bin/python{minor}", mode=0o755)
    fs.symlink(f"{PYTHON_PREFIX}/bin/python3", f"python{minor}")
    fs.symlink(f"{PYTHON_PREFIX}/bin/python", f"python{minor}")
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        soname = f"libpython{minor}.so.1.0"
        fs.copy((libdir / library).resolve(), f"{PYTHON_PREFIX}/lib/{soname}", mode=0o755)
    fs.write("etc/ld.so.conf", f"/{PYTHON_PREFIX}/lib\n".encode())
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    target = f"{PYTHON_PREFIX}/lib/python{minor}"
    for folder, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in STDLIB_SKIP and d != "site-packages" and not d.startswith("config-")
        )
        relative = Path(folder).relative_to(stdlib)
        for name in sorted(names):
            if name.endswith((".py", ".so")):
                mode = 0o755 if name.endswith(".so") else 0o644
                fs.copy(Path(folder) / name, f"{target}/{relative}/{name}", mode=mode)
    fs.mkdir(f"{target}/site-packages")
    return Path("/") / PYTHON_PREFIX / "bin" / f"python{minor}"


def _install_wheel(app: Rootfs, wheel: Path, python: Path) -> None:
    """The Dockerfile's `pip install` of the wheel, into the image's /usr/local."""
    prefix = app.root / PYTHON_PREFIX
    _python_module(
        "pip",
        "install",
        "--quiet",
        "--no-compile",
        "--ignore-installed",
        "--no-warn-script-location",
        "--prefix",
        str(prefix),
        str(wheel),
    )
    # pip wrote this machine's interpreter into the scripts' first lines.
    for script in sorted((prefix / "bin").iterdir()):
        text = script.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:
            script.write_bytes(f"#!{python}".encode() + b"\n" + text.split(b"\n", 1)[1])


def _stage_libraries(base: Rootfs, roots: list[Path]) -> None:
    """Every shared library an image binary loads from outside the image, at its own path,
    then /etc/ld.so.cache, as Debian's ldconfig writes it, so /usr/local/lib is searched."""
    objects = [p for r in roots for p in r.rglob("*") if p.is_file() and _is_elf(p)]
    own = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent").resolve()
    for library in loaded_libraries(objects, inside=roots):
        if library.resolve().parent == own:
            continue  # libpython: staged under /usr/local/lib
        base.copy(library.resolve(), str(library).lstrip("/"), mode=0o755)
    done = subprocess.run(
        ["ldconfig", "-r", str(base.root)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ReleaseImageError(f"ldconfig -r failed: {done.stderr.strip()}")


def _compile(base: Rootfs, app: Rootfs) -> None:
    # Unchecked-hash byte code stays valid whatever the files' times in the layer (all zero).
    for fs in (base, app):
        lib = fs.root / PYTHON_PREFIX / "lib"
        _python_module(
            "compileall",
            "-q",
            *("-j", "0", "--invalidation-mode", "unchecked-hash"),
            # The paths recorded in the byte code are the image's, not the staging folder's.
            *("-s", str(fs.root), "-p", "/"),
            str(lib),
        )


def _python_module(module: str, *args: str) -> None:
    """`python -m module args` with this interpreter (the image's, relocated)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-2000:]
        raise ReleaseImageError(f"python -m {module} failed: {output}")


def _is_elf(path: Path) -> bool:
    with path.open("rb") as data:
        return data.read(4) == b"\x7fELF"


def _source_key(root: Path) -> str:
    digest = hashlib.sha256(RECIPE.encode() + sys.version.encode())
    digest.update(file_digest(Path(sys.executable).resolve()).encode())
    for name in ("pyproject.toml", "README.md"):
        digest.update(name.encode() + (root / name).read_bytes())
    src = root / "src" / "gangshare"
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(src)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _workdir() -> Path:
    work = cache_dir() / "work"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _prune(prefix: str, keep: Path) -> None:
    # Only this builder's own names: gangshare-test-* and gangshare-sdk-test-* are the real
    # node's test images.
    own = re.compile(re.escape(prefix) + r"[0-9a-f]{16}\.tar")
    for old in cache_dir().glob(f"{prefix}*.tar"):
        if old != keep and own.fullmatch(old.name):
            old.unlink(missing_ok=True)  # an earlier build's: never used again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gangshare.dev.release_image",
        description="Build gangshare's image and the chart's kube-scheduler image offline.",
    )
    parser.add_argument("--only", choices=("gangshare", "kube-scheduler"), default=None)
    args = parser.parse_args(argv)
    try:
        built = []
        if args.only in (None, "gangshare"):
            built.append(gangshare_image())
        if args.only in (None, "kube-scheduler"):
            built.append(scheduler_image(binaries.bin_dir(build=False)))
    except (ReleaseImageError, OSError, RuntimeError) as err:
        print(f"make image: {err}", file=sys.stderr)
        return 1
    for image in built:
        print(f"{image.ref}\t{image.tarball}")
    print("import with: ctr -n k8s.io images import <tarball>", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
