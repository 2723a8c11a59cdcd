"""The Binder's calls on the wire: what it sends the API server, and how it reads the answers."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client

import gangshare.extender.binder as binder_module
from gangshare.extender.binder import Binder, BindError

BINDING = "/api/v1/namespaces/{ns}/pods/{name}/binding"
POD = {"metadata": {"namespace": "team-a", "name": "p-0", "uid": "u-1"}}


@asynccontextmanager
async def binder_for(routes: list[web.RouteDef], connections: int = 4) -> AsyncIterator[Binder]:
    """A Binder whose API server is a local aiohttp app serving `routes`, with a token."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    configuration = client.Configuration(
        host=f"http://127.0.0.1:{port}",
        api_key={"BearerToken": "s3cret"},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    binder = Binder(configuration, connections=connections)
    try:
        yield binder
    finally:
        await binder.close()
        await runner.cleanup()


def status(code: int, message: str = "") -> web.Response:
    return web.json_response({"kind": "Status", "message": message}, status=code)


def test_a_bind_posts_one_binding_that_carries_the_gpus_with_the_callers_token():
    seen: list[tuple[str, str | None, dict[str, Any]]] = []

    async def binding(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization"), await request.json()))
        return status(201)

    async def scenario() -> None:
        async with binder_for([web.post(BINDING, binding)]) as binder:
            await binder.record_and_bind(POD, "node-3", (4, 5))
            await binder.record_and_bind(POD, "node-3", (4, 5))

    asyncio.run(scenario())
    path, token, body = seen[0]
    assert path == "/api/v1/namespaces/team-a/pods/p-0/binding"
    assert token == "Bearer s3cret"
    assert body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "p-0",
            "uid": "u-1",
            "annotations": {
                "gangshare.io/planned-node": "node-3",
                "gangshare.io/planned-gpus": "4,5",
            },
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-3"},
    }
    assert len(seen) == 2


def test_a_refused_bind_says_what_the_api_server_said():
    async def binding(request: web.Request) -> web.Response:
        return status(409, 'pod p-0 is already assigned to node "node-1"')

    async def scenario() -> None:
        async with binder_for([web.post(BINDING, binding)]) as binder:
            with pytest.raises(BindError) as refused:
                await binder.record_and_bind(POD, "node-3", (0,))
        assert str(refused.value) == (
            'binding team-a/p-0 to node-3 failed: 409 pod p-0 is already assigned to node "node-1"'
        )

    asyncio.run(scenario())


def test_reads_through_tell_a_missing_object_from_a_failed_read():
    async def job(request: web.Request) -> web.Response:
        if request.match_info["name"] == "gone":
            return status(404, "not found")
        return web.json_response({"metadata": {"name": request.match_info["name"]}})

    async def pod(request: web.Request) -> web.Response:
        return status(503, "etcd is down")

    routes = [
        web.get("/apis/gangshare.io/v1alpha1/namespaces/{ns}/trainingjobs/{name}", job),
        web.get("/api/v1/namespaces/{ns}/pods/{name}", pod),
    ]

    async def scenario() -> None:
        async with binder_for(routes) as binder:
            assert await binder.read_trainingjob("team-a", "gone") is None
            assert (await binder.read_trainingjob("team-a", "llm")) == {"metadata": {"name": "llm"}}
            with pytest.raises(BindError, match="cannot read pod team-a/p-0: 503 etcd is down"):
                await binder.read_pod("team-a", "p-0")

    asyncio.run(scenario())


def test_names_are_escaped_into_the_path():
    paths: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        paths.append(request.raw_path)
        return status(404, "not found")

    async def scenario() -> None:
        async with binder_for([web.get("/{tail:.*}", anything)]) as binder:
            with pytest.raises(BindError, match="does not exist"):
                await binder.read_pod("ns", "a/../../x")

    asyncio.run(scenario())
    assert paths == ["/api/v1/namespaces/ns/pods/a%2F..%2F..%2Fx"]


def test_a_backlog_waiting_for_a_connection_does_not_time_out(monkeypatch):
    """kube-scheduler sends binds without limit: only time on the wire counts."""
    monkeypatch.setattr(binder_module, "CALL_SECONDS", 0.5)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return status(201)

    async def scenario() -> list[BaseException | None]:
        # Eight binds on one connection: the last waits 1.4 s, each call takes 0.2 s.
        async with binder_for([web.post(BINDING, slow)], connections=1) as binder:
            return await asyncio.gather(
                *(binder.record_and_bind(POD, f"node-{i}", (0,)) for i in range(8)),
                return_exceptions=True,
            )

    assert asyncio.run(scenario()) == [None] * 8
