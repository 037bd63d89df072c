"""Only the provider's own wording teaches a window: echoed text is never believed, in any wording or API (issue 23).

A 400 whose message merely contains "prompt is too long: 900000 tokens > 1000
maximum" (a client's field quoted back in "Invalid value for ...") must not
teach its tenant a window of 1 for a day. Each wording the proxy reads
(OpenAI's and vLLM's, Anthropic's two) is believed only where the message
begins with it, whatever the error's code and whichever API the client speaks.
"""

from __future__ import annotations

import json

import orjson
import pytest
from asgi_proxy import asgi_proxy

from proxy.upstream.windows import overflow_limit

OPENAI = "This model's maximum context length is 4000 tokens. However, your messages resulted in 6000 tokens."
VLLM = "maximum context length is 4000 tokens. However, you requested 6000 tokens."
ANTHROPIC = "prompt is too long: 6000 tokens > 4000 maximum"
ANTHROPIC_BUDGET = ("input length and `max_tokens` exceed context limit: 5000 + 1000 > 5500, decrease input length "
                    "or `max_tokens` and try again")
ECHO = "Invalid value for 'metadata': '{}' is not an object"


def error(message: str, code: str | None = None, kind: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def anthropic_error(message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}})


@pytest.mark.parametrize("wording,body,expected", [
    ("openai", error(OPENAI, "context_length_exceeded"), 4000),
    ("openai without its code", error(OPENAI), 4000),
    ("vllm", error(VLLM), 4000),
    ("anthropic", anthropic_error(ANTHROPIC), 4000 * 5000 // 6000),
    ("anthropic budget", anthropic_error(ANTHROPIC_BUDGET), (5500 - 1000) * 4000 // 5000 + 1000),
    ("anthropic, in an OpenAI-shaped error", error(ANTHROPIC), 4000 * 5000 // 6000),
    ("leading whitespace", error("  \n" + OPENAI), 4000),
])
def test_the_providers_own_wording_is_believed(wording, body, expected):
    sent, reserve = (5000, 0) if "budget" not in wording else (5000, 1000)
    assert overflow_limit(body, sent, reserve) == expected


@pytest.mark.parametrize("wording", [OPENAI, VLLM, ANTHROPIC, ANTHROPIC_BUDGET,
                                     "prompt is too long: 900000 tokens > 1000 maximum"])
@pytest.mark.parametrize("shape", ["openai", "openai with the overflow code", "anthropic"])
def test_the_same_wording_echoed_inside_another_message_is_not(wording, shape):
    message = ECHO.format(wording)
    body = {"openai": error(message), "openai with the overflow code": error(message, "context_length_exceeded"),
            "anthropic": anthropic_error(message)}[shape]
    assert overflow_limit(body, 5000, 0) is None
    assert overflow_limit(body, 5000, 1000) is None


def test_llama_cpps_numbers_are_believed_whatever_its_message_says():
    body = orjson.dumps({"error": {"code": 400, "message": "the request exceeds the available context size",
                                   "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}})
    assert overflow_limit(body, 5000) == 4096


@pytest.mark.parametrize("code", [["context_length_exceeded"], {"a": 1}])
def test_an_odd_code_or_type_is_no_error(code):
    assert overflow_limit(orjson.dumps({"error": {"message": OPENAI, "code": code, "type": code}}), 5000) == 4000
    assert overflow_limit(orjson.dumps({"error": {"message": "x", "code": code, "type": code}}), 5000) is None


AUTH = {"authorization": "Bearer sk-overflow-wording", "content-type": "application/json"}
TURNS = [{"role": "user", "content": "hello " * 50}]
REQUESTS = {
    "chat": ("/v1/chat/completions", {"model": "gpt-4o", "messages": TURNS}, error),
    "responses": ("/v1/responses", {"model": "gpt-4o", "input": TURNS}, error),
    "messages": ("/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": TURNS},
                 anthropic_error),
}


@pytest.mark.parametrize("api", list(REQUESTS))
async def test_an_echoed_overflow_through_the_proxy_teaches_no_window(api, upstream, tmp_path):
    path, body, shaped = REQUESTS[api]
    echoed = json.loads(shaped(ECHO.format("prompt is too long: 900000 tokens > 1000 maximum")))
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/w.db") as client:
        upstream.fail_next(400, echoed)
        r = await client.post(path, content=json.dumps(body).encode(), headers=AUTH)
        assert r.status_code == 400 and "x-ctxproxy-window-learned" not in r.headers
        assert r.json() == echoed  # the provider's answer, as it was
        r = await client.post(path, content=json.dumps(body).encode(), headers=AUTH)
        assert r.status_code == 200
        assert upstream.requests[-1].body == json.dumps(body).encode()  # not compacted for a window of 1
