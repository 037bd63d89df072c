"""The Responses API over WebSocket, as Codex uses it at its defaults, driven with the official SDK's connect().

A real server (the WebSocket is the transport under test); the provider is the
tests' mock over HTTP, which keeps no history for `store: false`: a turn the
proxy did not expand into its full input would not even render there.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.proxy_config(real=True, defaults={"offload": {"tool_result_tokens": 2000}})

KEY = "sk-ws"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
TOOLS = [{"type": "function", "name": "shell", "description": "run a command", "strict": False,
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
COMMON = {"model": "gpt-5", "instructions": "You are Codex.", "tools": TOOLS, "store": False,
          "prompt_cache_key": "thread-1"}
FIRST = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful. " * 200}]},
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find the bad item."}]}]


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def ws_url(proxy, path: str = "/v1/responses") -> str:
    return proxy.url.replace("http://", "ws://") + path


def turn(ws, **body) -> list[dict]:
    """One response.create, then every event up to the turn's end (completed, or an error)."""
    ws.send(json.dumps({"type": "response.create", **body}))
    events = []
    while True:
        ev = json.loads(ws.recv(timeout=30))
        events.append(ev)
        if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return events


def completed(events: list[dict]) -> dict:
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


def session(proxy, upstream, path: str = "/v1/responses", warm_up: bool = True) -> list[dict]:
    """A Codex-shaped session: warm-up, the first turn whole, then turns of only the new items."""
    upstream.script(*[{"tool_calls": [{"name": "shell", "arguments": {"command": f"cat part{i}.log"}}]}
                      for i in range(3)], "The bad item is 7919.")
    common = COMMON
    sent = []
    with connect(ws_url(proxy, path), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        prev = None
        if warm_up:
            warm = turn(ws, **common, input=FIRST, generate=False)
            prev = completed(warm)["id"]
            assert completed(warm)["output"] == []
        history = list(FIRST)
        new: list[dict] = [] if warm_up else list(FIRST)
        for _turn in range(4):
            body = {**common, "input": new} | ({"previous_response_id": prev} if prev else {})
            events = turn(ws, **body)
            sent.append(events)
            response = completed(events)
            history += new + response["output"]
            prev = response["id"]
            calls = [o for o in response["output"] if o["type"] == "function_call"]
            new = [{"type": "function_call_output", "call_id": c["call_id"], "output": big_log()} for c in calls]
            if not calls:
                break
    return sent


def test_a_codex_shaped_session_goes_upstream_whole_and_managed(proxy, upstream):
    events = session(proxy, upstream)
    bodies = [r.json for r in upstream.requests if r.path == "/v1/responses"]
    assert len(bodies) == 4  # the warm-up is answered by the proxy, each turn reaches the provider once
    assert all("previous_response_id" not in b and b["stream"] is True and b["store"] is False for b in bodies)
    assert all("generate" not in b and "type" not in b for b in bodies)
    # each turn carries the whole conversation: the first turn's items, then every earlier output and result
    assert all(b["input"][:2] == FIRST for b in bodies)
    assert bodies[1]["input"][2]["type"] == "function_call" and bodies[1]["input"][3]["type"] == "function_call_output"
    # and is rewritten as over HTTP: the big tool results offloaded behind context_read
    assert HANDLE.search(json.dumps(bodies[-1]["input"]).replace('\\"', '"'))
    assert any(t["name"] == "context_read" for t in bodies[-1]["tools"])
    assert completed(events[-1])["output"][-1]["content"][0]["text"] == "The bad item is 7919."
    # events arrive as the provider streamed them, numbered in order
    seq = [e["sequence_number"] for e in events[0]]
    assert seq == sorted(seq) and events[0][0]["type"] == "response.created"


STEADY = {"offload": {"tool_result_tokens": 2000}, "status_bar": {"enabled": False}}  # no clock in the bytes


@pytest.mark.proxy_config(real=True, defaults=STEADY)
def test_the_same_history_is_the_same_upstream_bytes_over_websocket_twice_and_over_http(proxy, upstream):
    session(proxy, upstream)
    first = [r.body for r in upstream.requests if r.path == "/v1/responses"]
    upstream.reset()
    session(proxy, upstream, warm_up=False)
    again = [r.body for r in upstream.requests if r.path == "/v1/responses"]
    assert again == first
    # the last turn sent over HTTP with its whole input, as Codex sends it without a socket
    upstream.reset()
    upstream.script("The bad item is 7919.")
    body = {**COMMON, "input": _client_history(first[-1]), "stream": True}  # the frame's fields, in its order
    r = httpx.post(proxy.url + "/v1/responses", content=json.dumps(body, separators=(",", ":")),  # as Codex writes
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 200 and upstream.requests[-1].body == first[-1]


def _client_history(upstream_body: bytes) -> list[dict]:
    """The client's own items of a rewritten body: offloaded outputs put back as the client sent them."""
    items = json.loads(upstream_body)["input"]
    return [{**it, "output": big_log()} if it.get("type") == "function_call_output" else it for it in items]


def test_a_restart_mid_session_loses_nothing(make_proxy, upstream, tmp_path):
    """Codex reconnects after a drop and sends the whole input again: the same bytes reach the provider."""
    store = f"sqlite:///{tmp_path / 'ws.db'}"
    first = make_proxy(store, real=True, defaults=STEADY)
    session(first, upstream)
    expected = [r.body for r in upstream.requests if r.path == "/v1/responses"]
    first.stop()
    upstream.reset()
    upstream.script("The bad item is 7919.")
    second = make_proxy(store, real=True, defaults=STEADY)
    with connect(ws_url(second), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        completed(turn(ws, **COMMON, input=_client_history(expected[-1])))
    assert upstream.requests[-1].body == expected[-1]


def test_a_previous_response_the_socket_does_not_hold_is_forwarded_as_sent(proxy, upstream):
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        events = turn(ws, model="gpt-5", input=[{"role": "user", "content": "next"}],
                      previous_response_id="resp_from_another_socket", store=False)
        assert upstream.requests[-1].json["previous_response_id"] == "resp_from_another_socket"
        err = events[-1]
        assert err["type"] == "error" and err["status"] == 400
        assert err["error"]["code"] == "previous_response_not_found"
        # the socket stays usable: the client's next, whole request is served
        upstream.script("fine")
        assert completed(turn(ws, model="gpt-5", input=FIRST))["output"][0]["content"][0]["text"] == "fine"


def test_errors_are_websocket_error_events_and_the_socket_stays_open(proxy, upstream):
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        ws.send("{not json")
        bad = json.loads(ws.recv(timeout=10))
        assert bad["type"] == "error" and bad["status"] == 400 and bad["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "session.update"}))
        assert json.loads(ws.recv(timeout=10))["error"]["code"] == "invalid_event_type"
        ws.send(json.dumps({"type": "response.processed", "response_id": "resp_1"}))  # acknowledged, unanswered
        upstream.windows["gpt-tiny"] = 100  # the provider's window; the proxy assumes a large one
        err = turn(ws, model="gpt-tiny", input=[{"role": "user", "content": "word " * 400}])[-1]
        assert err["type"] == "error" and err["status"] == 400 and err["error"]["code"] == "context_length_exceeded"
        upstream.script("fine")
        assert completed(turn(ws, model="gpt-5", input="hello"))["status"] == "completed"


def test_the_route_prefix_works_over_websocket(proxy, upstream):
    events = session(proxy, upstream, path="/r/default/v1/responses")
    assert completed(events[-1])["status"] == "completed"


def test_stream_id_is_echoed_on_every_event(proxy, upstream):
    upstream.script("hi")
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        events = turn(ws, model="gpt-5", input="hello", stream_id="lane-a")
    assert events and all(e.get("stream_id") == "lane-a" for e in events)


def test_the_official_sdk_talks_to_the_socket(proxy, upstream):
    upstream.script("Hello from the socket.")
    client = proxy.openai(api_key=KEY, websocket_base_url=ws_url(proxy, "/v1"))
    with client.responses.connect() as conn:
        conn.response.create(model="gpt-5", input="hello", store=False)
        kinds, text = [], None
        for ev in conn:
            kinds.append(ev.type)
            if ev.type == "response.completed":
                text = ev.response.output_text
                break
    assert kinds[0] == "response.created" and text == "Hello from the socket."


@pytest.mark.proxy_config(server={"max_websockets": 1, "websocket_idle_timeout": 0.5})
def test_sockets_are_bounded_in_number_and_idle_time(proxy):
    with connect(ws_url(proxy)) as first:
        with connect(ws_url(proxy)) as second:
            refused = json.loads(second.recv(timeout=10))
            assert refused["error"]["code"] == "websocket_connection_limit_reached"
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=10)
            assert closed.value.rcvd.code == 1013
        with pytest.raises(ConnectionClosed) as idle:
            first.recv(timeout=10)
        assert "websocket_idle_timeout" in idle.value.rcvd.reason


@pytest.mark.proxy_config(server={"max_body_bytes": 100_000})
def test_a_frame_past_max_body_bytes_is_refused(proxy):
    with connect(ws_url(proxy), max_size=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "x" * 200_000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1009  # message too big


def _read_call(body: dict) -> dict:
    """The model reads back what the proxy offloaded: a context_read call naming the handle it was shown."""
    handle = HANDLE.search(json.dumps(body["input"]).replace('\\"', '"'))
    assert handle, "the offloaded output should be in the input by now"
    return {"tool_calls": [{"name": "context_read", "arguments": {"handle": handle.group(1), "pattern": "item 7919"}}]}


def test_read_back_rounds_stay_hidden_from_the_socket(proxy, upstream):
    upstream.script({"tool_calls": [{"name": "shell", "arguments": {"command": "cat app.log"}}]}, _read_call,
                    "The bad item is 7919.")
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        first = completed(turn(ws, **COMMON, input=FIRST))
        call = first["output"][-1]
        events = turn(ws, **COMMON, previous_response_id=first["id"],
                      input=[{"type": "function_call_output", "call_id": call["call_id"], "output": big_log()}])
    answer = completed(events)
    assert [o["type"] for o in answer["output"]] == ["message"]
    items = [e["item"] for e in events if "item" in e] + answer["output"]
    assert items and not any(i.get("name") == "context_read" for i in items)  # the proxy's call stays hidden
    assert not any(e["type"].startswith("response.function_call") for e in events)
    assert len([r for r in upstream.requests if r.path == "/v1/responses"]) == 3  # the proxy answered one round


@pytest.mark.proxy_config(server={"websocket_history_bytes": 2_000})
def test_history_past_its_budget_is_not_kept(proxy, upstream):
    """A socket holds at most websocket_history_bytes: past it a chained turn goes as sent, and the provider
    (holding nothing for store: false) says so; the client's whole request is served next."""
    upstream.script("first", "second")
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        small = completed(turn(ws, model="gpt-5", input="hello"))
        completed(turn(ws, model="gpt-5", previous_response_id=small["id"], input="and then?"))
        assert len(upstream.requests[-1].json["input"]) >= 3  # a small history was kept and expanded
        big = completed(turn(ws, model="gpt-5", input=FIRST, store=False))  # ~2.5 KB: over the budget
        err = turn(ws, model="gpt-5", previous_response_id=big["id"], input="and then?")[-1]
    assert err["error"]["code"] == "previous_response_not_found"
    assert upstream.requests[-1].json["previous_response_id"] == big["id"]


def test_a_client_leaving_mid_turn_frees_the_socket_and_the_proxy_serves_on(proxy, upstream):
    upstream.script("a long answer " * 50, "after")
    upstream.chunk_delay = 0.05  # the provider streams slowly: the client leaves in the middle
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hello"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "response.created"
    upstream.chunk_delay = 0
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        assert completed(turn(ws, model="gpt-5", input="hello"))["output"][0]["content"][0]["text"] == "after"


def test_hostile_frames_get_error_events_not_a_dead_socket(proxy, upstream):
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    frames = [json.dumps({"type": "response.create", "model": "gpt-5", "input": deep}),
              json.dumps({"type": ["response.create"]}), json.dumps([1, 2]), "null",
              json.dumps({"type": "response.create", "model": "gpt-5", "input": {"not": "a list"}}),
              json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi",
                          "previous_response_id": ["a"], "stream_id": {"x": 1}})]
    with connect(ws_url(proxy), additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        for frame in frames:
            ws.send(frame)
            ev = json.loads(ws.recv(timeout=10))
            assert ev["type"] == "error" and 400 <= ev["status"] < 500, (frame[:80], ev)
        upstream.script("still here")
        assert completed(turn(ws, model="gpt-5", input="hello"))["output"][0]["content"][0]["text"] == "still here"


def test_a_turn_the_provider_refuses_is_in_the_sessions_timeline(proxy, upstream):
    """A turn answered whole (the provider's error, no stream) is accounted as one failed request: its ledger used
    to be closed only by the HTTP response's send, which a WebSocket turn never calls."""
    upstream.windows["gpt-tiny"] = 100
    headers = {"authorization": f"Bearer {KEY}", "x-session-id": "ws-refused"}
    with connect(ws_url(proxy), additional_headers=headers) as ws:
        err = turn(ws, model="gpt-tiny", input=[{"role": "user", "content": "word " * 400}])[-1]
        assert err["type"] == "error" and err["status"] == 400
        upstream.script("fine")
        assert completed(turn(ws, model="gpt-5", input="hello"))["status"] == "completed"
    timeline = proxy.get("/ctx/v1/sessions/ws-refused", headers={"authorization": f"Bearer {KEY}"}).json()
    assert [r["status"] for r in timeline["requests"]] == [400, 200], timeline["requests"]
