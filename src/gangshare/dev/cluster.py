"""A real local Kubernetes control plane with simulated GPU nodes.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK, JobSet's controller
(when built: dev/jobset.py), after it Kubeflow Trainer's controller and the training-operator
(each when built: dev/kubeflow.py), and gangshare's extender with its own kube-scheduler
(gangshare-scheduler) run as
local processes on free loopback ports under one state folder; every log goes
to `<root>/logs/`. Nodes come from a cluster spec (the core's `NodeSpec`s).
"""

from __future__ import annotations

import json
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from gangshare.core.spec import NodeSpec
from gangshare.dev import components, jobset, kubeflow, processes
from gangshare.dev.binaries import repo_root
from gangshare.dev.components import Layout, Ports
from gangshare.dev.pki import generate_credentials
from gangshare.kube.nodes import node_manifest


class ClusterError(RuntimeError):
    pass


@dataclass
class ClusterState:
    root: str
    kubeconfig: str
    server: str
    ports: dict[str, int]
    pids: dict[str, int]
    logs: str
    nodes: list[str]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        return cls(**json.loads(path.read_text()))


def _get(url: str, context: ssl.SSLContext, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


def _insecure() -> ssl.SSLContext:
    # Only for the components' own self-signed /healthz endpoints on loopback.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class LocalCluster:
    def __init__(self, root: Path, bins: Path, attached: bool = True) -> None:
        self.layout = Layout(root)
        self.bins = bins
        self.attached = attached
        self.children: list[processes.Child] = []
        self.state: ClusterState | None = None

    # ----- lifecycle -----------------------------------------------------------------------

    def up(
        self, nodes: list[NodeSpec], timeout: float = 180.0, with_gangshare: bool = True
    ) -> ClusterState:
        """Start the control plane with `nodes`. Without `with_gangshare` no extender and no
        gangshare-scheduler run: a bare cluster for a release of the chart to bring its own."""
        existing = self.layout.state
        if existing.exists() and any(
            processes.Child(n, p, Path()).alive() for n, p in self._recorded_pids().items()
        ):
            raise ClusterError(
                f"a cluster is already running from {self.layout.root}: "
                "run `gangshare dev down` first"
            )
        self.layout.root.mkdir(parents=True, exist_ok=True)
        # Every `up` starts clean: `down` keeps the last store for a look, but its objects (nodes,
        # service-account tokens signed by the old keys) would clash with the fresh PKI and nodes.
        shutil.rmtree(self.layout.etcd_data, ignore_errors=True)
        try:
            return self._start(nodes, time.monotonic() + timeout, with_gangshare)
        except ApiException as err:
            self.down()
            raise ClusterError(
                f"the API server refused a request: {err.status} {err.reason}"
            ) from None
        except BaseException:
            self.down()
            raise

    def _start(self, nodes: list[NodeSpec], deadline: float, with_gangshare: bool) -> ClusterState:
        layout = self.layout
        creds = generate_credentials(layout.pki)
        ports = Ports(*(processes.free_port() for _ in range(len(fields(Ports)))))
        server = f"https://127.0.0.1:{ports.apiserver}"
        layout.kubeconfig.write_text(
            yaml.safe_dump(components.kubeconfig(server, creds), sort_keys=False)
        )
        layout.scheduler_config.write_text(
            yaml.safe_dump(components.scheduler_config(layout.kubeconfig), sort_keys=False)
        )
        gangshare_config = components.gangshare_scheduler_config(
            repo_root() / "extender" / "scheduler-config.yaml", layout.kubeconfig, ports.extender
        )
        layout.gangshare_scheduler_config.write_text(
            yaml.safe_dump(gangshare_config, sort_keys=False)
        )
        layout.kwok_config.write_text(components.kwok_config())
        self.state = ClusterState(
            root=str(layout.root),
            kubeconfig=str(layout.kubeconfig),
            server=server,
            ports=asdict(ports),
            pids={},
            logs=str(layout.logs),
            nodes=[n.name for n in nodes],
        )

        self._spawn("etcd", components.etcd_argv(self.bins, layout, ports))
        self._wait_healthy("etcd", f"http://127.0.0.1:{ports.etcd}/health", deadline)
        self._spawn("kube-apiserver", components.apiserver_argv(self.bins, creds, ports))
        trusted = ssl.create_default_context(cafile=str(creds.ca_cert))
        self._wait(
            "kube-apiserver",
            deadline,
            lambda: _get(f"{server}/readyz", trusted, creds.admin_token) == 200,
        )
        self._spawn(
            "kube-controller-manager",
            components.controller_manager_argv(self.bins, layout, creds, ports),
        )
        self._spawn(
            "kube-scheduler",
            components.scheduler_argv(self.bins, layout, layout.scheduler_config, ports.scheduler),
        )
        if with_gangshare:
            self._spawn("gangshare-extender", components.extender_argv(layout, ports))
        self._spawn("kwok", components.kwok_argv(self.bins, layout, ports))
        healthz = [
            ("kube-controller-manager", f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            ("kube-scheduler", f"https://127.0.0.1:{ports.scheduler}/healthz"),
            ("kwok", f"http://127.0.0.1:{ports.kwok}/healthz"),
        ]
        if with_gangshare:
            healthz.append(
                ("gangshare-extender", f"http://127.0.0.1:{ports.extender_metrics}/readyz")
            )
        for name, url in healthz:
            self._wait_healthy(name, url, deadline)
        if with_gangshare:
            self._start_gangshare_scheduler(ports, deadline)

        api = self.core_api()
        if jobset.available(self.bins):
            self._start_jobset(creds, ports, deadline, api.api_client)
        for controller, webhook, health in (
            (kubeflow.TRAINER, ports.trainer_webhook, ports.trainer_health),
            (
                kubeflow.TRAINING_OPERATOR,
                ports.training_operator_webhook,
                ports.training_operator_health,
            ),
        ):
            if controller.available(self.bins) and (
                jobset.available(self.bins) or not controller.needs_jobset
            ):
                self._start_kubeflow(controller, creds, webhook, health, deadline, api.api_client)
        # A few at a time: thousands of benchmark nodes one by one took minutes.
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda spec: api.create_node(node_manifest(spec)), nodes))
        self._wait(
            "nodes Ready and untainted", deadline, lambda: self._ready_nodes(api) >= len(nodes)
        )
        self._wait("default service account", deadline, lambda: self._has_default_sa(api))
        return self.state

    def down(self) -> list[str]:
        """Stop every component; returns the names of any that would not die."""
        children = list(self.children)
        if not children:
            children = [
                processes.Child(n, p, self.layout.logs / f"{n}.log")
                for n, p in self._recorded_pids().items()
            ]
        survivors = processes.stop(children)
        self.children = []
        if self.layout.state.exists() and not survivors:
            self.layout.state.unlink()
        return survivors

    # ----- queries -------------------------------------------------------------------------

    def core_api(self) -> Any:
        from kubernetes import client, config

        api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.layout.kubeconfig)
        )
        return client.CoreV1Api(api_client)

    @staticmethod
    def _ready_nodes(api: Any) -> int:
        """Nodes Ready and no longer tainted not-ready: the node lifecycle controller lifts
        that taint seconds after Ready, and until then every scheduler (the operator's plan
        too) counts the node out; a benchmark started in between saw a 512-pod gang judged
        unplaceable on 38 of 500 nodes."""
        ready = 0
        for node in json.loads(api.list_node(_preload_content=False).data)["items"]:
            conditions = (node.get("status") or {}).get("conditions") or []
            taints = (node.get("spec") or {}).get("taints") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) and (
                not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)
            ):
                ready += 1
        return ready

    @staticmethod
    def _has_default_sa(api: Any) -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in api.list_namespaced_service_account("default").items
        )

    def _recorded_pids(self) -> dict[str, int]:
        if not self.layout.state.exists():
            return {}
        try:
            return ClusterState.load(self.layout.state).pids
        except (ValueError, TypeError, OSError):
            return {}

    # ----- internals -----------------------------------------------------------------------

    def _start_gangshare_scheduler(self, ports: Ports, deadline: float) -> None:
        # gangshare's own kube-scheduler starts once the extender it calls is ready.
        layout = self.layout
        self._spawn(
            "gangshare-scheduler",
            components.scheduler_argv(
                self.bins, layout, layout.gangshare_scheduler_config, ports.gangshare_scheduler
            ),
        )
        self._wait_healthy(
            "gangshare-scheduler",
            f"https://127.0.0.1:{ports.gangshare_scheduler}/healthz",
            deadline,
        )

    def _start_jobset(self, creds: Any, ports: Ports, deadline: float, api_client: Any) -> None:
        """JobSet's controller (dev/jobset.py), once its CRD is served and before its webhooks
        are registered: a JobSet is never admitted by a webhook that does not answer yet."""
        jobset.install_crd(api_client, self.bins)
        self._wait("the JobSet CRD", deadline, lambda: jobset.established(api_client))
        config = jobset.write_config(
            self.layout.root,
            ports.jobset_webhook,
            ports.jobset_health,
            creds.serving_cert,
            creds.serving_key,
        )
        self._spawn("jobset-controller", jobset.argv(self.bins, config, self.layout.kubeconfig))
        self._wait_healthy(
            "jobset-controller", f"http://127.0.0.1:{ports.jobset_health}/readyz", deadline
        )
        jobset.install_webhooks(api_client, ports.jobset_webhook, creds.ca_cert)

    def _start_kubeflow(
        self,
        controller: kubeflow.Controller,
        creds: Any,
        webhook_port: int,
        health_port: int,
        deadline: float,
        api_client: Any,
    ) -> None:
        """A Kubeflow controller (dev/kubeflow.py), started like JobSet's; its webhooks are
        registered once each of their paths answers (it registers them only after /readyz)."""
        kubeflow.install_crds(api_client, self.bins, controller)
        self._wait(
            f"the CRDs of {controller.name}",
            deadline,
            lambda: kubeflow.established(api_client, controller),
        )
        kubeflow.create_rotator_secret(api_client, controller)
        env = controller.prepare(self.layout.root, creds.serving_cert, creds.serving_key)
        argv = controller.argv(self.bins, self.layout.kubeconfig, webhook_port, health_port)
        self._spawn(controller.name, argv, env)
        self._wait_healthy(controller.name, f"http://127.0.0.1:{health_port}/readyz", deadline)
        for hook in controller.webhooks:
            url = f"https://127.0.0.1:{webhook_port}{hook.path}"
            # An empty review gets an error review back (200); a path not yet registered, 404.
            self._wait_healthy(f"{controller.name} {hook.path}", url, deadline)
        kubeflow.install_webhooks(api_client, controller, webhook_port, creds.ca_cert)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        child = processes.start(name, argv, self.layout.logs, attached=self.attached, env=env)
        self.children.append(child)
        assert self.state is not None
        self.state.pids[name] = child.pid
        self.state.save(self.layout.state)

    def _wait_healthy(self, name: str, url: str, deadline: float) -> None:
        # Components' own self-signed health endpoints on loopback: nothing to verify.
        self._wait(name, deadline, lambda: _get(url, _insecure()) == 200)

    def _wait(self, what: str, deadline: float, ready: Callable[[], bool]) -> None:
        while time.monotonic() < deadline:
            for child in self.children:
                if not child.alive():
                    raise ClusterError(
                        f"{child.name} exited while waiting for {what}; "
                        f"log {child.log}:\n{child.tail()}"
                    )
            try:
                if ready():
                    return
            except Exception:  # the API may refuse while it starts; keep polling until the deadline
                pass
            time.sleep(0.25)
        raise ClusterError(f"timed out waiting for {what}; logs are in {self.layout.logs}")
