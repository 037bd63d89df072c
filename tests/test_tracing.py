"""Tracing as an operator sees it: spans exported over OTLP/HTTP to a real receiver, decoded from protobuf.

One agent turn with a hidden read round is one trace continuing the client's
`traceparent`: the request's SERVER span, a span per transform, a CLIENT span
per provider call (whose own traceparent the provider received), the store
calls; its figures are the ones /ctx/v1 shows for that request. Off (the
default), nothing of the SDK is imported and the client's traceparent reaches
the provider as it was sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from proxy_server import InProcessProxy, make_settings
from test_responses_api import HANDLE, KEY, _read_call_for_placeholder, big_log, codex_input, config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


class Receiver:
    """An OTLP/HTTP traces endpoint on a free port: POST /v1/traces, protobuf in, spans kept decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.posts: list[str] = []
        self.status = 200  # any other: every export is answered so (refused)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.posts.append(self.path)
                if receiver.status != 200:
                    self.send_response(receiver.status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        receiver.spans += [(rs.resource, s) for s in ss.spans]
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "ctxproxy-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "20"}


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def turn(proxy: InProcessProxy, upstream: Any, stream: bool) -> tuple[Any, dict[str, Any]]:
    """One agent turn whose big tool output is offloaded and read back in a hidden round; its /ctx/v1 entry."""
    upstream.script(_read_call_for_placeholder, "The bad item is 7919.")
    body = {"model": "gpt-5", "input": codex_input(big_log()), "store": False, "stream": stream}
    r = proxy.post("/v1/responses", content=orjson.dumps(body), timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json",
                            "traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    assert r.status_code == 200, r.text
    assert "The bad item is 7919." in r.text
    session = r.headers["x-ctxproxy-session"]
    timeline = proxy.get(f"/ctx/v1/sessions/{session}", headers={"authorization": f"Bearer {KEY}"}).json()
    for _ in range(100):
        if timeline["requests"]:
            break
        timeline = proxy.get(f"/ctx/v1/sessions/{session}", headers={"authorization": f"Bearer {KEY}"}).json()
    (entry,) = timeline["requests"]
    return r, entry


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_turn_with_a_hidden_read_round_is_one_trace_matching_its_figures(upstream, receiver, tmp_path, stream):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/t.db", env=otel_env(receiver), **config())
    with InProcessProxy(settings) as proxy:
        assert proxy.state.tracing.on
        r, entry = turn(proxy, upstream, stream)
    # the proxy has stopped: its lifespan flushed every span to the receiver
    spans = [s for _, s in receiver.spans]
    assert receiver.posts and set(receiver.posts) == {"/v1/traces"}
    resource = {kv.key: kv.value.string_value for kv in receiver.spans[0][0].attributes}
    assert resource["service.name"] == "ctxproxy-under-test"
    assert {s.trace_id.hex() for s in spans} == {TRACE_ID}, "one trace, the client's"

    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.name == "ctxproxy POST /v1/responses" and server.parent_span_id.hex() == CLIENT_SPAN
    below = {s.span_id: s for s in spans}
    for s in spans:
        if s is not server:
            assert s.parent_span_id in below, f"{s.name} hangs under a span of this trace"

    transforms = [s for s in spans if s.name.startswith("ctxproxy transform ")]
    assert [s.name.split()[-1] for s in transforms] == ["offload", "compress", "context_read", "status_bar",
                                                        "cache_hints"]
    assert all(s.parent_span_id == server.span_id for s in transforms)

    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time_unix_nano)
    assert [attrs(s)["ctxproxy.upstream.kind"] for s in calls] == ["turn", "read_round"]
    assert all(s.kind == CLIENT and s.parent_span_id == server.span_id and s.name == "chat gpt-5" for s in calls)
    sent = [rq for rq in upstream.requests if rq.path == "/v1/responses"]
    assert len(sent) == 2 and HANDLE.search(json.dumps(sent[0].json["input"]).replace('\\"', '"'))
    for call, rq in zip(calls, sent):  # the provider saw each call's own span as its parent
        assert rq.headers["traceparent"] == f"00-{TRACE_ID}-{call.span_id.hex()}-01"
        assert rq.headers["tracestate"] == "vendor=1"

    stores = [s for s in spans if s.name.startswith("ctxproxy store ")]
    offload = next(s for s in transforms if s.name.endswith("offload"))
    assert any(s.parent_span_id == offload.span_id for s in stores), "the offload's writes are its children"
    assert all(s.kind == CLIENT for s in stores)
    first, second = (c.start_time_unix_nano for c in calls)
    answered = [s for s in stores if first < s.start_time_unix_nano < second]
    assert answered and all(s.parent_span_id == server.span_id for s in answered), "the read round's lookups"

    a = attrs(server)
    assert a["gen_ai.request.model"] == "gpt-5" and a["gen_ai.provider.name"] == "openai"
    assert a["ctxproxy.session"] == r.headers["x-ctxproxy-session"] and a["ctxproxy.route"] == entry["route"]
    assert a["ctxproxy.request_id"] == entry["request_id"] == r.headers["x-ctxproxy-request-id"]
    assert a["gen_ai.usage.input_tokens"] == entry["prompt"]
    assert a["gen_ai.usage.output_tokens"] == entry["completion"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == entry["cached"]
    assert a["ctxproxy.offloads"] == entry["offloaded"] and a["ctxproxy.offloads_new"] == entry["offloaded_new"] == 1
    assert a["ctxproxy.tokens_saved"] == entry["saved"] == int(r.headers["x-ctxproxy-tokens-saved"]) > 0
    assert a["ctxproxy.read_rounds"] == entry["read_rounds"] == 1
    assert a["ctxproxy.cacheable_tokens"] == entry["cacheable"] and a["http.response.status_code"] == 200
    assert ("ctxproxy.cache_break" in a) == bool(entry["break"])
    # each call's own usage adds up to the turn's
    per_call = [attrs(s) for s in calls]
    assert sum(c["gen_ai.usage.input_tokens"] for c in per_call) == entry["prompt"]
    assert sum(c["gen_ai.usage.output_tokens"] for c in per_call) == entry["completion"]
    # never the conversation's content (logging.log_content is off)
    text = json.dumps([[str(v) for v in attrs(s).values()] for s in spans])
    assert "processed item" not in text and "Find the bad item" not in text and "7919" not in text


def test_a_compaction_summary_call_is_a_client_span_under_the_compress_transform(upstream, receiver, tmp_path):
    from test_responses_api import _summary_or_ok

    upstream.default_window = 8000
    upstream.script(*[_summary_or_ok] * 4)
    raw = {"defaults": {"offload": {"enabled": False}, "compress": {"trigger": 0.5, "keep_recent_tokens": 500}},
           "models": {"gpt-5": {"context_window": 8000}}}
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", env=otel_env(receiver), **raw)
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find the bad item."}]}]
    for i in range(12):
        items += [{"type": "function_call", "name": "shell", "arguments": json.dumps({"command": f"cat {i}.log"}),
                   "call_id": f"call_{i}"},
                  {"type": "function_call_output", "call_id": f"call_{i}", "output": big_log(40)}]
    with InProcessProxy(settings) as proxy:
        r = proxy.post("/v1/responses", content=orjson.dumps({"model": "gpt-5", "input": items, "store": False}),
                       headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert r.status_code == 200, r.text
    spans = [s for _, s in receiver.spans]
    compress = next(s for s in spans if s.name == "ctxproxy transform compress")
    summaries = [s for s in spans if attrs(s).get("ctxproxy.upstream.kind") == "summary"]
    assert r.headers.get("x-ctxproxy-compacted") == "summary"
    assert summaries and all(s.kind == CLIENT and s.parent_span_id == compress.span_id for s in summaries)
    assert all("gen_ai.usage.input_tokens" in attrs(s) for s in summaries)
    a = attrs(next(s for s in spans if s.kind == SERVER))
    assert a["ctxproxy.compaction"] == "summary" and a["ctxproxy.own_calls"] == len(summaries)


def test_tracing_off_imports_no_sdk_and_passes_the_clients_traceparent_on(upstream, tmp_path):
    code = f"""
import sys, json
sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parent.parent)!r}]
from mock_upstream import MockUpstream
from proxy_server import InProcessProxy, make_settings
with MockUpstream() as mock, InProcessProxy(make_settings(mock.base_url, "sqlite:///{tmp_path}/off.db")) as p:
    r = p.post("/v1/chat/completions", json={{"model": "gpt-5", "messages": [{{"role": "user", "content": "hi"}}]}},
               headers={{"authorization": "Bearer sk-off", "traceparent": {TRACEPARENT!r}}})
    assert r.status_code == 200, r.text
    print(json.dumps({{"tracing": type(p.state.tracing).__name__, "on": p.state.tracing.on,
                      "traceparent": mock.requests[-1].headers.get("traceparent"),
                      "loaded": sorted(m for m in sys.modules
                                       if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter",
                                                        "proxy.telemetry.otel")))}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"tracing": "Tracing", "on": False, "traceparent": TRACEPARENT, "loaded": []}


def test_tracing_off_in_process_exports_nothing(upstream, receiver, tmp_path):
    env = {**otel_env(receiver), "OTEL_SDK_DISABLED": "true"}
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/d.db", env=env)
    with InProcessProxy(settings) as proxy:
        assert not proxy.state.tracing.on and not proxy.state.store.tracing.on
        r = proxy.post("/v1/chat/completions", json={"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]},
                       headers={"authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT})
        assert r.status_code == 200
    assert upstream.requests[-1].headers["traceparent"] == TRACEPARENT
    assert receiver.posts == []


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_SERVICE_NAME": "only-a-name"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True),
])
def test_tracing_is_on_only_when_an_otlp_endpoint_is_named(env, on):
    from proxy.telemetry import enabled

    assert enabled(env) is on


def test_without_the_otel_extra_tracing_stays_off_and_says_why():
    code = """
import sys
sys.modules["opentelemetry.sdk"] = None  # as if the extra were not installed
from proxy.logs import setup_logging
from proxy.telemetry import OFF, setup
setup_logging()
assert setup({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is OFF
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install 'ctxproxy[otel]'" in done.stdout + done.stderr


def test_the_retry_after_a_context_overflow_is_its_own_client_span(upstream, receiver, tmp_path):
    from test_compress import agent_run
    from test_offload import TOOLS
    from test_tenancy_and_paths import _overflow

    raw = {"defaults": {"offload": {"enabled": False}, "status_bar": {"enabled": False},
                        "compress": {"keep_recent_tokens": 300}}}
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/o.db", env=otel_env(receiver), **raw)
    upstream.fail_next(400, _overflow(1500, 3000))
    with InProcessProxy(settings) as proxy:
        r = proxy.post("/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=30,
                       json={"model": "local-coder", "messages": agent_run(8), "tools": TOOLS})
        assert r.status_code == 200 and r.headers["x-ctxproxy-window-learned"] == "1500"
    spans = [s for _, s in receiver.spans]
    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time_unix_nano)
    assert [(attrs(s)["ctxproxy.upstream.kind"], attrs(s)["http.response.status_code"]) for s in calls] == [
        ("turn", 400), ("summary", 200), ("retry", 200)]  # the retry, rewritten for the learned window
    assert [rq.headers["traceparent"].split("-")[2] for rq in upstream.requests] == [c.span_id.hex() for c in calls]
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.name == "ctxproxy POST /v1/chat/completions" and attrs(server)["http.response.status_code"] == 200


def test_count_tokens_pass_through_and_websocket_turns_say_what_they_are(upstream, receiver, tmp_path):
    """Beside the agent's HTTP turns: each request's SERVER span says its operation and its transport, and
    count_tokens' and pass-through's provider calls are CLIENT spans named for what they are."""
    from proxy_server import ProxyServer
    from test_responses_ws import COMMON, FIRST, completed, ws_url
    from test_responses_ws import turn as ws_turn
    from websockets.sync.client import connect

    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/k.db", env=otel_env(receiver))
    upstream.script("ok")
    auth = {"authorization": f"Bearer {KEY}"}
    with ProxyServer(settings) as proxy:  # a real server: the WebSocket is served by uvicorn
        count = proxy.http_client().post("/v1/messages/count_tokens", headers={**auth, "traceparent": TRACEPARENT},
                                         json={"model": "claude-sonnet-4-6",
                                               "messages": [{"role": "user", "content": "hi"}]})
        assert count.status_code == 200, count.text
        assert proxy.http_client().get("/v1/models", headers=auth).status_code == 200
        with connect(ws_url(proxy), additional_headers=auth) as ws:
            completed(ws_turn(ws, **COMMON, input=FIRST))
        assert proxy.http_client().post("/v1/chat/completions", headers=auth, json={
            "model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    spans = [s for _, s in receiver.spans]
    servers = {s.name: attrs(s) for s in spans if s.kind == SERVER}
    said = {name: (a["ctxproxy.operation"], a["ctxproxy.transport"]) for name, a in servers.items()}
    assert said == {"ctxproxy POST /v1/messages/count_tokens": ("count_tokens", "http"),
                    "ctxproxy GET /v1/models": ("passthrough", "http"),
                    "ctxproxy POST /v1/responses": ("turn", "websocket"),
                    "ctxproxy POST /v1/chat/completions": ("turn", "http")}
    assert "gen_ai.operation.name" not in servers["ctxproxy GET /v1/models"]
    by_id = {s.span_id: s for s in spans}
    calls = {s.name: s for s in spans if s.kind == CLIENT and not s.name.startswith("ctxproxy store")}
    assert set(calls) == {"count_tokens claude-sonnet-4-6", "GET", "chat gpt-5"}
    assert by_id[calls["count_tokens claude-sonnet-4-6"].parent_span_id].name.endswith("/count_tokens")
    assert by_id[calls["GET"].parent_span_id].name == "ctxproxy GET /v1/models"
    count_call = calls["count_tokens claude-sonnet-4-6"]
    assert count_call.trace_id.hex() == TRACE_ID and attrs(count_call)["http.response.status_code"] == 200
    counted = next(rq for rq in upstream.requests if rq.path == "/v1/messages/count_tokens")
    assert counted.headers["traceparent"] == f"00-{TRACE_ID}-{count_call.span_id.hex()}-01"


def test_the_log_stays_json_with_trace_headers_over_512_characters_and_a_failed_export(upstream, receiver, tmp_path):
    """W3C Trace Context: a traceparent over 512 characters is no traceparent (the request starts its own trace)
    and a tracestate over 512 may be dropped. `ctxproxy serve`'s stderr stays JSON lines: OpenTelemetry, left to
    itself, writes there in plain text a warning about each such header (one per request a client sends) and
    the failure of an export (here, the collector answering 400), which is the operator's to read, as JSON."""
    import httpx
    import test_serve

    long_parent = f"01-{TRACE_ID}-{CLIENT_SPAN}-01-" + "a" * 560  # a later version's extra fields: valid but long
    long_state = "vendor=" + "1" * 600

    def post(headers: dict[str, str]) -> None:
        r = httpx.post(s.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", **headers},
                       json={"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        assert r.status_code == 200, r.text

    s = test_serve.serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url, **otel_env(receiver)})
    try:
        post({"traceparent": long_parent, "tracestate": "vendor=1"})
        post({"traceparent": TRACEPARENT, "tracestate": long_state})
        deadline = time.monotonic() + 10
        while sum(sp.kind == SERVER for _, sp in receiver.spans) < 2:  # exported (OTEL_BSP_SCHEDULE_DELAY 20 ms)
            assert time.monotonic() < deadline, "the two requests' spans were not exported"
            time.sleep(0.02)
        receiver.status, posts = 400, len(receiver.posts)
        post({})
        while len(receiver.posts) == posts:
            assert time.monotonic() < deadline + 10, "the third request's spans were never sent"
            time.sleep(0.02)
    finally:
        assert test_serve.stop(s)
    text = [line for line in s.log.read_text().splitlines() if not line.startswith("{")]
    assert text == [], "plain text in the JSON log"
    failed = [line for line in s.log_lines() if line["msg"].startswith("Failed to export") and "400" in line["msg"]]
    assert failed and failed[0]["level"] == "error", "the failed export, said as JSON"
    servers = sorted((sp for _, sp in receiver.spans if sp.kind == SERVER), key=lambda sp: sp.start_time_unix_nano)
    new_root, continued = servers
    assert new_root.trace_id.hex() != TRACE_ID and not new_root.parent_span_id, "the long traceparent was followed"
    assert continued.trace_id.hex() == TRACE_ID and continued.parent_span_id.hex() == CLIENT_SPAN
    sent = [rq.headers for rq in upstream.requests if rq.path == "/v1/chat/completions"][:2]
    assert [h["traceparent"].split("-")[1] for h in sent] == [new_root.trace_id.hex(), TRACE_ID]
    assert [h.get("tracestate") for h in sent] == [None, None]  # the first one's was of the trace set aside
