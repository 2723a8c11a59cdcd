"""A second local image for the real node: busybox plus this machine's Python and the SDK.

Training containers in the coordinator's tests run real Python with `gangshare.sdk`, and no
registry is reachable, so the image is assembled from the running interpreter: its binary and
the shared libraries `ldd` names, its standard library (tests, GUI and packaging tools left
out) at the same absolute paths, and `src/gangshare/sdk` alone under /opt/gangshare. Cached
by a hash of all of that.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from gangshare.dev.realnode_image import (
    BUSYBOX,
    ImageError,
    add_dir,
    add_file,
    busybox_applets,
    busybox_layer,
    cache_dir,
    docker_archive,
    store,
)

PY_IMAGE = "gangshare-sdk-test:1"
PY_IMAGE_REF = f"docker.io/library/{PY_IMAGE}"
PYTHON = "/usr/local/bin/python3"
RECIPE = "1"
SKIP = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "__pycache__",
        "site-packages",
        "dist-packages",
        "unittest",
        "pydoc_data",
    }
)
SDK = Path(__file__).resolve().parents[1] / "sdk"


def python_image_tarball() -> Path:
    files = _python_files()
    sdk = sorted(SDK.glob("*.py"))
    busybox = BUSYBOX.read_bytes()
    digest = hashlib.sha256(RECIPE.encode() + busybox)
    for path in files + sdk:
        digest.update(str(path).encode() + path.read_bytes())
    path = cache_dir() / f"gangshare-sdk-test-{digest.hexdigest()[:16]}.tar"
    if path.exists():
        return path
    layers = [busybox_layer(busybox, busybox_applets(BUSYBOX)), _python_layer(files, sdk)]
    store(path, docker_archive(layers, PY_IMAGE, ("PYTHONPATH=/opt/gangshare",)))
    for old in cache_dir().glob("gangshare-sdk-test-*.tar"):
        if old != path:
            old.unlink(missing_ok=True)  # an earlier SDK's: never used again
    return path


def _python_files() -> list[Path]:
    executable = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = [executable, *_libraries(executable)]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith("config-"))
        for name in sorted(names):
            if name.endswith((".py", ".so")):
                files.append(Path(root) / name)
    for module in (stdlib / "lib-dynload").glob("*.so"):
        if not module.name.startswith(("_tkinter", "_curses", "readline")):
            files.extend(_libraries(module))
    return sorted(set(files))


def _libraries(binary: Path) -> list[Path]:
    listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise ImageError(f"ldd {binary} failed: {listed.stderr.strip()}")
    out = []
    for line in listed.stdout.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/"):
                out.append(Path(part))
                break
    return out


def _python_layer(files: list[Path], sdk: list[Path]) -> bytes:
    out = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in files:
            # Links are copied as the files they lead to: their targets may sit elsewhere on
            # this host (a merged /usr) than the image's copy.
            _parents(tar, str(path).lstrip("/"), made)
            add_file(tar, str(path).lstrip("/"), path.read_bytes(), mode=0o755)
        python = str(Path(sys.executable).resolve())
        _parents(tar, PYTHON.lstrip("/"), made)
        link = tarfile.TarInfo(PYTHON.lstrip("/"))
        link.type = tarfile.SYMTYPE
        link.linkname = python
        tar.addfile(link)
        package = "opt/gangshare/gangshare"
        _parents(tar, f"{package}/sdk/x", made)
        add_file(tar, f"{package}/__init__.py", b"")
        for path in sdk:
            add_file(tar, f"{package}/sdk/{path.name}", path.read_bytes())
    return out.getvalue()


def _parents(tar: tarfile.TarFile, name: str, made: set[str]) -> None:
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        folder = "/".join(parts[:i])
        if folder not in made and folder not in ("bin", "dev", "etc", "proc", "sys", "root", "tmp"):
            made.add(folder)
            add_dir(tar, folder)
