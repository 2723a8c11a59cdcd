"""The real node's only container image, built locally: no registry is reachable from here.

A docker-archive tarball (what `docker save` writes) with one layer: Debian's static busybox
and a symlink per applet. `ctr images import` takes it as is. The same image is the pod
sandbox ("pause") image, so nothing is ever pulled and the kubelet's image GC leaves it
alone (containerd pins the sandbox image).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from gangshare.dev.imagefs import file_digest

IMAGE = "gangshare-test:1"
# `ctr images import` stores a short name the way the CRI resolves it for a pod's `image:`.
IMAGE_REF = f"docker.io/library/{IMAGE}"
BUSYBOX = Path("/bin/busybox")
# Part of the cache key: bump when the layout below changes.
RECIPE = "1"
# Fixed, so the same busybox always gives the same bytes (and the same image ID).
EPOCH = 0


class ImageError(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("GANGSHARE_CACHE") or str(Path.home() / ".cache" / "gangshare")
    return Path(base) / "images"


def image_tarball(busybox: Path = BUSYBOX) -> Path:
    """The image as a docker-archive, built once per busybox binary and cached."""
    try:
        binary = busybox.read_bytes()
    except OSError as err:
        raise ImageError(
            f"cannot read {busybox} ({err}): run scripts/install-node-deps.sh (busybox-static)"
        ) from None
    key = hashlib.sha256(binary + RECIPE.encode()).hexdigest()[:16]
    path = cache_dir() / f"gangshare-test-{key}.tar"
    if path.exists():
        return path
    store(path, docker_archive([busybox_layer(binary, busybox_applets(busybox))], IMAGE))
    return path


def store(path: Path, data: bytes) -> None:
    """Write a cached image. Atomic, so a concurrent or interrupted build never leaves half a
    tarball under the key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial.{os.getpid()}")
    partial.write_bytes(data)
    partial.replace(path)


def busybox_applets(busybox: Path) -> list[str]:
    listed = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=False, timeout=10
    )
    if listed.returncode != 0:
        raise ImageError(f"{busybox} --list failed: {listed.stderr.strip()}")
    names = {n for n in listed.stdout.split() if n and "/" not in n}
    return sorted(names - {"busybox"})


def docker_archive(
    layers: list[bytes], image: str, env: tuple[str, ...] = (), **config: object
) -> bytes:
    """A docker-archive of in-memory layers (small test images)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, layer in enumerate(layers):
            path = Path(tmp) / f"{i}.tar"
            path.write_bytes(layer)
            paths.append(path)
        out = Path(tmp) / "image.tar"
        write_docker_archive(out, paths, image, env, **config)
        return out.read_bytes()


def write_docker_archive(
    path: Path, layers: list[Path], image: str, env: tuple[str, ...] = (), **config: object
) -> None:
    """What `docker save` writes, from layer tarballs on disk; `config` adds or replaces keys of
    the image's run config (Entrypoint, Cmd, User, ...). Everything in it is fixed (no dates, no
    host names), so the same layers always give the same image ID."""
    diff_ids = ["sha256:" + file_digest(layer) for layer in layers]
    run_config: dict[str, object] = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *env],
        # What the pod sandbox runs; test containers bring their own command.
        "Cmd": ["sleep", "1000000"],
        **config,
    }
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": run_config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    names = [d.removeprefix("sha256:") + "/layer.tar" for d in diff_ids]
    manifest = [{"Config": config_name, "RepoTags": [image], "Layers": names}]
    partial = path.with_suffix(f".partial.{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        add_file(tar, config_name, config_bytes)
        for name, layer in zip(names, layers, strict=True):
            add_dir(tar, name.split("/")[0])
            info = tarfile.TarInfo(name)
            info.size = layer.stat().st_size
            info.mode = 0o644
            info.mtime = EPOCH
            with layer.open("rb") as data:
                tar.addfile(info, data)
        add_file(tar, "manifest.json", json.dumps(manifest).encode())
    # Atomic, so a concurrent or interrupted build never leaves half a tarball under the key.
    partial.replace(path)


def busybox_layer(binary: bytes, applets: list[str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for folder in ("bin", "dev", "etc", "proc", "sys", "root"):
            add_dir(tar, folder)
        add_dir(tar, "tmp", mode=0o1777)
        add_file(tar, "bin/busybox", binary, mode=0o755)
        for applet in applets:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            link.mtime = EPOCH
            tar.addfile(link)
        add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file(tar, "etc/group", b"root:x:0:\n")
    return out.getvalue()


def add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = EPOCH
    tar.addfile(info)


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))
