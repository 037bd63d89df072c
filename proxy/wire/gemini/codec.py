"""The Gemini API codec: `contents` of `user` / `model` turns split into items, function declarations, `usageMetadata`.

The model and the method are in the URL, not the body
(`/v1beta/models/{model}:streamGenerateContent`): the registry's codec is bound
to them per request (`at`), and the upstream path is built from them. Items
(proxy/wire/turns.py): a model turn is one item carrying its `functionCall`
parts as calls; a user turn is one item, or, when it holds `functionResponse`
parts, one item per response and one per run of its other parts. The Gemini
Developer API gives its function calls no id (Gemini CLI makes one up for its
response), so a turn's responses answer its calls by name. Thought parts,
`thoughtSignature`s, `inlineData` / `fileData` and every part kind not
invented yet are never rewritten or moved; `systemInstruction`, `tools`,
`toolConfig`, `generationConfig`, `cachedContent` and every other field pass as
they came. The provider caches prefixes implicitly: there are no breakpoints.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar, Literal

import orjson

from proxy.errors import ProxyError
from proxy.wire import jsonio
from proxy.wire.codec import Body, CodecBase, Item, Role, ToolCall, ToolSpec
from proxy.wire.dialects import GOOGLE, Dialect
from proxy.wire.gemini.read_shape import GeminiReadShape, reply_parts
from proxy.wire.gemini.stream import watch
from proxy.wire.gemini.validate import parse_body
from proxy.wire.parts import first, joined, texts, with_text_at
from proxy.wire.turns import ORIGINS, Turns
from proxy.wire.usage import Usage, parse_usage

GENERATE, STREAM, COUNT = "generateContent", "streamGenerateContent", "countTokens"


def _is_response(part: Any) -> bool:
    return isinstance(part, dict) and "functionResponse" in part


def is_block(item: Any) -> bool:
    """A functionResponse part lifted out of its user turn (a turn has parts; a part has none)."""
    return isinstance(item, dict) and "parts" not in item


TURNS = Turns("parts", "model", _is_response, is_block)


def _response(item: Item) -> dict[str, Any]:
    fr = item.get("functionResponse")
    return fr if isinstance(fr, dict) else {}


def _result_text(item: Item) -> str:
    """A function response's text: its `output` (Gemini CLI's), else its `error`, else the response as JSON."""
    response = _response(item).get("response")
    if isinstance(response, dict):
        for key in ("output", "error", "content"):
            if isinstance(response.get(key), str):
                return str(response[key])
    return jsonio.dumps(response).decode() if response is not None else ""


class Gemini(CodecBase):
    api: ClassVar[str] = "gemini"
    calls_grouped: ClassVar[bool] = True
    dialect: ClassVar[Dialect] = GOOGLE
    reads_cache_at_breakpoints: ClassVar[bool] = False
    routing_fields: ClassVar[bool] = False

    def __init__(self, method: str, model: str = "") -> None:
        self.method, self.bound_model = method, model

    def at(self, params: Mapping[str, str]) -> Gemini:
        return _bound(self.method, params.get("model", ""))

    def upstream_path(self, model: str | None, stream: bool) -> str:
        method = COUNT if self.method == COUNT else STREAM if stream else GENERATE
        return f"models/{model or self.bound_model}:{method}"

    # ---- the request body
    def _request(self, body: Body) -> dict[str, Any]:
        """Where the request's fields are: the body, or countTokens' `generateContentRequest`."""
        inner = body.get("generateContentRequest")
        return inner if "contents" not in body and isinstance(inner, dict) else body

    def parse(self, raw: bytes) -> Body:
        body = parse_body(raw, counting=self.method == COUNT)
        request = self._request(body)
        request["contents"], body[ORIGINS] = TURNS.split(request["contents"])
        return body

    def items(self, body: Body) -> list[Item]:
        items: list[Item] = self._request(body)["contents"]
        return items

    def set_items(self, body: Body, items: list[Item]) -> None:
        self._request(body)["contents"] = items

    def render(self, body: Body) -> Body:
        out = {k: v for k, v in body.items() if k != ORIGINS}
        request = self._request(out)
        if request is not out:
            request = out["generateContentRequest"] = dict(request)
        request["contents"] = TURNS.join(request["contents"], body.get(ORIGINS) or {})
        return out

    def model(self, body: Body) -> str | None:
        return self.bound_model or None

    def is_stream(self, body: Body) -> bool:
        return self.method == STREAM

    def tools(self, body: Body) -> list[Any] | None:
        tools = self._request(body).get("tools")
        return tools if isinstance(tools, list) else None

    def set_tools(self, body: Body, tools: list[Any]) -> None:
        """The tools, a function the proxy adds declared beside the client's (one `functionDeclarations` tool:
        the API takes function declarations in one tool)."""
        out: list[Any] = []
        decls: int | None = None
        for t in tools:
            fns = t.get("functionDeclarations") if isinstance(t, dict) else None
            if isinstance(fns, list) and decls is not None and set(t) == {"functionDeclarations"}:
                out[decls] = {**out[decls], "functionDeclarations": [*out[decls]["functionDeclarations"], *fns]}
                continue
            if isinstance(fns, list) and decls is None:
                decls = len(out)
            out.append(t)
        if self.method == COUNT and "contents" in body:
            return  # a count of bare contents: the API takes no tools beside them, so the proxy's go uncounted
        self._request(body)["tools"] = out

    def tool_names(self, tools: list[Any]) -> list[str]:
        """Each declared function's name, and each other tool's kind (googleSearch, codeExecution, ...)."""
        names: list[str] = []
        for t in tools:
            if not isinstance(t, dict):
                continue
            fns = t.get("functionDeclarations")
            if isinstance(fns, list):
                names += [str(f.get("name")) for f in fns if isinstance(f, dict)]
            names += [k for k in t if k != "functionDeclarations"]
        return names

    def tool_definition(self, spec: ToolSpec) -> Any:
        return {"functionDeclarations": [{"name": spec.name, "description": spec.description,
                                          "parametersJsonSchema": spec.parameters}]}

    def session_hint(self, body: Body) -> str | None:
        return None

    def output_reserve(self, body: Body) -> int:
        config = self._request(body).get("generationConfig")
        v = config.get("maxOutputTokens") if isinstance(config, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

    # ---- one item
    def label(self, item: Item) -> str:
        if is_block(item):
            return "functionResponse"
        role = item.get("role", "user")
        return role if isinstance(role, str) else "?"

    def role(self, item: Item) -> Role:
        if is_block(item):
            return "tool"
        return "assistant" if item.get("role") == "model" else "user"

    def text(self, item: Item) -> str | None:
        return _result_text(item) if is_block(item) else joined(item.get("parts"), None)

    def first_text(self, item: Item) -> str:
        return _result_text(item) if is_block(item) else first(item.get("parts"), None)

    def with_text(self, item: Item, text: str) -> Item:
        return self.replaced(item, text) if is_block(item) else with_text_at(item, "parts", text, None)

    def replaced(self, item: Item, text: str) -> Item:
        if is_block(item):
            return {**item, "functionResponse": {**_response(item), "response": {"output": text}}}
        return {**item, "parts": [{"text": text}]}

    def calls(self, item: Item) -> list[ToolCall]:
        if is_block(item) or item.get("role") != "model" or not isinstance(item.get("parts"), list):
            return []
        out = []
        for p in item["parts"]:
            fc = p.get("functionCall") if isinstance(p, dict) else None
            if isinstance(fc, dict):
                name = str(fc.get("name") or "?")
                out.append(ToolCall(name, name, jsonio.dumps(fc.get("args") or {}).decode()))
        return out

    def answers(self, item: Item) -> str | None:
        name = _response(item).get("name") if is_block(item) else None
        return name if isinstance(name, str) else None

    def result_name(self, item: Item) -> str | None:
        return self.answers(item)

    def is_error(self, item: Item) -> bool:
        response = _response(item).get("response") if is_block(item) else None
        return isinstance(response, dict) and "error" in response

    def message(self, role: Literal["system", "developer", "user"], text: str) -> Item:
        """A user turn's text; a system one joins the user turn it sits in (a request's leading ones are its
        `systemInstruction`)."""
        return {"role": "user" if role == "user" else "system", "parts": [{"text": text}]}

    def result(self, call_id: str | None, text: str, name: str | None = None) -> Item:
        response: dict[str, Any] = {"name": name or call_id or "tool"}
        if call_id and call_id != response["name"]:
            response["id"] = call_id
        response["response"] = {"output": text}
        return {"functionResponse": response}

    # ---- the proxy's own calls
    def request(self, model: str, items: list[Item], *, tools: list[Any] | None, extra: dict[str, Any],
                max_output: int) -> Body:
        """Leading system items become the `systemInstruction` (a summarizer's prompt), as the API wants it."""
        lead = TURNS.leading_system(items)
        body: Body = {}
        if lead:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(self.text(i) or "" for i in items[:lead])}]}
        body.update({k: v for k, v in extra.items() if k != "systemInstruction" or not lead})
        body["contents"] = TURNS.join(items[lead:], {})
        if tools:
            body["tools"] = tools
        config = body.get("generationConfig")
        body["generationConfig"] = {**(config if isinstance(config, dict) else {}), "temperature": 0,
                                    "maxOutputTokens": max_output}
        return body

    def prefix_fields(self, body: Body) -> dict[str, Any]:
        si = self._request(body).get("systemInstruction")
        return {"systemInstruction": si} if si is not None else {}

    def reply_text(self, data: Any) -> str | None:
        parts = reply_parts(data)
        return None if parts is None else "\n".join(texts(parts, None))

    def raw_usage(self, data: Any) -> dict[str, Any]:
        usage = data.get("usageMetadata") if isinstance(data, dict) else None
        return usage if isinstance(usage, dict) else {}

    # ---- the provider's answer
    def read_shape(self, body: Body, tool: str) -> GeminiReadShape:
        return GeminiReadShape(self, tool)

    def watch_stream(self, chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                     hide_usage: bool) -> AsyncIterator[bytes]:
        return watch(chunks, on_usage)

    def usage_of_reply(self, content: bytes) -> Usage | None:
        try:
            return parse_usage(self.raw_usage(orjson.loads(content)) or None)
        except orjson.JSONDecodeError:
            return None

    def error_body(self, err: ProxyError) -> bytes:
        return err.google_body()


@functools.lru_cache(maxsize=256)  # a handful of models per deployment: one codec each, as the other APIs have
def _bound(method: str, model: str) -> Gemini:
    return Gemini(method, model)


GEMINI, GEMINI_STREAM, GEMINI_COUNT = Gemini(GENERATE), Gemini(STREAM), Gemini(COUNT)
