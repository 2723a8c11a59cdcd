"""The Prometheus built by scripts/build-k8s.sh, as a process scraping loopback targets, or
serving blocks backfilled by promtool (no targets, `storage` their folder)."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gangshare.dev.processes import free_port
from kube import ChildProcess, eventually


class PrometheusProcess(ChildProcess):
    def __init__(
        self, binary: Path, workdir: Path, targets: dict[str, str], storage: Path | None = None
    ) -> None:
        """`targets`: scrape job name -> HOST:PORT of a /metrics endpoint; `storage`: the TSDB
        folder (default: workdir/data)."""
        self.binary = binary
        self.workdir = workdir
        self.targets = targets
        self.storage = storage or workdir / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> dict[str, Any]:
        return {
            # Every second, so a run of a minute leaves enough samples for rate() and friends;
            # the timeout may not exceed the interval.
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in self.targets.items()
            ],
        }

    def start(self) -> PrometheusProcess:
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        log = (self.workdir / "prometheus.log").open("wb")
        argv = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        # cwd: the UI (not built in) looks for its assets relative to it; only the API is used.
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        eventually(self.ready, timeout=60, what="prometheus /-/ready")
        return self

    def ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)

    def logs(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def targets_up(self) -> dict[str, str]:
        """Scrape job -> health of its target ("up" once scraped)."""
        active = self.api("targets", state="active")["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self.api("query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] in ("vector", "scalar"), data
        result: list[dict[str, Any]] = (
            data["result"]
            if data["resultType"] == "vector"
            else [{"metric": {}, "value": data["result"]}]
        )
        return result

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step
        )
        result: list[dict[str, Any]] = data["result"]
        return result
