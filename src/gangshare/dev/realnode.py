"""An optional real kubelet node beside the local control plane, for tests that need real
containers (device plugins, PodResources, cgroup limits) rather than KWOK's simulated ones.

Our own containerd (own config, root, state and socket under `root`) and a kubelet run as
children like the control plane's components, logs in `<root>/logs/`. The node registers
tainted and labelled `gangshare.io/real-node=true` and without KWOK's annotation, so only
pods that tolerate the taint and select the label land on it. Pods use `image:
gangshare-test:1` (or realnode_pyimage.py's) with `imagePullPolicy: Never`
(realnode_image.py), and either the host network or the pod network of realnode_net.py,
where the API server answers at the `kubernetes` Service as in any cluster.

The kubelet's own paths are fixed (its device-plugin registration socket ignores
--root-dir), so one real node per machine: a lock file says whose it is. Needs root, the
packages of scripts/install-node-deps.sh and the kubelet of scripts/build-k8s.sh.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gangshare.dev import processes, realnode_host, realnode_lock, realnode_net
from gangshare.dev.realnode_config import (
    CNI_BIN_DIR,
    KUBELET_ROOT,
    POD_LOGS,
    NodeLayout,
    RealNodeState,
    containerd_argv,
    containerd_config,
    kubelet_argv,
    kubelet_config,
)
from gangshare.dev.realnode_image import BUSYBOX, IMAGE_REF, ImageError, image_tarball
from gangshare.dev.realnode_pyimage import PY_IMAGE_REF, python_image_tarball

HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "ip", "nft")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
# Says /var/lib/kubelet is ours to wipe: a machine's real kubelet state never is.
MARKER = ".gangshare-real-node"


class RealNodeError(RuntimeError):
    pass


class RealNode:
    def __init__(
        self,
        root: Path,
        bins: Path,
        kubeconfig: Path,
        name: str = "real-0",
        attached: bool = True,
    ) -> None:
        self.layout = NodeLayout(root)
        self.bins = bins
        self.kubeconfig = kubeconfig
        self.name = name
        self.attached = attached
        self.children: dict[str, processes.Child] = {}
        self.ports: dict[str, int] = {}
        self.earlier_logs: list[str] = []

    @classmethod
    def recorded(cls, root: Path) -> RealNode | None:
        """The node `up` left running from `root` (for `gangshare dev down`), if any."""
        layout = NodeLayout(root)
        try:
            state = RealNodeState.load(layout.state)
        except (OSError, ValueError, TypeError):
            return None
        node = cls(root, Path(), Path(state.kubeconfig), state.name, attached=False)
        node.ports = state.ports
        node.earlier_logs = state.earlier_logs
        node.children = {
            n: processes.Child(n, pid, layout.logs / f"{n}.log") for n, pid in state.pids.items()
        }
        return node

    # ----- paths tests use ---------------------------------------------------------------

    @property
    def device_plugin_dir(self) -> Path:
        return KUBELET_ROOT / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return KUBELET_ROOT / "pod-resources" / "kubelet.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.layout.containerd_socket

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        """The kubelet's log file of a container's first run (`kubectl logs` cannot reach a
        kubelet that serves on loopback only)."""
        uid = self._core_api().read_namespaced_pod(pod, namespace).metadata.uid
        return POD_LOGS / f"{namespace}_{pod}_{uid}" / container / "0.log"

    def container_log(self, namespace: str, pod_name: str, container: str) -> str:
        """What the container wrote, stdout and stderr interleaved, without the CRI prefixes."""
        return realnode_host.parse_cri_log(
            self.log_path(namespace, pod_name, container).read_text()
        )

    # ----- lifecycle ---------------------------------------------------------------------

    def up(self, timeout: float = 120.0) -> None:
        """Start containerd and the kubelet; returns once the Node is Ready and schedulable."""
        deadline = time.monotonic() + timeout
        self._check_host()
        self._take_lock()
        try:
            self._start(deadline)
        except BaseException:
            self.down()
            raise

    def down(self) -> list[str]:
        """Stop everything and undo what it left on the host; returns what would not go."""
        with realnode_lock.guarded():
            holder = realnode_lock.holder()
            ours = holder is not None and holder.root == self.layout.root
            if not ours:
                # Mounts, cgroups and the kubelet folder are the machine's, not per node: only
                # the lock's holder may clear them.
                if holder is not None and holder.live:
                    return [f"the real node of {holder.root} (not ours to stop)"]
                if not self.children:
                    return []
            left = self._teardown()
            if not left and ours:
                realnode_lock.release()
        return left

    def _teardown(self) -> list[str]:
        left: list[str] = []
        kubelet = self.children.pop("kubelet", None)
        if kubelet is not None:
            left += processes.stop([kubelet])
        # With the kubelet gone nothing restarts a container: kill them before containerd,
        # whose shims would otherwise keep them (and their mounts) alive.
        left += [f"pod process {p}" for p in realnode_host.kill_pod_processes()]
        containerd = self.children.pop("containerd", None)
        if containerd is not None:
            left += processes.stop([containerd])
        left += [f"shim {p}" for p in realnode_host.kill_pids(self._shims())]
        left += [f"mount {m}" for m in realnode_host.unmount_all(KUBELET_ROOT, self.layout.root)]
        left += realnode_host.remove_iptables_chains()
        left += [f"cgroup {c}" for c in realnode_host.remove_kubepods_cgroups()]
        # After the unmounts: they free the pods' network namespaces and with them the veths.
        left += realnode_net.tear_down()
        if not realnode_host.remove_tree(KUBELET_ROOT):
            left.append(str(KUBELET_ROOT))
        # The kubelet removes a pod's logs only some time after the pod is gone.
        realnode_host.remove_pod_logs(keep=self.earlier_logs)
        self._delete_node()
        if not left:
            self.layout.state.unlink(missing_ok=True)
        return left

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        """Stop the kubelet and start it again (plugins must notice and register again)."""
        kubelet = self.children.pop("kubelet", None)
        if kubelet is not None and processes.stop([kubelet]):
            raise RealNodeError(f"the kubelet (pid {kubelet.pid}) would not stop")
        started = datetime.now(UTC)
        self._spawn("kubelet", self._kubelet_argv())
        deadline = time.monotonic() + timeout
        # The lease is renewed at start with microsecond precision, unlike the Ready condition.
        self._wait("kubelet healthz", deadline, self._healthy)
        self._wait("kubelet lease renewed", deadline, lambda: self._lease_renewed_after(started))
        self._wait(f"node {self.name} Ready", deadline, self._ready)

    # ----- internals ---------------------------------------------------------------------

    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise RealNodeError("a real kubelet node needs root (mounts, cgroups, network)")
        missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
        needed = [*(CNI_BIN_DIR / p for p in CNI_PLUGINS), BUSYBOX]
        missing += [str(p) for p in needed if not p.exists()]
        if missing:
            raise RealNodeError(
                f"missing {', '.join(missing)}: run scripts/install-node-deps.sh as root"
            )
        if not (self.bins / "kubelet").exists():
            raise RealNodeError(
                f"no kubelet in {self.bins}: run scripts/build-k8s.sh (it builds one)"
            )

    def _start(self, deadline: float) -> None:
        layout = self.layout
        marker = KUBELET_ROOT / MARKER
        if KUBELET_ROOT.is_dir() and any(KUBELET_ROOT.iterdir()) and not marker.exists():
            raise RealNodeError(
                f"{KUBELET_ROOT} holds another kubelet's state (no {MARKER} in it); "
                "remove it by hand if this machine is disposable"
            )
        # A fresh node each time: containerd's metadata and the kubelet's checkpoints
        # (device assignments, pod folders) of an earlier run would only get in the way.
        # host-local's reservations of sandboxes nobody deleted through CNI go the same way.
        stale = (layout.root / "containerd", KUBELET_ROOT, layout.cni_conf_dir, layout.cni_ipam_dir)
        for folder in stale:
            if not realnode_host.remove_tree(folder):
                raise RealNodeError(f"cannot clear {folder}: something is still mounted there")
        KUBELET_ROOT.mkdir(parents=True)
        marker.write_text(f"{layout.root}\n")
        layout.root.mkdir(parents=True, exist_ok=True)
        layout.cni_conf_dir.mkdir(parents=True)
        layout.containerd_config.write_text(containerd_config(layout))
        (layout.cni_conf_dir / "10-pods.conflist").write_text(
            realnode_net.cni_conflist(layout.cni_ipam_dir)
        )
        self.ports = {"kubelet": processes.free_port(), "healthz": processes.free_port()}
        self.earlier_logs = realnode_host.pod_log_entries()
        layout.kubelet_config.write_text(
            yaml.safe_dump(
                kubelet_config(layout, self.ports["kubelet"], self.ports["healthz"]),
                sort_keys=False,
            )
        )
        self._save()

        try:
            # Before containerd: the bridge plugin then finds the bridge set up as it must be.
            realnode_net.set_up(self.kubeconfig)
        except realnode_net.NetError as err:
            raise RealNodeError(f"pod network: {err}") from None
        containerd = shutil.which("containerd") or "containerd"
        self._spawn("containerd", containerd_argv(layout, containerd))
        self._wait("containerd", deadline, lambda: self._ctr("version").returncode == 0)
        self._import_image()
        self._spawn("kubelet", self._kubelet_argv())
        self._wait(f"node {self.name} Ready", deadline, self._ready)

    def _kubelet_argv(self) -> list[str]:
        return kubelet_argv(self.bins, self.layout, self.kubeconfig, self.name)

    def _import_image(self) -> None:
        try:
            images = [(image_tarball(), IMAGE_REF), (python_image_tarball(), PY_IMAGE_REF)]
        except ImageError as err:
            raise RealNodeError(str(err)) from None
        for tarball, ref in images:
            self.import_image(tarball, ref)

    def import_image(self, tarball: Path, ref: str) -> None:
        """A docker-archive into the node's containerd (the CRI's namespace), where `ref` is
        then found as a pod's image without a pull."""
        done = self._ctr("images", "import", str(tarball), timeout=300)
        if done.returncode != 0 or self._ctr("images", "check", f"name=={ref}").returncode:
            containerd = self.children.get("containerd")
            raise RealNodeError(
                f"ctr images import {tarball} failed: {done.stdout.strip()} {done.stderr}\n"
                + (f"containerd log {containerd.log}:\n{containerd.tail()}" if containerd else "")
            )

    def _ctr(self, *args: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(self.layout.containerd_socket), "-n", "k8s.io", *args]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout}s")

    def _shims(self) -> list[int]:
        return realnode_host.shim_pids(self.layout.containerd_socket)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.children[name] = processes.start(name, argv, self.layout.logs, self.attached)
        self._save()

    def _save(self) -> None:
        RealNodeState(
            root=str(self.layout.root),
            name=self.name,
            kubeconfig=str(self.kubeconfig),
            pids={n: c.pid for n, c in self.children.items()},
            ports=self.ports,
            earlier_logs=self.earlier_logs,
        ).save(self.layout.state)

    def _wait(self, what: str, deadline: float, ready: Callable[[], bool]) -> None:
        while time.monotonic() < deadline:
            for child in self.children.values():
                if not child.alive():
                    raise RealNodeError(
                        f"{child.name} exited while waiting for {what}; "
                        f"log {child.log}:\n{child.tail()}"
                    )
            try:
                if ready():
                    return
            except Exception:  # the API or a socket may refuse while things start; keep polling
                pass
            time.sleep(0.25)
        tails = "\n".join(f"--- {c.log}:\n{c.tail()}" for c in self.children.values())
        raise RealNodeError(f"timed out waiting for {what}\n{tails}")

    def _ready(self) -> bool:
        node = self._core_api().read_node(self.name)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        # The node controller lifts this taint once it has seen the node Ready; until then
        # the scheduler would leave every pod Pending.
        not_ready = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
        return ready and not not_ready

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['healthz']}/healthz"
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status == 200

    def _lease_renewed_after(self, moment: datetime) -> bool:
        from kubernetes import client

        lease = client.CoordinationV1Api(self._api_client()).read_namespaced_lease(
            self.name, "kube-node-lease"
        )
        renewed: datetime | None = lease.spec.renew_time if lease.spec else None
        return renewed is not None and renewed >= moment

    def _delete_node(self) -> None:
        # Best effort: `dev down` may run after the API server is gone, and then so is the Node.
        with contextlib.suppress(Exception):
            self._core_api().delete_node(self.name)

    def _api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )

    def _core_api(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api_client())

    # ----- one real node per machine -------------------------------------------------------

    def _take_lock(self) -> None:
        with realnode_lock.guarded():
            holder = realnode_lock.holder()
            if holder is not None and holder.live:
                raise RealNodeError(
                    f"a real kubelet node already runs on this machine (from {holder.root}, "
                    f"lock {realnode_lock.LOCK}): stop it first (`gangshare dev down` or "
                    "RealNode.down())"
                )
            others = realnode_host.kubelet_pids()
            if others:
                raise RealNodeError(
                    f"another kubelet runs on this machine (pid {others[0]}): its device-plugin "
                    f"and pod-resources sockets under {KUBELET_ROOT} would clash with ours"
                )
            if holder is not None:
                # Its owner died without `down`: undo what its node left on the host, even
                # when its folder (with the pids) is gone: shims and mounts name the folder.
                stale = RealNode.recorded(holder.root)
                if stale is None:
                    stale = RealNode(holder.root, Path(), Path(), attached=False)
                    stale.earlier_logs = realnode_host.pod_log_entries()
                left = stale._teardown()
                if left:
                    raise RealNodeError(
                        f"a crashed real node ({holder.root}) left behind: {', '.join(left)}"
                    )
            realnode_lock.take(self.layout.root)
