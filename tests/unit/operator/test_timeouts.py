"""Every API call the operator and the extender make ends, even when the API server hangs."""

import asyncio
import socket
import threading
import time

import pytest
import yaml

from gangshare.extender.binder import Binder, BindError
from gangshare.kube import client as kube_client
from gangshare.operator import kubeapi


@pytest.fixture
def hung_api_server(tmp_path):
    """A kubeconfig pointing at a server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    config = tmp_path / "kubeconfig"
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    yield str(config)
    listener.close()
    for sock in accepted:
        sock.close()


def test_calls_to_a_hung_api_server_time_out(hung_api_server, monkeypatch):
    monkeypatch.setattr(kube_client, "DEFAULT_TIMEOUT", (1.0, 1.0))
    api = kubeapi.KubeApi(kube_client.connect(hung_api_server))
    for call in (api.list_nodes, lambda: api.get_job("ns", "j"), api.list_live_pods):
        started = time.monotonic()
        with pytest.raises(Exception, match=r"(?i)timed? ?out"):
            call()
        assert time.monotonic() - started < 5
    # The extender's calls use the same credentials on its own loop, and a timeout is a bind
    # error kube-scheduler sees (it retries the pod), not an internal failure.
    binder = Binder(kube_client.connect(hung_api_server).configuration)

    async def calls() -> None:
        try:
            for call in (
                binder.read_pod("default", "p"),
                binder.record_and_bind(
                    {"metadata": {"namespace": "default", "name": "p", "uid": "u"}}, "n", (0,)
                ),
            ):
                started = time.monotonic()
                with pytest.raises(BindError, match=r"default/p.*timed out"):
                    await call
                assert time.monotonic() - started < 5
        finally:
            await binder.close()

    asyncio.run(calls())
