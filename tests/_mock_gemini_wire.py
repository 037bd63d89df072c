"""Google's Gemini API (v1beta) for the mock upstream (tests/mock_upstream.py): its endpoints and wire shapes.

``serve`` answers every ``/v1beta/...`` request the mock receives, and the
model methods under ``/v1/`` (``POST /v1/models/{model}:generateContent`` etc.:
google-genai 3.x, the official Python SDK, calls v1 by default; the Gemini CLI
calls v1beta; ``/v1/models`` itself stays the mock's OpenAI listing). The mock's
``_route`` sends them here (``handles``); nothing else of the mock changes.
Models: any ``gemini-*`` or ``gemma-*`` name; another is Google's 404
``NOT_FOUND`` (``models/x is not found for API version v1beta, or is not
supported for generateContent. ...``).

* ``POST /v1beta/models/{model}:generateContent``: a GenerateContentResponse,
  pretty-printed (2-space indent) as Google's servers send JSON:
  ``{"candidates": [{"content": {"parts": [...], "role": "model"},
  "finishReason": "STOP", "index": 0}], "usageMetadata": {...},
  "modelVersion": model, "responseId": ...}``;
* ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``:
  ``text/event-stream``, one event per chunk, framed exactly as Google frames
  them: ``data: {json}\\r\\n\\r\\n``, the JSON on one line in Google's style
  (``": "`` after a key, ``","`` between members), no event names, no
  terminator (a captured trace, byte-counted: its events end in CRLF CRLF; the
  SDKs' parsers, the CLI's ``/^\\s*data: (.*)(?:\\n\\n|\\r\\r|\\r\\n\\r\\n)/``,
  accept it). Chunks: thought summaries (when the request sets
  ``thinkingConfig.includeThoughts`` and the script gives thinking), the text
  in pieces of a few words, then all function calls in one chunk (each
  ``{"functionCall": {"name", "args"}}``, the first with a ``thoughtSignature``:
  an opaque base64 string, as Gemini 2.5 and later send it). The last chunk
  has ``finishReason: "STOP"``. **Every** chunk carries ``usageMetadata``, as
  the real API does: the ones before the last only the prompt's figures
  (``promptTokenCount``, ``cachedContentTokenCount``, ``totalTokenCount``
  equal to the prompt), the last the full figures; a client adding them up
  counts the prompt once per chunk. Without ``alt=sse`` the stream is a JSON
  array of the same chunks. A Gemini 3 model's text-only answer is signed too:
  streamed, its last chunk is an empty text part carrying the
  ``thoughtSignature`` (as a captured Gemini 3 stream ends); unstreamed, the
  text part carries it;
* ``POST /v1beta/models/{model}:countTokens``: ``{"totalTokens": N,
  "promptTokensDetails": [...]}`` for ``{contents}`` or
  ``{generateContentRequest: {...}}``; nothing cached, no script entry taken;
* ``GET /v1beta/models`` and ``GET /v1beta/models/{model}``: a minimal listing,
  ``inputTokenLimit`` the mock's window for the model.

The API key is the ``x-goog-api-key`` header or the ``key`` query parameter
(a Bearer token also identifies the caller); without one every endpoint is the
403 Google answers a caller without a key. Errors are Google's envelope,
``{"error": {"code", "message", "status"}}``. A prompt over the model's window
(the mock's ``window_for``: a ``gemini-*`` name gets the default window unless
a test sets one) is a 400 ``INVALID_ARGUMENT``: ``The input token count (N)
exceeds the maximum number of tokens allowed (M).`` Validation, rendering and
caching rules: tests/_mock_gemini_prompt.py.

Usage figures: ``promptTokenCount`` the prompt as rendered (cached tokens
included), ``candidatesTokenCount`` the reply's text and calls (a call: its
name and JSON args), ``thoughtsTokenCount`` the thinking the script gave (only
then), ``totalTokenCount`` their sum; ``rec.usage`` holds the last chunk's
figures, ``cachedContentTokenCount`` included even when it is 0 (or when the
mock's ``report_cached`` is off, which leaves it out of the answer).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

try:  # imported as tests._mock_gemini_wire (benchmarks) or from the pytest rootdir
    from . import _mock_gemini_prompt as gp
    from . import _mock_prompt as mp
    from . import _mock_stream as ms
except ImportError:
    import _mock_gemini_prompt as gp  # type: ignore[no-redef]
    import _mock_prompt as mp  # type: ignore[no-redef]
    import _mock_stream as ms  # type: ignore[no-redef]

if TYPE_CHECKING:
    from mock_upstream import MockUpstream, RecordedRequest

MODELS = ("gemini-2.5-flash", "gemini-2.5-pro", "gemini-3-flash-preview", "gemini-3-pro-preview")
OUTPUT_TOKEN_LIMIT = 65_536
WORDS_PER_CHUNK = 4
NO_KEY = ("Method doesn't allow unregistered callers (callers without established identity). Please use API Key or "
          "other form of API consumer identity to call this API.")
_PATH = re.compile(r"^/(v1beta|v1)/models/([^/:]+)(?::([A-Za-z]+))?$")
_V1_METHOD = re.compile(r"^/v1/models/[^/:]+:[A-Za-z]+$")
JSON_TYPE = "application/json; charset=UTF-8"
HEADERS = {"vary": "Origin, X-Origin, Referer"}


# --------------------------------------------------------------------------- JSON as Google writes it

def dumps_line(obj: Any) -> bytes:
    """One-line JSON in Google's stream style: `{"a": 1,"b": [{"c": "d"}]}`."""
    return json.dumps(obj, separators=(",", ": "), ensure_ascii=False).encode()


def dumps_pretty(obj: Any) -> bytes:
    """Google's JSON body: 2-space indentation."""
    return json.dumps(obj, indent=2, ensure_ascii=False).encode()


def error_body(code: int, message: str, status: str) -> dict[str, Any]:
    """Google's error envelope."""
    return {"error": {"code": code, "message": message, "status": status}}


def error(code: int, message: str, status: str) -> Response:
    return Response(dumps_pretty(error_body(code, message, status)), code, HEADERS, media_type=JSON_TYPE)


def fake_signature(label: str) -> str:
    """A deterministic opaque thought signature (base64, shaped like the API's)."""
    digest = b"".join(hashlib.sha256(f"{label}:{i}".encode()).digest() for i in range(4))
    return base64.b64encode(b"\x0a\x80\x01" + digest).decode()


def response_id(n: int) -> str:
    """A responseId shaped like Google's (22 URL-safe base64 characters)."""
    return base64.urlsafe_b64encode(hashlib.sha256(f"gemini-mock-{n}".encode()).digest()[:16]).decode()[:22]


# --------------------------------------------------------------------------- the answer

def reply_parts(tag: str, reply: ms.Reply, body: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """The candidate's parts for `reply`: [thought], text (unless only calls), one functionCall per call."""
    out: list[dict[str, Any]] = []
    if reply.thinking and gp.include_thoughts(body):
        out.append({"text": reply.thinking, "thought": True})
    if reply.text or not reply.tool_calls:
        out.append({"text": reply.text or ""})
    for k, call in enumerate(reply.tool_calls):
        args = json.loads(call.arguments) if call.arguments.strip() else {}
        if not isinstance(args, dict):
            raise ValueError(f"functionCall args must be a JSON object, the script gave {call.arguments!r}")
        part: dict[str, Any] = {"functionCall": {"name": call.name, "args": args}}
        if k == 0 and gp.signs_calls(model):
            part["thoughtSignature"] = fake_signature(f"{tag}:{call.name}")
        out.append(part)
    if not reply.tool_calls and gp.signatures_required(model):
        out[-1]["thoughtSignature"] = fake_signature(f"{tag}:text")
    return out


def output_tokens(parts: list[dict[str, Any]]) -> tuple[int, int]:
    """(candidatesTokenCount, thoughtsTokenCount) of the parts."""
    candidates = thoughts = 0
    for p in parts:
        if "functionCall" in p:
            candidates += len(mp.tokens(p["functionCall"]["name"] + json.dumps(p["functionCall"]["args"])))
        elif p.get("thought"):
            thoughts += len(mp.tokens(p["text"]))
        else:
            candidates += len(mp.tokens(p["text"]))
    return candidates, thoughts


def usage_metadata(prompt: int, cached: int, candidates: int | None = None, thoughts: int = 0) -> dict[str, Any]:
    """usageMetadata; `candidates` None: a stream's chunk before the last (the prompt's figures only)."""
    u: dict[str, Any] = {"promptTokenCount": prompt}
    if candidates is not None:
        u["candidatesTokenCount"] = candidates
    u["totalTokenCount"] = prompt + (candidates or 0) + thoughts
    if cached:
        u["cachedContentTokenCount"] = cached
    u["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if cached:
        u["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    if thoughts:
        u["thoughtsTokenCount"] = thoughts
    return u


def response_object(parts: list[dict[str, Any]], usage: dict[str, Any], model: str, rid: str) -> dict[str, Any]:
    """A complete GenerateContentResponse, keys in the order the API sends them."""
    return {"candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage, "modelVersion": model, "responseId": rid}


def _pieces(parts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The parts as the stream delivers them: text in pieces of a few words, the calls together in one chunk."""
    chunks: list[list[dict[str, Any]]] = []
    for p in parts:
        if "functionCall" in p:
            if chunks and all("functionCall" in q for q in chunks[-1]):
                chunks[-1].append(p)
            else:
                chunks.append([p])
            continue
        words = ms.split_words(p["text"]) or [""]
        for i in range(0, len(words), WORDS_PER_CHUNK):
            chunks.append([{**{k: v for k, v in p.items() if k != "thoughtSignature"},
                            "text": "".join(words[i:i + WORDS_PER_CHUNK])}])
        if "thoughtSignature" in p:  # Gemini 3's signature on a text answer: an empty part of its own, last
            chunks.append([{"text": "", "thoughtSignature": p["thoughtSignature"]}])
    return chunks


def stream_chunks(parts: list[dict[str, Any]], prompt: int, cached: int, usage: dict[str, Any], model: str,
                  rid: str) -> list[dict[str, Any]]:
    """The GenerateContentResponse chunks a stream sends for `parts` (see the module docstring)."""
    pieces = _pieces(parts)
    out = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        candidate: dict[str, Any] = {"content": {"parts": piece, "role": "model"}}
        if last:
            candidate["finishReason"] = "STOP"
        out.append({"candidates": [candidate], "usageMetadata": usage if last else usage_metadata(prompt, cached),
                    "modelVersion": model, "responseId": rid})
    return out


def sse_events(chunks: list[dict[str, Any]]) -> list[bytes]:
    """Google's SSE framing: `data: <one-line JSON>\\r\\n\\r\\n` per chunk, nothing else."""
    return [b"data: " + dumps_line(c) + b"\r\n\r\n" for c in chunks]


def json_array_events(chunks: list[dict[str, Any]]) -> list[bytes]:
    """streamGenerateContent without alt=sse: one JSON array, its elements written as they come."""
    if not chunks:
        return [b"[]"]
    return [(b"[" if i == 0 else b",\r\n") + dumps_pretty(c) for i, c in enumerate(chunks)] + [b"]"]


def model_object(model: str, window: int) -> dict[str, Any]:
    return {"name": f"models/{model}", "version": "001", "displayName": model, "description": f"Mock {model}",
            "inputTokenLimit": window, "outputTokenLimit": OUTPUT_TOKEN_LIMIT,
            "supportedGenerationMethods": ["generateContent", "countTokens", "createCachedContent",
                                           "batchGenerateContent"],
            "temperature": 1, "topP": 0.95, "topK": 64, "maxTemperature": 2, "thinking": True}


# --------------------------------------------------------------------------- the endpoints

def api_key(rec: RecordedRequest) -> str:
    """The caller: `x-goog-api-key`, else `?key=`, else a Bearer token."""
    query = urllib.parse.parse_qs(rec.query)
    auth = rec.headers.get("authorization") or ""
    return rec.headers.get("x-goog-api-key") or (query.get("key") or [""])[0] or auth.removeprefix("Bearer ")


def _known(model: str) -> bool:
    """Any `gemini-*` or `gemma-*` name is served (a test's own `gemini-x-32k` too); others are not Google's."""
    return model.startswith(("gemini-", "gemma-"))


def _not_found(version: str, model: str, method: str) -> Response:
    return error(404, f"models/{model} is not found for API version {version}, or is not supported for {method}. "
                      "Call ListModels to see the list of available models and their supported methods.", "NOT_FOUND")


def _body(rec: RecordedRequest) -> Any:
    """The JSON body, {} when empty; raises the API's 400 for one that does not parse."""
    if not rec.body.strip():
        return {}
    if rec.json is None:
        text = rec.body[:60].decode("utf-8", "replace")
        raise gp.RequestError(f"Invalid JSON payload received. Unexpected token.\n{text}\n^")
    return rec.json


def handles(path: str) -> bool:
    """Whether a path is the Gemini API's: anything under /v1beta/, and a model method under /v1/ (the Python
    SDK's default version; /v1/models itself stays the OpenAI listing)."""
    return path.startswith("/v1beta/") or _V1_METHOD.match(path) is not None


def serve(mock: MockUpstream, rec: RecordedRequest, first_delay: float, chunk_delay: float) -> Response:
    """Answer one Gemini API request (see the module docstring)."""
    key = api_key(rec)
    if not key:
        return error(403, NO_KEY, "PERMISSION_DENIED")
    if (rec.method, rec.path) == ("GET", "/v1beta/models"):
        names = sorted({m for m in mock.windows if m.startswith("gemini")} | set(MODELS))
        return Response(dumps_pretty({"models": [model_object(m, mock.window_for(m)) for m in names]}), 200,
                        HEADERS, media_type=JSON_TYPE)
    m = _PATH.match(rec.path)
    if m is None:
        return error(404, f"Method not found: {rec.method} {rec.path}", "NOT_FOUND")
    version, model, method = m.groups()
    if method is None and rec.method == "GET":
        if not _known(model):
            return error(404, f"models/{model} is not found for API version {version}.", "NOT_FOUND")
        return Response(dumps_pretty(model_object(model, mock.window_for(model))), 200, HEADERS,
                        media_type=JSON_TYPE)
    if rec.method != "POST" or method not in ("generateContent", "streamGenerateContent", "countTokens"):
        return error(404, f"Method not found: {rec.method} {rec.path}", "NOT_FOUND")
    if not _known(model):
        return _not_found(version, model, method)
    try:
        if method == "countTokens":
            total = gp.prompt_tokens(gp.count_request(_body(rec)))
            return Response(dumps_pretty({"totalTokens": total,
                                          "promptTokensDetails": [{"modality": "TEXT", "tokenCount": total}]}),
                            200, HEADERS, media_type=JSON_TYPE)
        body = _body(rec)
        gp.validate(body, model)
    except gp.RequestError as e:
        return error(e.code, e.message, e.status)
    return _generate(mock, rec, key, model, body, method == "streamGenerateContent", first_delay, chunk_delay)


def _generate(mock: MockUpstream, rec: RecordedRequest, key: str, model: str, body: dict[str, Any], stream: bool,
              first_delay: float, chunk_delay: float) -> Response:
    prompt = gp.render(body)
    window = mock.window_for(model)
    if prompt.tokens > window:
        return error(400, f"The input token count ({prompt.tokens}) exceeds the maximum number of tokens allowed "
                          f"({window}).", "INVALID_ARGUMENT")
    with mock._lock:
        common = mock.cache.match_and_store((f"gemini:{key}", model), prompt.chunks, mock.clock(), mock.cache_ttl)
    cached = gp.cached_tokens(common, model)
    reply = mock._next_reply(body)
    n = mock._next_id()
    parts = reply_parts(f"mock{n}", reply, body, model)
    candidates, thoughts = output_tokens(parts)
    rec.usage = dict(usage_metadata(prompt.tokens, cached, candidates, thoughts), cachedContentTokenCount=cached)
    reported = cached if mock.report_cached else 0
    usage = usage_metadata(prompt.tokens, reported, candidates, thoughts)
    rid = response_id(n)
    if not stream:
        return Response(dumps_pretty(response_object(parts, usage, model, rid)), 200, HEADERS, media_type=JSON_TYPE)
    chunks = stream_chunks(parts, prompt.tokens, reported, usage, model, rid)
    sse = "sse" in urllib.parse.parse_qs(rec.query).get("alt", [])
    events = sse_events(chunks) if sse else json_array_events(chunks)
    return StreamingResponse(ms.sse_stream(events, first_delay=first_delay, chunk_delay=chunk_delay),
                             headers={**HEADERS, "content-type": "text/event-stream" if sse else JSON_TYPE,
                                      "content-disposition": "attachment"})
