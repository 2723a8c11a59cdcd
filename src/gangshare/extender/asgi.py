"""The least ASGI an extender verb needs: read a bounded body, answer JSON bytes.

The verbs run for every GPU pod kube-scheduler places. A web framework's routing,
dependency injection and middleware stack cost more per request than the decision
itself, so the verbs' listener is this: a path table, a peer check, a body with a size
limit, and a response written in one piece.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
JSON_HEADERS = [(b"content-type", b"application/json")]


class HttpError(Exception):
    """An answer with a 4xx status and a JSON error naming what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"body: {int(declared)} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "body: the client went away before sending it")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"body: {size} bytes is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def decode_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise HttpError(400, f"body: not valid JSON ({err})") from None


def encode_json(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


async def respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: acknowledge the server's lifespan messages."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
