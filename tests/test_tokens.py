"""proxy.tokens.counter: counting rules, message digests, per-message cache."""

from __future__ import annotations

import copy
import hashlib

import orjson
import pytest
import tiktoken

from proxy.tokens import counter as tokens
from proxy.tokens.counter import (
    IMAGE_TOKENS_DEFAULT,
    IMAGE_TOKENS_LOW_DETAIL,
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_NAME,
    TOKENS_PER_TOOL_CALL,
    TOKENS_PER_TOOL_DEFINITION,
    TokenCounter,
    message_digest,
)
from proxy.tokens.encodings import get_encoding


@pytest.fixture(autouse=True, scope="module")
def _private_tiktoken_cache(tmp_path_factory):
    """Keep this module from writing into the real home cache or leaking TIKTOKEN_CACHE_DIR."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield


def n(enc: tiktoken.Encoding, text: str) -> int:
    """Independent count: tiktoken's encode with special tokens treated as text."""
    return len(enc.encode(text, disallowed_special=()))


# --------------------------------------------------------------------------- counting rules


@pytest.fixture
def o200k():
    return get_encoding("o200k_base")


@pytest.fixture
def cl100k():
    return get_encoding("cl100k_base")


def test_text_message_costs_overhead_role_and_content(o200k):
    msg = {"role": "user", "content": "How many tokens is this sentence, exactly?"}
    expected = TOKENS_PER_MESSAGE + n(o200k, "user") + n(o200k, msg["content"])
    assert TokenCounter().count_message(msg) == expected


def test_openai_cookbook_example_counts_as_published():
    # The "hello world" case: 3 (message) + 1 ("user") + 2 + 3 (priming) = 9 on both encodings.
    msgs = [{"role": "user", "content": "hello world"}]
    assert TokenCounter().count_messages(msgs, "gpt-4o") == 9
    assert TokenCounter().count_messages(msgs, "gpt-4") == 9


def test_name_adds_one_token_plus_its_text(cl100k):
    msg = {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."}
    expected = TOKENS_PER_MESSAGE + n(cl100k, "system") + TOKENS_PER_NAME + n(cl100k, "example_user") \
        + n(cl100k, msg["content"])
    assert TokenCounter().count_message(msg, "gpt-4-0613") == expected


def test_messages_sum_plus_reply_priming(o200k):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    counter = TokenCounter()
    per = counter.message_counts(msgs, "gpt-4o")
    assert per == [TOKENS_PER_MESSAGE + n(o200k, "system") + n(o200k, "You are terse."),
                   TOKENS_PER_MESSAGE + n(o200k, "user") + n(o200k, "Hi")]
    assert counter.count_messages(msgs, "gpt-4o") == sum(per) + REPLY_PRIMING_TOKENS


def test_encoding_follows_the_model(o200k, cl100k):
    text = "naïve café — 日本語のテキスト and some code: for i in range(10): print(i)"
    assert n(o200k, text) != n(cl100k, text)  # guard: the example does tell them apart
    msg = {"role": "user", "content": text}
    counter = TokenCounter()
    assert counter.count_message(msg, "gpt-4o") == TOKENS_PER_MESSAGE + 1 + n(o200k, text)
    assert counter.count_message(msg, "gpt-3.5-turbo") == TOKENS_PER_MESSAGE + 1 + n(cl100k, text)


def test_assistant_tool_calls_count_name_arguments_and_overhead(o200k):
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'}},
        ],
    }
    expected = TOKENS_PER_MESSAGE + n(o200k, "assistant") \
        + TOKENS_PER_TOOL_CALL + n(o200k, "get_weather") + n(o200k, '{"city": "Paris"}') \
        + TOKENS_PER_TOOL_CALL + n(o200k, "get_time") + n(o200k, '{"tz": "Europe/Paris"}')
    assert TokenCounter().count_message(msg) == expected


def test_tool_result_counts_its_tool_call_id(o200k):
    msg = {"role": "tool", "tool_call_id": "call_7MqMjJMaXLRTpdPdzCjzjfpE", "content": '{"ok": true}'}
    expected = TOKENS_PER_MESSAGE + n(o200k, "tool") + n(o200k, msg["tool_call_id"]) + n(o200k, '{"ok": true}')
    assert TokenCounter().count_message(msg) == expected


def test_reasoning_content_and_refusal_count_as_text(o200k):
    msg = {"role": "assistant", "content": "No.", "reasoning_content": "The user asks for X; policy says no.",
           "refusal": "I can't help with that."}
    expected = TOKENS_PER_MESSAGE + n(o200k, "assistant") + n(o200k, "No.") \
        + n(o200k, msg["reasoning_content"]) + n(o200k, msg["refusal"])
    assert TokenCounter().count_message(msg) == expected


def test_none_and_empty_content_cost_only_overhead(o200k):
    counter = TokenCounter()
    base = TOKENS_PER_MESSAGE + n(o200k, "assistant")
    assert counter.count_message({"role": "assistant", "content": None}) == base
    assert counter.count_message({"role": "assistant", "content": ""}) == base
    assert counter.count_message({"role": "assistant", "content": []}) == base
    assert counter.count_message({"role": "assistant"}) == base


def test_unicode_content_counts_like_the_encoder(o200k):
    text = "Grüße aus Köln 🚀🚀 — 你好，世界 — مرحبا بالعالم — \u0301\u200d"
    msg = {"role": "user", "content": text}
    assert TokenCounter().count_message(msg) == TOKENS_PER_MESSAGE + n(o200k, "user") + n(o200k, text)


def test_special_token_text_is_counted_not_rejected(o200k):
    text = "the file ends with <|endoftext|> and <|endofprompt|>"
    msg = {"role": "user", "content": text}
    count = TokenCounter().count_message(msg)
    assert count == TOKENS_PER_MESSAGE + n(o200k, "user") + n(o200k, text)
    assert count > TOKENS_PER_MESSAGE + 1 + 6  # spelled out as text, not single special tokens
    assert TokenCounter().count_text(text) == n(o200k, text)


def test_list_content_counts_text_parts_and_estimates_images(o200k):
    other = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these images?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_image", "image_url": "https://example.com/b.png", "detail": "low"},
            {"type": "input_text", "text": "Compare them."},
            other,
        ],
    }
    other_json = orjson.dumps(other, option=orjson.OPT_SORT_KEYS).decode()
    expected = TOKENS_PER_MESSAGE + n(o200k, "user") \
        + n(o200k, "What is in these images?") + IMAGE_TOKENS_LOW_DETAIL + IMAGE_TOKENS_DEFAULT \
        + IMAGE_TOKENS_LOW_DETAIL + n(o200k, "Compare them.") + n(o200k, other_json)
    assert TokenCounter().count_message(msg) == expected


def test_tools_count_function_json_plus_overhead_and_request_adds_everything(o200k):
    fn = {"name": "bash", "description": "Run one shell command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
    tools = [{"type": "function", "function": fn}]
    fn_json = orjson.dumps(fn, option=orjson.OPT_SORT_KEYS).decode()
    counter = TokenCounter()
    assert counter.count_tools(tools) == TOKENS_PER_TOOL_DEFINITION + n(o200k, fn_json)
    assert counter.count_tools(None) == 0 and counter.count_tools([]) == 0

    msgs = [{"role": "user", "content": "list files"}]
    body = {"model": "openai/gpt-4o", "messages": msgs, "tools": tools}
    assert counter.count_request(body) == counter.count_messages(msgs, "gpt-4o") + counter.count_tools(tools)


def test_count_request_uses_the_body_model(o200k, cl100k):
    text = "Ünïcödé text that tokenizes differently: 日本語"
    body = {"messages": [{"role": "user", "content": text}]}
    counter = TokenCounter()
    assert counter.count_request({**body, "model": "gpt-4"}) == 3 + 1 + n(cl100k, text) + 3
    assert counter.count_request({**body, "model": "gpt-4o"}) == 3 + 1 + n(o200k, text) + 3


# --------------------------------------------------------------------------- digests and the cache


def test_message_digest_ignores_key_order_and_object_identity():
    a = {"role": "user", "content": "hi", "name": "bob"}
    b = {"name": "bob", "content": "hi", "role": "user"}
    assert message_digest(a) == message_digest(b) == message_digest(orjson.loads(orjson.dumps(a)))
    assert len(message_digest(a)) == 16
    assert message_digest(a) != message_digest({**a, "content": "hi!"})
    expected = hashlib.blake2b(orjson.dumps(a, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
    assert message_digest(a) == expected


def test_message_digest_accepts_what_orjson_cannot_serialize():
    lone_surrogate = {"role": "user", "content": "bad \ud800 text"}  # json.loads can produce this
    big = {"role": "user", "content": "x", "n": 2**70}
    assert message_digest(lone_surrogate) == message_digest(dict(lone_surrogate))
    assert message_digest(big) != message_digest({**big, "n": 2**70 + 1})
    assert TokenCounter().count_message(lone_surrogate) > TOKENS_PER_MESSAGE


def _conversation(k: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(1, k):
        if i % 2:
            msgs.append({"role": "assistant", "content": f"step {i}: looking at file_{i}.py",
                         "tool_calls": [{"id": f"call_{i}", "type": "function",
                                         "function": {"name": "bash",
                                                      "arguments": f'{{"command": "cat file_{i}.py"}}'}}]})
        else:
            msgs.append({"role": "tool", "tool_call_id": f"call_{i - 1}",
                         "content": f"def function_{i}():\n    return {i} * 2  # output number {i}\n"})
    return msgs


@pytest.fixture
def encoder_spy(monkeypatch, o200k):
    """Records every text the o200k encoder is asked to tokenize."""
    seen: list[str] = []
    real = o200k.encode_ordinary

    def spy(text: str) -> list[int]:
        seen.append(text)
        return real(text)

    monkeypatch.setattr(o200k, "encode_ordinary", spy)
    return seen


def test_request_with_one_new_message_tokenizes_only_that_message(encoder_spy):
    counter = TokenCounter()
    first = _conversation(200)
    first_total = counter.count_messages(first, "gpt-4o")
    assert len(encoder_spy) > 200  # the cold count really did tokenize everything

    new_last = {"role": "user", "content": "Now run the tests, please."}
    alone = TokenCounter()
    encoder_spy.clear()
    new_last_count = alone.count_message(new_last, "gpt-4o")
    calls_for_one_message = list(encoder_spy)

    # Next turn: same 199 messages, re-parsed (fresh dicts), last one replaced.
    second = orjson.loads(orjson.dumps(first[:199])) + [copy.deepcopy(new_last)]
    encoder_spy.clear()
    second_total = counter.count_messages(second, "gpt-4o")

    assert encoder_spy == calls_for_one_message
    assert second_total == first_total - counter.count_message(first[199], "gpt-4o") + new_last_count

    encoder_spy.clear()
    assert counter.count_messages(orjson.loads(orjson.dumps(second)), "gpt-4o") == second_total
    assert encoder_spy == []  # nothing new at all


def test_cached_counts_equal_fresh_counts():
    msgs = _conversation(50)
    warm = TokenCounter()
    warm.count_messages(msgs)
    assert warm.message_counts(msgs) == TokenCounter().message_counts(msgs)
    assert warm.hits == 50


def test_same_message_is_cached_separately_per_encoding(o200k, cl100k):
    text = "日本語のテキスト and Ünïcödé"
    msg = {"role": "user", "content": text}
    counter = TokenCounter()
    assert counter.count_message(msg, "gpt-4o") == 4 + n(o200k, text)
    assert counter.count_message(msg, "gpt-4") == 4 + n(cl100k, text)
    assert counter.count_message(msg, "gpt-4o") == 4 + n(o200k, text)


def test_tool_list_count_is_cached(encoder_spy):
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 5,
                                               "parameters": {"type": "object", "properties": {}}}}
             for i in range(20)]
    counter = TokenCounter()
    first = counter.count_tools(tools)
    encoder_spy.clear()
    assert counter.count_tools(orjson.loads(orjson.dumps(tools))) == first
    assert encoder_spy == []


def test_cache_is_bounded_and_evicts_least_recently_used(encoder_spy):
    counter = TokenCounter(capacity=3)
    a, b, c, d = ({"role": "user", "content": f"message {x}"} for x in "abcd")
    for m in (a, b, c):
        counter.count_message(m)
    counter.count_message(a)  # a is now most recent; b is the oldest
    counter.count_message(d)  # evicts b
    assert counter.cache_size == 3

    encoder_spy.clear()
    counter.count_message(a)
    assert encoder_spy == []
    counter.count_message(b)
    assert "message b" in encoder_spy


def test_default_counter_is_a_token_counter():
    assert isinstance(tokens.default_counter, TokenCounter)
    assert tokens.CACHE_CAPACITY >= 10_000  # hundreds of 200-message sessions


# --------------------------------------------------------------------------- huge strings


def test_a_huge_string_is_never_tokenized_whole(encoder_spy, o200k):
    text = "a" * 10_000_000  # tiktoken needs seconds for this one piece
    count = TokenCounter().count_text(text, "gpt-4o")
    assert encoder_spy and max(map(len, encoder_spy)) <= tokens.SAMPLE_CHARS
    assert sum(map(len, encoder_spy)) == tokens.SAMPLE_WINDOWS * tokens.SAMPLE_CHARS
    assert count == len(text) // 8  # "aaaaaaaa" is one token: the estimate of a uniform text is exact
    assert tokens.is_estimated(text)


def test_strings_up_to_a_mebibyte_of_utf8_are_counted_exactly(o200k):
    log = "\n".join(f"2026-11-29T12:00:{i % 60:02d} worker[{i}] item {i * 7919 % 100003} ok" for i in range(20_000))
    log = log[:tokens.EXACT_COUNT_BYTES]
    assert not tokens.is_estimated(log)
    assert TokenCounter().count_text(log, "gpt-4o") == n(o200k, log)
    wide = "é" * (tokens.EXACT_COUNT_BYTES // 2 + 1)  # fewer characters than the limit, more bytes
    assert tokens.is_estimated(wide) and not tokens.is_estimated(wide[:-1])


def test_the_estimate_is_the_same_in_another_process():
    import subprocess
    import sys

    text = "".join(f"line {i}: {'xy' * (i % 13)} ünïcode {i * 31337}\n" for i in range(60_000))  # 2.4 MB, varied
    here = TokenCounter().count_text(text, "gpt-4o")
    code = ("import sys; from proxy.tokens.counter import TokenCounter; "
            "print(TokenCounter().count_text(sys.stdin.read(), 'gpt-4o'))")
    out = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, check=True,
                         encoding="utf-8")
    assert int(out.stdout) == here
    exact = n(get_encoding("o200k_base"), text)
    assert abs(here - exact) < exact * 0.02  # and close to the real count
