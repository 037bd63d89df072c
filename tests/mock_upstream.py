"""A scriptable, real-HTTP mock of the OpenAI API for tests and benchmarks.

The proxy under test talks to its upstream through aiohttp, so an in-process
ASGI transport would not exercise it: this mock binds 127.0.0.1 on a free port
and serves a plain ASGI app (Starlette request/response objects) with uvicorn
in a daemon thread.

It is faithful where the proxy's behaviour depends on it: prompt token counts
(tiktoken o200k_base over a deterministic rendering), the context-window 400,
prompt-cache accounting computed from a real token-prefix comparison (those
rules are in tests/_mock_prompt.py, independent of the proxy's code), and the
exact SSE framing of chat and Responses streams. Everything else is minimal.
"""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import hashlib
import json
import re
import socket
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

try:  # imported as tests.mock_upstream (benchmarks) or mock_upstream (pytest rootdir)
    from . import _mock_prompt as mp
    from . import _mock_stream as ms
except ImportError:
    import _mock_prompt as mp  # type: ignore[no-redef]
    import _mock_stream as ms  # type: ignore[no-redef]

# Re-exported so tests and benchmarks can recompute what the mock bills.
encoding = mp.encoding
tokens = mp.tokens
render_message = mp.render_message
prompt_chunks = mp.prompt_chunks
prompt_token_ids = mp.prompt_token_ids
billable_cached = mp.billable_cached
common_prefix_len = mp.common_prefix_len
PrefixCache = mp.PrefixCache

DEFAULT_WINDOW = 128_000
DEFAULT_WINDOWS: dict[str, int] = {"gpt-4o": 128_000, "gpt-4o-mini": 128_000}
ScriptEntry = str | dict[str, Any] | Callable[[dict[str, Any]], str | dict[str, Any]]


# --------------------------------------------------------------------------- server

@dataclass
class RecordedRequest:
    """One request exactly as received; `body` is the raw bytes for byte-equality asserts."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    json: Any
    status: int | None = None  # what the mock answered
    usage: dict[str, Any] | None = None  # full usage (cached_tokens even if not reported)


@dataclass
class _Failure:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class MockUpstream:
    """OpenAI-compatible mock server; see module docstring. Use `with MockUpstream() as m:`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []  # tracebacks of mock bugs / failing script callables
        self.cache = PrefixCache()
        self.reset()

    # ---- lifecycle

    def start(self) -> str:
        """Serve on a free 127.0.0.1 port in a daemon thread; returns `http://127.0.0.1:P/v1`."""
        if self._server is not None:
            return self.base_url
        encoding()  # load tiktoken once up front, not inside the first request
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets
        # whose proto says TCP, and without it every request stalls ~40 ms (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self._asgi, interface="asgi3", lifespan="off", loop="asyncio",
                                log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"mock-upstream-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("mock upstream failed to start")
            time.sleep(0.005)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> MockUpstream:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Back to defaults: no requests, script, failures, delays or cached prefixes."""
        with self._lock:
            self.requests.clear()
            self.errors.clear()
            self.cache.clear()
            self._script: collections.deque[ScriptEntry] = collections.deque()
            self._failures: collections.deque[_Failure] = collections.deque()
            self.windows: dict[str, int] = dict(DEFAULT_WINDOWS)
            self.default_window = DEFAULT_WINDOW
            self.report_cached = True
            self.cache_ttl: float | None = None
            self.delay = 0.0
            # per request: seconds to wait before answering a non-streaming request, from its parsed body
            # (e.g. only the proxy's summary calls slow); added to `delay`
            self.delay_for: Callable[[Any], float] | None = None
            self.shards = 1  # cache machines; >1 makes prompt_cache_key matter
            self.breakpoint_models: list[str] = []  # model globs that cache only at marked breakpoints
            self._routed = 0
            self._written: dict[tuple[str, str], set[int]] = {}
            self.chunk_delay = 0.0
            self.clock: Callable[[], float] = time.monotonic
            self._seq = 0
            self._call_seq = 0

    # ---- scripting

    def script(self, *responses: ScriptEntry) -> None:
        """Queue replies: text, `{"tool_calls": [{"name", "arguments"}], "content"?}`, or a
        callable `(request_json) -> either`. Used in order; "ok" when the queue is empty."""
        with self._lock:
            self._script.extend(responses)

    def fail_next(self, status: int, body: dict[str, Any] | bytes | str,
                  headers: dict[str, str] | None = None) -> None:
        """Make the next request (any route) answer `status` with `body`; calls queue up."""
        raw = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) \
            else ms.dumps(body)
        with self._lock:
            self._failures.append(_Failure(status, raw, dict(headers or {})))

    def window_for(self, model: str) -> int:
        """`windows[model]`, else a `-32k`-style suffix, else `default_window`."""
        if model in self.windows:
            return self.windows[model]
        m = re.search(r"-(\d+)k$", model)
        return int(m.group(1)) * 1000 if m else self.default_window

    # ---- ASGI

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        raw = await request.body()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        rec = RecordedRequest(request.method, request.url.path, request.url.query,
                              {k.lower(): v for k, v in request.headers.items()}, raw, parsed)
        with self._lock:
            self.requests.append(rec)
            failure = self._failures.popleft() if self._failures else None
            delay, chunk_delay, delay_for = self.delay, self.chunk_delay, self.delay_for
        streaming = isinstance(parsed, dict) and parsed.get("stream") is True and not failure
        if delay_for is not None and not streaming:
            try:
                extra = float(delay_for(parsed))
            except Exception:
                self.errors.append(traceback.format_exc())
                extra = 0.0
            if extra > 0:
                await asyncio.sleep(extra)
        if delay and not streaming:
            await asyncio.sleep(delay)
        try:
            if failure is not None:
                response: Response = Response(failure.body, failure.status, failure.headers,
                                              media_type="application/json")
            else:
                response = self._route(rec, delay if streaming else 0.0, chunk_delay)
        except Exception:
            self.errors.append(traceback.format_exc())
            response = self._json(500, ms.error_body(f"mock upstream error: {self.errors[-1]}",
                                                     type_="server_error"))
        rec.status = response.status_code
        await response(scope, receive, send)

    def _route(self, rec: RecordedRequest, first_delay: float, chunk_delay: float) -> Response:
        key = (rec.method, rec.path)
        if rec.path.startswith("/v1/echo"):
            return self._echo(rec)
        if key == ("POST", "/v1/chat/completions"):
            return self._chat(rec, first_delay, chunk_delay)
        if key == ("GET", "/v1/models"):
            models = sorted(set(self.windows) | {"gpt-4o-mini"})
            return self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "mock"}
                for m in models]})
        if key == ("POST", "/v1/embeddings"):
            return self._embeddings(rec)
        if key == ("POST", "/v1/responses"):
            return self._responses(rec, first_delay, chunk_delay)
        return self._json(404, ms.error_body(f"Invalid URL ({rec.method} {rec.path})"))

    @staticmethod
    def _json(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
        return Response(ms.dumps(obj), status, headers, media_type="application/json")

    def _at_breakpoints(self, scope: tuple[str, str], chunks: list, marks: list[int], common: int) -> int:
        """Anthropic-style caching: prefixes are written only at marked breakpoints, and a request reads
        the longest earlier-written prefix that ends at or before its own last breakpoint."""
        written = self._written.setdefault(scope, set())
        h, pos, ends = 0, 0, []
        for c in chunks:
            h, pos = hash((h, c)), pos + len(c)
            ends.append((h, pos))
        last = max(marks, default=-1)
        hit = max((p for j, (hj, p) in enumerate(ends) if j <= last and hj in written and p <= common), default=0)
        written.update(ends[j][0] for j in marks)
        return hit

    def _next_id(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _invalid_body(self, body: Any, required: tuple[str, ...]) -> Response | None:
        if not isinstance(body, dict):
            return self._json(400, ms.error_body(
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
                "but what was sent was not valid JSON.)"))
        for name in required:
            if name not in body:
                return self._json(400, ms.error_body(f"Missing required parameter: '{name}'.",
                                                     param=name, code="missing_required_parameter"))
        if "messages" in required and not isinstance(body["messages"], list):
            return self._json(400, ms.error_body("Invalid type for 'messages': expected an array.",
                                                 param="messages", code="invalid_type"))
        return None

    def _next_reply(self, body: dict[str, Any]) -> ms.Reply:
        with self._lock:
            entry: ScriptEntry = self._script.popleft() if self._script else "ok"
        if callable(entry):
            entry = entry(body)
        if isinstance(entry, str):
            return ms.Reply(entry)
        calls = []
        for call in entry.get("tool_calls") or []:
            with self._lock:
                self._call_seq += 1
                n = self._call_seq
            args = call.get("arguments", {})
            calls.append(ms.ToolCall(call.get("id") or f"call_{n}", call["name"],
                                     args if isinstance(args, str)
                                     else json.dumps(args, separators=(",", ":"))))
        return ms.Reply(entry.get("content"), calls)

    def _chat(self, rec: RecordedRequest, first_delay: float, chunk_delay: float) -> Response:
        body = rec.json
        if (bad := self._invalid_body(body, ("model", "messages"))) is not None:
            return bad
        model = str(body["model"])
        chunks = prompt_chunks(body)
        prompt = sum(len(c) for c in chunks)
        window = self.window_for(model)
        budget = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if prompt + budget > window:
            if budget:  # OpenAI words it differently when a completion budget was asked for
                msg = (f"This model's maximum context length is {window} tokens. However, you "
                       f"requested {prompt + budget} tokens ({prompt} in the messages, {budget} "
                       f"in the completion). Please reduce the length of the messages or "
                       f"completion.")
            else:
                msg = (f"This model's maximum context length is {window} tokens. However, your "
                       f"messages resulted in {prompt} tokens. Please reduce the length of the "
                       f"messages.")
            return self._json(400, ms.error_body(msg, param="messages",
                                                 code="context_length_exceeded"))
        key = body.get("prompt_cache_key")
        with self._lock:
            self._routed += 1
            # Several cache machines: a request lands on the one its prompt_cache_key picks,
            # or, without a key, wherever the load balancer sends it (round robin here).
            shard = zlib.crc32(str(key).encode()) % self.shards if key else self._routed % self.shards
            scope = (rec.headers.get("authorization", ""), f"{model}#{shard}")
            common = self.cache.match_and_store(scope, chunks, self.clock(), self.cache_ttl)
            if any(fnmatch.fnmatchcase(model, g) for g in self.breakpoint_models):
                common = self._at_breakpoints(scope, chunks, mp.breakpoint_chunks(body), common)
            cached = billable_cached(common)
        reply = self._next_reply(body)
        completion = len(tokens(reply.text or "")) + sum(
            len(tokens(c.name + c.arguments)) for c in reply.tool_calls)
        rec.usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion,
                     "prompt_tokens_details": {"cached_tokens": cached},
                     "completion_tokens_details": {"reasoning_tokens": 0}}
        usage = dict(rec.usage)
        if not self.report_cached:
            del usage["prompt_tokens_details"]
        n = self._next_id()
        ids = {"id_": f"chatcmpl-mock{n}", "created": 1_700_000_000 + n, "model": model}
        headers = {"x-request-id": f"req_mock{n}", "openai-processing-ms": "1"}
        if not body.get("stream"):
            return self._json(200, ms.completion_json(**ids, reply=reply, usage=usage), headers)
        include = (body.get("stream_options") or {}).get("include_usage") is True
        events = ms.chat_sse_events(ms.chat_chunks(**ids, reply=reply,
                                                   usage=usage if include else None))
        return StreamingResponse(ms.sse_stream(events, first_delay=first_delay,
                                               chunk_delay=chunk_delay),
                                 media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})

    def _embeddings(self, rec: RecordedRequest) -> Response:
        body = rec.json
        if (bad := self._invalid_body(body, ("model", "input"))) is not None:
            return bad
        inp = body["input"]
        items = [inp] if isinstance(inp, str) or (
            isinstance(inp, list) and inp and isinstance(inp[0], int)) else list(inp)
        data, used = [], 0
        for i, item in enumerate(items):
            text = item if isinstance(item, str) else json.dumps(item)
            used += len(tokens(item)) if isinstance(item, str) else len(item)
            data.append(ms.embedding_item(i, ms.fake_vector(text), body.get("encoding_format")))
        return self._json(200, {"object": "list", "data": data, "model": body["model"],
                                "usage": {"prompt_tokens": used, "total_tokens": used}})

    def _responses(self, rec: RecordedRequest, first_delay: float,
                   chunk_delay: float) -> Response:
        body = rec.json
        if (bad := self._invalid_body(body, ("model", "input"))) is not None:
            return bad
        text = ms.responses_input_text(body["input"])
        n_tokens = len(tokens(text))
        n = self._next_id()
        resp = ms.response_object(id_=f"resp_mock{n}", created=1_700_000_000 + n,
                                  model=str(body["model"]), text=text, status="completed",
                                  input_tokens=n_tokens, output_tokens=n_tokens)
        if not body.get("stream"):
            return self._json(200, resp)
        return StreamingResponse(ms.sse_stream(ms.responses_sse_events(resp, text),
                                               first_delay=first_delay, chunk_delay=chunk_delay),
                                 media_type="text/event-stream")

    def _echo(self, rec: RecordedRequest) -> Response:
        return self._json(200, {"method": rec.method, "path": rec.path, "query": rec.query,
                                "headers": rec.headers, "body_length": len(rec.body),
                                "body_sha256": hashlib.sha256(rec.body).hexdigest()},
                          {"x-mock-echo": "1"})
