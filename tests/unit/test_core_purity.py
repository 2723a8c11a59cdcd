"""Importing gangshare.core loads no I/O library (import-linter checks the source too)."""

import json
import subprocess
import sys

FORBIDDEN = {
    "kopf",
    "kubernetes",
    "fastapi",
    "starlette",
    "uvicorn",
    "pynvml",
    "prometheus_client",
    "httpx",
    "aiohttp",
    "yaml",
    "matplotlib",
}


def test_core_import_pulls_in_no_io_library():
    code = "import json, sys, gangshare.core; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    assert "gangshare.core" in loaded
    assert sorted({m.split(".")[0] for m in loaded} & FORBIDDEN) == []
