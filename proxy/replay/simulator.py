"""A built-in provider SIMULATOR: OpenAI's chat and Responses endpoints and Anthropic's Messages API, no key, no model.

It exists so that ctxproxy can be seen working without a provider
(``ctxproxy replay --simulate``, or ``python -m proxy.replay.simulator`` to put it
behind ``ctxproxy serve``). Everything it answers is marked as simulated: the
``x-ctxproxy-simulated: 1`` response header, ``system_fingerprint:
"ctxproxy-simulator"`` (chat), ``*_sim`` ids (``resp_sim``, ``msg_sim``), and
the text of its answers.

What it simulates, and how (the rules are exact so that anyone can recompute
its figures):

* **Prompt tokens.** A chat request is rendered as token *chunks*: first, if
  the request has ``tools``, the text ``"<|tools|>" + json.dumps(tools)``; then
  one chunk per message, ``render_message(m)``:
  ``<|{role}|>[ name={name}]\\n{content text}`` followed, for each tool call,
  by ``\\n<tool_call id={id}>{name}({arguments})``, then
  ``\\n<tool_call_id={id}>`` for a tool message, then ``<|end|>\\n``. Content
  text: a string as is; a list of parts joined by ``\\n`` (a part's ``text``,
  ``[image]`` for an image, else its JSON with sorted keys). Each chunk is
  tokenized on its own with o200k_base (``encode_ordinary``); the prompt is
  the concatenation, ``prompt_tokens`` its length.
* **The context window.** ``prompt_tokens`` plus the completion budget asked
  for (``max_completion_tokens`` or ``max_tokens``, else 0) over the window is
  answered with HTTP 400 ``context_length_exceeded`` in OpenAI's error shape
  and wording. A rejected request is not billed and not cached.
* **Prompt caching, as OpenAI reports it.** ``usage.prompt_tokens_details.
  cached_tokens`` is the longest common token prefix with any earlier
  accepted request of the same ``Authorization`` header and ``model``: 0 when
  under 1,024 tokens, else rounded down to a multiple of 128. Nothing expires.
* **Answers.** ``"ok"`` to ordinary requests (a replay ignores them), and a
  deterministic, *extractive* answer to ctxproxy's own summarizer calls
  (recognised by their system prompt, :data:`proxy.rewrite.compress.summarizer.SYSTEM_PROMPT`
  or :data:`proxy.rewrite.compress.summarizer.FACT_PROMPT`, or in the cached shape by a last
  message opening with :data:`proxy.rewrite.compress.summarizer.COMPACTION_OPEN`, whose span
  is the conversation above it after the head): the requested section headings,
  each followed by a few lines copied from the transcript. Real summaries are
  written by a model; these only stand in for their size and shape.

Every request is appended to :attr:`Simulator.log` (kind, status, prompt,
cached and completion tokens), so a caller can count what the provider saw,
including the proxy's own calls. ``stream: true`` is answered as SSE, with a
usage chunk when ``stream_options.include_usage`` is set.

``POST /v1/responses`` (OpenAI's Responses API) is served by the same rules:
its rendering of ``instructions``, ``tools`` and ``input`` items, its usage,
error and stream shapes are in proxy/replay/sim_responses.py.

``POST /v1/messages`` (Anthropic's Messages API, and its ``count_tokens``) has
its own rules where Anthropic's differ: block-by-block rendering, caching only
at ``cache_control`` breakpoints (with the 20-block lookback), Anthropic's
usage, error and stream shapes; they are in proxy/replay/sim_messages.py (answers and wire shapes),
proxy/replay/sim_messages_prompt.py (rendering and the breakpoint cache) and
proxy/replay/sim_messages_validation.py (what is refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.replay import sim_messages, sim_messages_prompt, sim_messages_validation, sim_responses
from proxy.replay.sim_answers import _answer, call_kind
from proxy.replay.sim_prompt import (
    DEFAULT_WINDOW,
    ENCODING,
    FINGERPRINT,
    SIMULATED_HEADER,
    PrefixCache,
    billable_cached,
    prompt_chunks,
    tokens,
)
from proxy.tokens.encodings import ensure_encodings, get_encoding

# --------------------------------------------------------------------------- the simulator

_PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
                    "/v1/models", "/healthz"})


_READ_CALL = re.compile(r'(\w+)\(handle="(ctx_[0-9a-f]{20})"')  # the read call a placeholder ends with


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def overflow_message(window: int, prompt: int, budget: int) -> str:
    """OpenAI's wording of `context_length_exceeded`."""
    if budget:
        return (f"This model's maximum context length is {window} tokens. However, you requested "
                f"{prompt + budget} tokens ({prompt} in the messages, {budget} in the completion). "
                f"Please reduce the length of the messages or completion.")
    return (f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{prompt} tokens. Please reduce the length of the messages.")


@dataclass
class SimRecord:
    """One request the simulator received."""

    kind: str  # "turn" (an ordinary request), "summary" / "facts" (ctxproxy's summarizer), "invalid"
    model: str
    status: int
    prompt_tokens: int  # counted even when rejected (then not billed)
    cached_tokens: int  # tokens read from the cache (Messages: cache_read_input_tokens)
    completion_tokens: int
    error: str | None = None  # OpenAI error code, e.g. "context_length_exceeded" (also Anthropic's window errors)
    cache_write: int = 0  # Messages: cache_creation_input_tokens

    @property
    def billed(self) -> bool:
        return self.status == 200

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Simulator:
    """The simulated provider; an ASGI app (``simulator.app``) and a plain function (``complete``).

    ``window``: the context window of every model, unless ``windows`` names one. ``read_back``: a chat turn
    whose last message is a placeholder naming a handle (an offloaded tool result) is answered with a call of
    the read tool it names, once per handle, as a model that wants the rest would: the proxy answers it in a
    hidden round, and the turn's answer comes after it.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, windows: Mapping[str, int] | None = None,
                 read_back: bool = False) -> None:
        self.window = window
        self.windows = dict(windows or {})
        self.read_back = read_back
        self._read: set[str] = set()  # handles read back so far
        self.cache = PrefixCache()
        self.breakpoints = sim_messages_prompt.BreakpointCache()  # the Messages API's cache
        self.log: list[SimRecord] = []
        self._lock = threading.Lock()
        self._seq = 0
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/healthz", self._health, methods=["GET"]),
        ])

    def window_for(self, model: str) -> int:
        return self.windows.get(model, self.window)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in _PATHS:
            resp = _json(404, error_body(f"Invalid URL ({scope.get('method')} {scope['path']}) (ctxproxy "
                                         "simulator: only /v1/chat/completions, /v1/responses, /v1/messages and "
                                         "/v1/models)"))
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    # ---- the core, usable without HTTP

    def complete(self, body: Any, authorization: str = "") -> tuple[int, dict[str, Any]]:
        """Answer one chat request: (HTTP status, JSON body), and log it."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or "model" not in body:
            what = "a JSON object with 'model' and a 'messages' array"
            self._record(SimRecord("invalid", str(body.get("model", "")) if isinstance(body, dict) else "", 400,
                                   0, 0, 0, "invalid_request"))
            return 400, error_body(f"ctxproxy simulator: expected {what}.", code="invalid_request")
        model = str(body["model"])
        kind = call_kind(body)
        chunks = prompt_chunks(body)
        prompt = sum(len(c) for c in chunks)
        budget = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        budget = budget if isinstance(budget, int) else 0
        window = self.window_for(model)
        if prompt + budget > window:
            self._record(SimRecord(kind, model, 400, prompt, 0, 0, "context_length_exceeded"))
            return 400, error_body(overflow_message(window, prompt, budget), param="messages",
                                   code="context_length_exceeded")
        with self._lock:
            cached = billable_cached(self.cache.match_and_store((authorization, model), chunks))
        call = self._read_call(body) if kind == "turn" and self.read_back and body.get("stream") is not True else None
        if call is not None:
            return self._called(call, model, prompt, cached)
        text = _answer(kind, body)
        completion = tokens(text)
        if budget and len(completion) > budget:
            text = get_encoding(ENCODING).decode(list(completion[:budget]))
            completion = completion[:budget]
        usage = {"prompt_tokens": prompt, "completion_tokens": len(completion),
                 "total_tokens": prompt + len(completion),
                 "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                               "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
        n = self._record(SimRecord(kind, model, 200, prompt, cached, len(completion)))
        return 200, {"id": f"chatcmpl-sim{n}", "object": "chat.completion", "created": int(time.time()),
                     "model": model, "system_fingerprint": FINGERPRINT,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                                  "logprobs": None, "finish_reason": "stop"}],
                     "usage": usage}

    def _read_call(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The read call a turn whose newest tool result is an unread placeholder gets (its tool among the
        request's); the proxy's status bar may follow that result."""
        last = next((m for m in reversed(body["messages"]) if isinstance(m, dict) and m.get("role") == "tool"), None)
        text = last.get("content") if last is not None else None
        found = _READ_CALL.search(text) if isinstance(text, str) else None
        tools = {((t.get("function") or {}).get("name")) for t in body.get("tools") or () if isinstance(t, dict)}
        if found is None or found.group(1) not in tools:
            return None
        with self._lock:
            if found.group(2) in self._read:
                return None
            self._read.add(found.group(2))
        args = json.dumps({"handle": found.group(2), "offset": 0, "limit": 20})
        return {"id": f"call_sim_read_{found.group(2)[4:14]}", "type": "function",
                "function": {"name": found.group(1), "arguments": args}}

    def _called(self, call: dict[str, Any], model: str, prompt: int, cached: int) -> tuple[int, dict[str, Any]]:
        completion = len(tokens(call["function"]["arguments"]))
        n = self._record(SimRecord("turn", model, 200, prompt, cached, completion))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0}}
        return 200, {"id": f"chatcmpl-sim{n}", "object": "chat.completion", "created": int(time.time()),
                     "model": model, "system_fingerprint": FINGERPRINT,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call],
                                                          "refusal": None},
                                  "logprobs": None, "finish_reason": "tool_calls"}],
                     "usage": usage}

    def respond(self, body: Any, authorization: str = "") -> tuple[int, dict[str, Any]]:
        """Answer one Responses request: (HTTP status, JSON body: a `response` or an error), and log it."""
        if (why := sim_responses.invalid(body)) is not None:
            model = body.get("model") if isinstance(body, dict) else None
            self._record(SimRecord("invalid", str(model or ""), 400, 0, 0, 0, why[2]))
            return 400, error_body(why[0], param=why[1], code=why[2])
        model = str(body["model"])
        kind = sim_responses.call_kind(body)
        chunks = sim_responses.prompt_chunks(body)
        prompt = sum(len(c) for c in chunks)
        budget = body.get("max_output_tokens")
        budget = budget if isinstance(budget, int) and not isinstance(budget, bool) else 0
        if prompt + budget > self.window_for(model):
            self._record(SimRecord(kind, model, 400, prompt, 0, 0, "context_length_exceeded"))
            return 400, error_body(sim_responses.WINDOW_MESSAGE, param="input", code="context_length_exceeded")
        with self._lock:
            cached = billable_cached(self.cache.match_and_store((authorization, model), chunks))
        text = sim_responses.answer(kind, body)
        completion = tokens(text)
        if budget and len(completion) > budget:
            text = get_encoding(ENCODING).decode(list(completion[:budget]))
            completion = completion[:budget]
        n = self._record(SimRecord(kind, model, 200, prompt, cached, len(completion)))
        usage = sim_responses.usage(prompt, cached, len(completion))
        return 200, sim_responses.response_object(n, int(time.time()), body, text, usage)

    def messages(self, body: Any, authorization: str = "") -> tuple[int, dict[str, Any]]:
        """Answer one Messages request: (HTTP status, JSON body: a `message` or an Anthropic error), and log it.

        `authorization`: the caller's credentials (x-api-key, else Authorization), the cache scope with the model.
        """
        if (why := sim_messages_validation.invalid(body)) is not None:
            model = body.get("model") if isinstance(body, dict) else None
            self._record(SimRecord("invalid", str(model or ""), 400, 0, 0, 0, "invalid_request_error"))
            return 400, sim_messages_validation.error_body(why)
        model = str(body["model"])
        kind = sim_messages.call_kind(body)
        blocks = sim_messages_prompt.prompt_blocks(body)
        prompt = sum(len(b.chunk) for b in blocks)
        budget = int(body["max_tokens"])
        window = self.window_for(model)
        if prompt + budget > window:
            self._record(SimRecord(kind, model, 400, prompt, 0, 0, "context_length_exceeded"))
            why = (sim_messages_validation.too_long(prompt, window) if prompt > window
                   else sim_messages_validation.too_long_with_output(prompt, budget, window))
            return 400, sim_messages_validation.error_body(why)
        with self._lock:
            read, created, ttl = self.breakpoints.read_and_write((authorization, model), blocks)
        text = sim_messages.answer(kind, body)
        completion = tokens(text)
        stop = "end_turn"
        if len(completion) > budget:  # (max_tokens 0: the prompt is cached, nothing is written)
            text = get_encoding(ENCODING).decode(list(completion[:budget]))
            completion, stop = completion[:budget], "max_tokens"
        n = self._record(SimRecord(kind, model, 200, prompt, read, len(completion), cache_write=created))
        usage = sim_messages.usage(prompt, read, created, ttl, len(completion))
        return 200, sim_messages.message_object(n, model, text, usage, stop)

    def count_tokens(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Anthropic's free token count of a Messages request: {"input_tokens": N}; not logged."""
        if (why := sim_messages_validation.invalid(body, count_only=True)) is not None:
            return 400, sim_messages_validation.error_body(why)
        return 200, {"input_tokens": sim_messages_prompt.prompt_tokens(body)}

    def _record(self, rec: SimRecord) -> int:
        with self._lock:
            self.log.append(rec)
            self._seq += 1
            return self._seq

    # ---- HTTP

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            return _json(400, error_body("We could not parse the JSON body of your request. (ctxproxy simulator)"))
        status, out = self.complete(body, request.headers.get("authorization", ""))
        if status != 200 or body.get("stream") is not True:
            return _json(status, out)
        include = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage") is True
        return StreamingResponse(_sse(out, include), media_type="text/event-stream",
                                 headers={SIMULATED_HEADER: "1", "cache-control": "no-cache"})

    async def _responses(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            return _json(400, error_body("We could not parse the JSON body of your request. (ctxproxy simulator)"))
        status, out = self.respond(body, request.headers.get("authorization", ""))
        if status != 200 or body.get("stream") is not True:
            return _json(status, out)
        return StreamingResponse(_responses_sse(out), media_type="text/event-stream",
                                 headers={SIMULATED_HEADER: "1", "cache-control": "no-cache"})

    async def _messages(self, request: Request) -> Response:
        body, refused = await _anthropic_body(request)
        if refused is not None:
            return refused
        status, out = self.messages(body, _credentials(request))
        if status != 200 or body.get("stream") is not True:
            return _json(status, out)
        return StreamingResponse(_messages_sse(out), media_type="text/event-stream",
                                 headers={SIMULATED_HEADER: "1", "cache-control": "no-cache"})

    async def _count_tokens(self, request: Request) -> Response:
        body, refused = await _anthropic_body(request)
        if refused is not None:
            return refused
        return _json(*self.count_tokens(body))

    async def _models(self, request: Request) -> Response:
        names = sorted(self.windows) or []
        return _json(200, {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "ctxproxy-simulator"} for m in names]})

    async def _health(self, request: Request) -> Response:
        return _json(200, {"status": "ok", "simulated": True})


def _json(status: int, obj: Any) -> Response:
    return Response(json.dumps(obj, ensure_ascii=False).encode(), status, {SIMULATED_HEADER: "1"},
                    media_type="application/json")


def _credentials(request: Request) -> str:
    """The key of a Messages request, the cache scope with the model: the x-api-key header, else the
    Authorization header's bearer token (the anthropic SDK sends the key that way, Claude Code in x-api-key)."""
    auth = request.headers.get("authorization", "")
    return request.headers.get("x-api-key") or (auth[7:] if auth[:7].lower() == "bearer " else auth)


async def _anthropic_body(request: Request) -> tuple[Any, Response | None]:
    """The parsed body of a Messages request, or the 400 Anthropic answers (no version header, bad JSON)."""
    if not request.headers.get(sim_messages_validation.VERSION_HEADER):
        return None, _json(400, sim_messages_validation.error_body("anthropic-version: header is required"))
    raw = await request.body()
    try:
        return (json.loads(raw) if raw else None), None
    except ValueError:
        return None, _json(400, sim_messages_validation.error_body("There was an error parsing the body of your "
                                                                   "request. (ctxproxy simulator)"))


async def _sse(done: dict[str, Any], include_usage: bool):  # type: ignore[no-untyped-def]
    base = {k: done[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    text = done["choices"][0]["message"]["content"]

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"

    yield event({"role": "assistant", "content": ""})
    for piece in re.findall(r"\s*\S+|\s+$", text):
        yield event({"content": piece})
        await asyncio.sleep(0)
    yield event({}, "stop")
    if include_usage:
        yield b"data: " + json.dumps({**base, "choices": [], "usage": done["usage"]}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _responses_sse(done: dict[str, Any]) -> AsyncIterator[bytes]:
    for event in sim_responses.stream_events(done):
        yield sim_responses.sse(event)
        await asyncio.sleep(0)


async def _messages_sse(done: dict[str, Any]) -> AsyncIterator[bytes]:
    for event in sim_messages.stream_events(done):
        yield sim_messages.sse(event)
        await asyncio.sleep(0)


# --------------------------------------------------------------------------- python -m proxy.replay.simulator

def main(argv: list[str] | None = None) -> int:
    """Run the simulator on its own, e.g. as the upstream of `ctxproxy serve` (CTXPROXY_UPSTREAM=.../v1)."""
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m proxy.replay.simulator",
                                description="ctxproxy's provider SIMULATOR: OpenAI chat and Responses, Anthropic "
                                            "Messages; no model, no key.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help=f"context window (default {DEFAULT_WINDOW})")
    args = p.parse_args(argv)
    ensure_encodings()
    get_encoding(ENCODING)
    print(f"ctxproxy provider SIMULATOR (no model is called) on http://{args.host}:{args.port}/v1, "
          f"window {args.window:,} tokens", flush=True)
    uvicorn.run(Simulator(args.window), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
