"""A scriptable, real-HTTP mock of the OpenAI API for tests and benchmarks.

The proxy under test talks to its upstream over real HTTP (httpx), so an in-process
ASGI transport would not exercise it: this mock binds 127.0.0.1 on a free port
and serves a plain ASGI app (Starlette request/response objects) with uvicorn
in a daemon thread.

It is faithful where the proxy's behaviour depends on it: prompt token counts
(tiktoken o200k_base over a deterministic rendering), the context-window 400,
prompt-cache accounting computed from a real token-prefix comparison (those
rules are in tests/_mock_prompt.py, independent of the proxy's code), and the
exact SSE framing of chat and Responses streams. The Responses API is served
as fully as chat: the same rendering and cache rules item by item
(tests/_mock_responses_prompt.py), stored responses for previous_response_id
and GET, its error shapes, the full event sequence of a stream
(tests/_mock_responses_wire.py), /v1/responses/input_tokens,
/v1/responses/compact, and a request ending in Codex's `compaction_trigger`.
Anthropic's Messages API too (``POST /v1/messages`` and
``/v1/messages/count_tokens``): its validation and error envelope, a
block-by-block rendering and Anthropic's own caching rules, written only at
``cache_control`` breakpoints and found by a 20-block lookback
(tests/_mock_messages_prompt.py), and its message object and exact SSE event
sequence (tests/_mock_messages_wire.py); `claude-*` models have a 200k window.
A scripted model (`ShellAgent`, tests/_mock_agent.py), set as `default_reply`,
plays every turn of a real Codex or Claude Code session with the client's own
shell tool. Everything else is minimal.
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
    from . import _mock_agent as ag
    from . import _mock_gemini_wire as gw
    from . import _mock_messages_prompt as ap
    from . import _mock_messages_wire as aw
    from . import _mock_prompt as mp
    from . import _mock_responses_prompt as rp
    from . import _mock_responses_wire as rw
    from . import _mock_stream as ms
except ImportError:
    import _mock_agent as ag  # type: ignore[no-redef]
    import _mock_gemini_wire as gw  # type: ignore[no-redef]
    import _mock_messages_prompt as ap  # type: ignore[no-redef]
    import _mock_messages_wire as aw  # type: ignore[no-redef]
    import _mock_prompt as mp  # type: ignore[no-redef]
    import _mock_responses_prompt as rp  # type: ignore[no-redef]
    import _mock_responses_wire as rw  # type: ignore[no-redef]
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
render_item = rp.render_item
responses_prompt_chunks = rp.prompt_chunks
responses_prompt_token_ids = rp.prompt_token_ids
render_block = ap.render_block
messages_prompt_chunks = ap.prompt_chunks
messages_prompt_token_ids = ap.prompt_token_ids
messages_prompt_tokens = ap.prompt_tokens
min_cacheable_tokens = ap.min_cacheable_tokens
BreakpointCache = ap.BreakpointCache
messages_error_body = aw.error_body
ShellAgent = ag.ShellAgent  # a scripted model for real agent binaries (tests/_mock_agent.py)

DEFAULT_WINDOW = 128_000
DEFAULT_WINDOWS: dict[str, int] = {"gpt-4o": 128_000, "gpt-4o-mini": 128_000}
CLAUDE_WINDOW = 200_000  # every `claude-*` model without an entry or a `-NNk` suffix
RESPONSES_WINDOW_MESSAGE = ("Your input exceeds the context window of this model. "
                            "Please adjust your input and try again.")
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
    answer: bytes | None = None  # the body it answered with, unless streamed (e.g. an error's)
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
        self.stored = rp.ResponseStore()  # Responses API: kept responses, per API key
        self.messages_cache = ap.BreakpointCache()  # Messages API: Anthropic's breakpoint cache
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
        """Back to defaults: no requests, script, failures, delays, cached prefixes or stored responses."""
        with self._lock:
            self.requests.clear()
            self.errors.clear()
            self.cache.clear()
            self.messages_cache.clear()
            self.stored.clear()
            self._script: collections.deque[ScriptEntry] = collections.deque()
            # what a request gets once the script is empty: e.g. a ShellAgent (tests/_mock_agent.py), which
            # answers every turn of a real agent binary's session
            self.default_reply: ScriptEntry = "ok"
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
            # set: a chat stream holds its last event until the Event is set (at most 10 s); whether it was
            # set in time is appended to stream_released
            self.stream_gate: threading.Event | None = None
            self.stream_released: list[bool] = []
            self.clock: Callable[[], float] = time.monotonic
            self._seq = 0
            self._call_seq = 0

    # ---- scripting

    def script(self, *responses: ScriptEntry) -> None:
        """Queue replies: text, `{"tool_calls": [{"name", "arguments"}], "content"?, "thinking"?}`, or a
        callable `(request_json) -> either`. Used in order by chat, Responses and Messages requests
        alike (a Responses reply is a message item and/or function_call items, a Messages reply text
        and/or tool_use blocks, after a thinking block if the request enables thinking); `default_reply`
        ("ok" unless set) when empty."""
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
        """`windows[model]`, else a `-32k`-style suffix, else 200k for `claude-*`, else `default_window`."""
        if model in self.windows:
            return self.windows[model]
        m = re.search(r"-(\d+)k$", model)
        if m:
            return int(m.group(1)) * 1000
        return CLAUDE_WINDOW if model.startswith("claude-") else self.default_window

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
        if not isinstance(response, StreamingResponse):
            rec.answer = bytes(response.body)
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
        if key == ("POST", "/v1/responses/input_tokens"):
            return self._responses_input_tokens(rec)
        if key == ("POST", "/v1/responses/compact"):
            return self._responses_compact(rec)
        if rec.method == "GET" and rec.path.startswith("/v1/responses/"):
            return self._responses_get(rec)
        if key == ("POST", "/v1/messages"):
            return self._messages(rec, first_delay, chunk_delay)
        if key == ("POST", "/v1/messages/count_tokens"):
            return self._messages_count_tokens(rec)
        if gw.handles(rec.path):  # Google's Gemini API, /v1beta/ and /v1/models/{model}:method (_mock_gemini_wire.py)
            return gw.serve(self, rec, first_delay, chunk_delay)
        if rec.path == "/v1/messages" or rec.path.startswith("/v1/messages/"):
            return self._messages_error(aw.ERROR_STATUS["not_found_error"], "not_found_error", "Not Found")
        return self._json(404, ms.error_body(f"Invalid URL ({rec.method} {rec.path})"))

    async def _hold(self) -> None:
        gate = self.stream_gate
        if gate is not None:
            self.stream_released.append(await asyncio.to_thread(gate.wait, 10))

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

    def _cached_tokens(self, rec: RecordedRequest, model: str, key: Any, chunks: list[mp.Chunk],
                       marks: Callable[[], list[int]]) -> int:
        """What the provider bills as cached for this prompt, and remember it: chat and Responses alike.

        Several cache machines: a request lands on the one its prompt_cache_key
        picks, or, without a key, wherever the load balancer sends it (round
        robin here). `marks` gives the cache-marked chunks, for breakpoint models.
        """
        with self._lock:
            self._routed += 1
            shard = zlib.crc32(str(key).encode()) % self.shards if key else self._routed % self.shards
            scope = (rec.headers.get("authorization", ""), f"{model}#{shard}")
            common = self.cache.match_and_store(scope, chunks, self.clock(), self.cache_ttl)
            if any(fnmatch.fnmatchcase(model, g) for g in self.breakpoint_models):
                common = self._at_breakpoints(scope, chunks, marks(), common)
            return billable_cached(common)

    @staticmethod
    def _completion_tokens(reply: ms.Reply) -> int:
        return len(tokens(reply.text or "")) + sum(len(tokens(c.name + c.arguments)) for c in reply.tool_calls)

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

    def _next_reply(self, body: dict[str, Any], call_prefix: str = "call_") -> ms.Reply:
        with self._lock:
            entry: ScriptEntry = self._script.popleft() if self._script else self.default_reply
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
            calls.append(ms.ToolCall(call.get("id") or f"{call_prefix}{n}", call["name"],
                                     args if isinstance(args, str)
                                     else json.dumps(args, separators=(",", ":"))))
        return ms.Reply(entry.get("content"), calls, entry.get("thinking"))

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
        cached = self._cached_tokens(rec, model, body.get("prompt_cache_key"), chunks,
                                     lambda: mp.breakpoint_chunks(body))
        reply = self._next_reply(body)
        completion = self._completion_tokens(reply)
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
        return StreamingResponse(ms.sse_stream(events, first_delay=first_delay, chunk_delay=chunk_delay,
                                               hold=self._hold if self.stream_gate is not None else None),
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

    # ---- Responses API

    def _responses_prompt(self, rec: RecordedRequest) -> rp.Prompt | Response:
        """The conversation a Responses request continues, rendered; or the 400 OpenAI answers instead."""
        try:
            return rp.render(rec.json, self.stored.history(rec.headers.get("authorization", ""), rec.json))
        except rp.RequestError as e:
            return self._json(e.status, ms.error_body(e.message, param=e.param, code=e.code))

    def _over_window(self, model: str, prompt: rp.Prompt, budget: int) -> Response | None:
        if prompt.tokens + budget <= self.window_for(model):
            return None
        return self._json(400, ms.error_body(RESPONSES_WINDOW_MESSAGE, param="input",
                                             code="context_length_exceeded"))

    def _responses_usage(self, rec: RecordedRequest, prompt: rp.Prompt, cached: int,
                         output_tokens: int) -> dict[str, Any]:
        """Record the full usage on `rec`; return what is reported (no details if report_cached is off).

        cache_write_tokens: the billable prefix this prompt adds to the cache
        beyond what it read from it (the mock writes every prompt's prefix).
        """
        written = max(0, billable_cached(prompt.tokens) - cached)
        rec.usage = rw.usage(prompt.tokens, cached, written, output_tokens)
        usage = dict(rec.usage)
        if not self.report_cached:
            del usage["input_tokens_details"]
        return usage

    def _responses(self, rec: RecordedRequest, first_delay: float,
                   chunk_delay: float) -> Response:
        body = rec.json
        if (bad := self._invalid_body(body, ("model",))) is not None:
            return bad
        model = str(body["model"])
        prompt = self._responses_prompt(rec)
        if isinstance(prompt, Response):
            return prompt
        if (bad := self._over_window(model, prompt, body.get("max_output_tokens") or 0)) is not None:
            return bad
        cached = self._cached_tokens(rec, model, body.get("prompt_cache_key"), prompt.chunks,
                                     lambda: prompt.marks)
        if rp.compacts(body):  # the provider compacts the context: no model turn, no script entry taken
            n = self._next_id()
            output = [rw.compaction_item(f"mock{n}")]
            usage = self._responses_usage(rec, prompt, cached, len(tokens(output[0]["encrypted_content"])))
        else:
            reply = self._next_reply(body)
            n = self._next_id()
            output = rw.output_items(f"mock{n}", reply, body)
            usage = self._responses_usage(rec, prompt, cached, self._completion_tokens(reply))
        resp = rw.response_object(id_=f"resp_mock{n}", created=1_700_000_000 + n, body=body,
                                  output=output, usage=usage)
        if body.get("store", True) is not False:
            self.stored.put(rec.headers.get("authorization", ""), prompt.items + output, resp)
        headers = {"x-request-id": f"req_mock{n}", "openai-processing-ms": "1"}
        if not body.get("stream"):
            return self._json(200, resp, headers)
        return StreamingResponse(ms.sse_stream(rw.sse_events(rw.stream_events(resp)),
                                               first_delay=first_delay, chunk_delay=chunk_delay),
                                 media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})

    def _responses_input_tokens(self, rec: RecordedRequest) -> Response:
        """What the request would be billed as input, without running it (nothing cached or kept)."""
        if (bad := self._invalid_body(rec.json, ())) is not None:
            return bad
        prompt = self._responses_prompt(rec)
        if isinstance(prompt, Response):
            return prompt
        return self._json(200, {"object": "response.input_tokens", "input_tokens": prompt.tokens})

    def _responses_compact(self, rec: RecordedRequest) -> Response:
        """The conversation reduced to its user messages and one opaque compaction item, as Codex replays it."""
        body = rec.json
        if (bad := self._invalid_body(body, ("model",))) is not None:
            return bad
        model = str(body["model"])
        prompt = self._responses_prompt(rec)
        if isinstance(prompt, Response):
            return prompt
        if (bad := self._over_window(model, prompt, 0)) is not None:
            return bad
        cached = self._cached_tokens(rec, model, body.get("prompt_cache_key"), prompt.chunks,
                                     lambda: prompt.marks)
        n = self._next_id()
        usage = self._responses_usage(rec, prompt, cached,
                                      len(tokens(rw.compaction_ciphertext(f"mock{n}"))))
        return self._json(200, rw.compacted(tag=f"mock{n}", created=1_700_000_000 + n,
                                            items=prompt.items, usage=usage))

    def _responses_get(self, rec: RecordedRequest) -> Response:
        response_id = rec.path[len("/v1/responses/"):]
        stored = self.stored.get(rec.headers.get("authorization", ""), response_id)
        if stored is None:
            return self._json(404, ms.error_body(f"Response with id '{response_id}' not found."))
        return self._json(200, stored.response)

    # ---- Anthropic Messages API

    def _messages_error(self, status: int, type_: str, message: str) -> Response:
        """Anthropic's error envelope, its request_id also in the `request-id` header as the API sends it."""
        request_id = f"req_mock{self._next_id()}"
        return self._json(status, aw.error_body(type_, message, request_id), {"request-id": request_id})

    @staticmethod
    def _api_key(rec: RecordedRequest) -> str:
        """The request's key: `x-api-key`, or the Bearer token (how SDK 2.x and OAuth clients send one)."""
        auth = rec.headers.get("authorization") or ""
        return rec.headers.get("x-api-key") or auth.removeprefix("Bearer ")

    def _messages_prompt(self, rec: RecordedRequest, *, create: bool) -> ap.Prompt | Response:
        """The request rendered, or the 401/400 Anthropic answers instead."""
        if not self._api_key(rec):
            return self._messages_error(401, "authentication_error", "x-api-key header is required")
        try:
            ap.validate(rec.json, create=create)
        except ap.RequestError as e:
            return self._messages_error(e.status, e.type_, e.message)
        return ap.render(rec.json)

    def _messages(self, rec: RecordedRequest, first_delay: float, chunk_delay: float) -> Response:
        prompt = self._messages_prompt(rec, create=True)
        if isinstance(prompt, Response):
            return prompt
        body = rec.json
        model = body["model"]
        window = self.window_for(model)
        if prompt.tokens > window:  # Anthropic compares the prompt alone with the window
            return self._messages_error(400, "invalid_request_error",
                                        f"prompt is too long: {prompt.tokens} tokens > {window} maximum")
        use = self.messages_cache.use((self._api_key(rec), model), prompt, self.clock(),
                                      ap.min_cacheable_tokens(model))
        n = self._next_id()
        if body["max_tokens"] == 0:  # fills the cache, generates nothing (and takes no script entry)
            content: list[dict[str, Any]] = []
            stop, output = "max_tokens", 0
        else:
            reply = self._next_reply(body, call_prefix="toolu_mock")
            content = aw.content_blocks(f"mock{n}", reply, ap.wants_thinking(body))
            stop, output = aw.stop_reason(content), aw.output_tokens(content)
        rec.usage = aw.usage(prompt.tokens - use.read - use.written, use.read, use.written_5m,
                             use.written_1h, output)
        message = aw.message_object(id_=f"msg_mock{n}", model=model, content=content, stop=stop,
                                    usage=dict(rec.usage))
        headers = {"request-id": f"req_mock{n}"}
        if not body.get("stream"):
            return self._json(200, message, headers)
        return StreamingResponse(ms.sse_stream(aw.sse_events(aw.stream_events(message)),
                                               first_delay=first_delay, chunk_delay=chunk_delay),
                                 media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})

    def _messages_count_tokens(self, rec: RecordedRequest) -> Response:
        """The prompt's tokens as /v1/messages would bill them in all; nothing is cached or generated."""
        prompt = self._messages_prompt(rec, create=False)
        if isinstance(prompt, Response):
            return prompt
        return self._json(200, {"input_tokens": prompt.tokens}, {"request-id": f"req_mock{self._next_id()}"})

    def _echo(self, rec: RecordedRequest) -> Response:
        return self._json(200, {"method": rec.method, "path": rec.path, "query": rec.query,
                                "headers": rec.headers, "body_length": len(rec.body),
                                "body_sha256": hashlib.sha256(rec.body).hexdigest()},
                          {"x-mock-echo": "1"})
