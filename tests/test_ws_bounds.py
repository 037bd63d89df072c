"""The Responses WebSocket keeps its bounds whatever the client sends (proxy/http/responses_ws.py).

Memory per socket: frames queued behind a running turn are counted by bytes and
the socket is not read past the budget; the history budget holds for the whole
socket. A client that leaves cancels its queued turns: nothing more goes upstream.
The limits are told as Codex reads them: a text frame for the connection limit, the
frame limit in a handshake header.
"""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from test_serve import serve, stop
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from proxy.config import ServerSettings
from proxy.http.responses_ws import MAX_MESSAGE_HEADER, Socket
from proxy.http.ws_history import SocketHistory

pytestmark = pytest.mark.proxy_config(real=True)

CREATE = {"type": "response.create", "model": "gpt-5", "store": False}


def ws_url(proxy) -> str:
    return proxy.url.replace("http://", "ws://") + "/v1/responses"


def test_the_frame_limit_is_told_in_the_handshake(proxy):
    with connect(ws_url(proxy)) as ws:
        assert ws.response.headers[MAX_MESSAGE_HEADER] == str(proxy.settings.server.max_body_bytes)


@pytest.mark.proxy_config(server={"max_websockets": 1})
def test_the_connection_limit_refusal_is_a_text_frame(proxy):
    with connect(ws_url(proxy)), connect(ws_url(proxy)) as second:
        frame = second.recv(timeout=10)
        assert isinstance(frame, str), "Codex reads text frames only"
        assert json.loads(frame)["error"]["code"] == "websocket_connection_limit_reached"


def test_a_client_that_leaves_cancels_its_queued_turns(proxy, upstream):
    """One turn held by a slow provider, five queued behind it, then the client closes: the five are never sent
    (nor billed), and the proxy logs no 200 for them."""
    upstream.delay = 1.0  # the first event of a streamed answer waits this long
    with connect(ws_url(proxy)) as ws:
        for i in range(6):
            ws.send(json.dumps({**CREATE, "input": f"turn {i}"}))
        deadline = time.monotonic() + 10
        while not upstream.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(upstream.requests) == 1
    time.sleep(1.5)  # past the held turn's answer: a queued turn would have gone by now
    assert len(upstream.requests) == 1 and b"turn 0" in upstream.requests[0].body


# ---- the budgets, on the socket itself


class _Client:
    """A WebSocket whose client has sent `frames` at once: what receive() hands the app, counted."""

    def __init__(self, frames: list[str]) -> None:
        self.frames = frames
        self.received = 0
        self.scope: dict[str, Any] = {"headers": []}
        self.sent: list[str] = []

    async def receive(self) -> dict[str, Any]:
        if self.received < len(self.frames):
            self.received += 1
            return {"type": "websocket.receive", "text": self.frames[self.received - 1]}
        await asyncio.Event().wait()  # the client waits for its answers
        raise AssertionError

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


async def test_reading_pauses_while_the_queue_is_at_its_budget():
    server = ServerSettings(websocket_queue_bytes=10_000)
    frames = [json.dumps({**CREATE, "input": "x" * 4_000}) for _ in range(8)]
    client = _Client(frames)
    sock = Socket(client, SimpleNamespace(settings=SimpleNamespace(server=server)))  # type: ignore[arg-type]
    reader = asyncio.create_task(sock._read())
    for _ in range(20):
        await asyncio.sleep(0)
    # no turn takes a frame: three fill the 10,000 bytes (the third passes them), then nothing more is read
    assert client.received == 3 and sock.queued == sum(map(len, frames[:3]))
    sock._taken(await sock.inbox.get())  # a turn takes one: room again, one more is read
    for _ in range(20):
        await asyncio.sleep(0)
    assert client.received == 4
    reader.cancel()


def test_the_history_budget_bounds_the_whole_socket():
    history = SocketHistory(max_bytes=1000)
    for n in range(4):
        assert history.remember(f"resp_{n}", [{"role": "user", "content": str(n)}], [], 400)
    assert "resp_3" in history and "resp_2" in history  # the newest two: 800 bytes
    assert "resp_1" not in history and "resp_0" not in history
    assert not history.remember("resp_big", [], [], 1001)  # one alone past the budget is not kept


def test_a_text_frame_that_is_not_utf8_is_one_warning_line(tmp_path, upstream):
    """uvicorn closes the socket with 1007 and logs its own error with a traceback: the fault is the client's."""
    s = serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url})
    try:
        with connect(s.url.replace("http://", "ws://") + "/v1/responses") as ws:
            ws.send(b'{"type": "response.create", "input": "\xff\xfe"}', text=True)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    finally:
        assert stop(s)
    lines = s.log_lines()
    said = [line for line in lines if "UTF-8" in line["msg"]]
    assert [(line["level"], "exc" in line) for line in said] == [("warning", False)], said
    assert not [line for line in lines if line["level"] == "error"]
