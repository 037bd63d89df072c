"""proxy.tokens: offline encodings, model mapping, counting rules, per-message cache."""

from __future__ import annotations

import copy
import gzip
import hashlib
import os
import socket

import orjson
import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from proxy import tokens
from proxy.tokens import (
    IMAGE_TOKENS_DEFAULT,
    IMAGE_TOKENS_LOW_DETAIL,
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_NAME,
    TOKENS_PER_TOOL_CALL,
    TOKENS_PER_TOOL_DEFINITION,
    TokenCounter,
    TokenizerUnavailable,
    encoding_for_model,
    encoding_name_for_model,
    ensure_encodings,
    message_digest,
)

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
O200K_SHA = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CL100K_SHA = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


@pytest.fixture(autouse=True, scope="module")
def _private_tiktoken_cache(tmp_path_factory):
    """Keep this module from writing into the real home cache or leaking TIKTOKEN_CACHE_DIR."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection or resolve a name fails the test loudly."""
    attempts: list[object] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.fixture
def cold_encodings(monkeypatch):
    """Forget every loaded encoding, ours and tiktoken's, so the next load reads files."""
    monkeypatch.setattr(tokens, "_encodings", {})
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})


def n(enc: tiktoken.Encoding, text: str) -> int:
    """Independent count: tiktoken's encode with special tokens treated as text."""
    return len(enc.encode(text, disallowed_special=()))


# --------------------------------------------------------------------------- offline loading


def test_both_encodings_load_from_a_fresh_cache_dir_without_network(tmp_path, monkeypatch, no_network,
                                                                     cold_encodings):
    cache = tmp_path / "fresh"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    o200k = tokens.get_encoding("o200k_base")
    cl100k = tokens.get_encoding("cl100k_base")

    assert o200k.encode_ordinary("hello world") == [24912, 2375]
    assert cl100k.encode_ordinary("hello world") == [15339, 1917]
    # tiktoken read the files we seeded, under its own cache-key scheme
    for url, sha in ((O200K_URL, O200K_SHA), (CL100K_URL, CL100K_SHA)):
        path = cache / hashlib.sha1(url.encode()).hexdigest()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    assert no_network == []
    assert not list(cache.glob("*.tmp"))


def test_loaded_encodings_are_memoized(cold_encodings):
    assert tokens.get_encoding("o200k_base") is tokens.get_encoding("o200k_base")


def test_without_tiktoken_cache_dir_seeds_the_ctxproxy_dir_and_points_tiktoken_at_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("CTXPROXY_TIKTOKEN_DIR", str(tmp_path / "ctx"))

    seeded = ensure_encodings()

    assert seeded.cache_dir == tmp_path / "ctx"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path / "ctx")
    assert seeded.sha256 == {"o200k_base": O200K_SHA, "cl100k_base": CL100K_SHA}
    assert (tmp_path / "ctx" / hashlib.sha1(O200K_URL.encode()).hexdigest()).is_file()


def test_without_any_override_seeds_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.delenv("CTXPROXY_TIKTOKEN_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    assert ensure_encodings().cache_dir == tmp_path / "xdg" / "ctxproxy" / "tiktoken"


def test_unwritable_ctxproxy_dir_falls_back_to_a_temp_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # mkdir below it fails even for root
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("CTXPROXY_TIKTOKEN_DIR", str(blocker / "tiktoken"))

    seeded = ensure_encodings()

    assert seeded.cache_dir != blocker / "tiktoken"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(seeded.cache_dir)
    assert (seeded.cache_dir / hashlib.sha1(CL100K_URL.encode()).hexdigest()).is_file()


def test_unwritable_user_tiktoken_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(TokenizerUnavailable, match="TIKTOKEN_CACHE_DIR"):
        ensure_encodings()


def test_seeding_keeps_valid_files_and_replaces_bad_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    ensure_encodings()
    o200k = tmp_path / hashlib.sha1(O200K_URL.encode()).hexdigest()
    cl100k = tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    o200k_inode = o200k.stat().st_ino
    cl100k.write_bytes(b"truncated")

    ensure_encodings()

    assert o200k.stat().st_ino == o200k_inode  # untouched
    assert hashlib.sha256(cl100k.read_bytes()).hexdigest() == CL100K_SHA  # repaired


def _fake_shipped(monkeypatch, tmp_path, payload: bytes) -> None:
    fake = tmp_path / "shipped.tiktoken.gz"
    fake.write_bytes(payload)
    monkeypatch.setattr(tokens, "_shipped_path", lambda resource: fake)


@pytest.mark.parametrize("payload", [
    gzip.compress(b"aGVsbG8= 0\n"),  # valid gzip, wrong contents
    b"this is not gzip at all",
], ids=["wrong-hash", "not-gzip"])
def test_corrupt_shipped_file_raises_tokenizer_unavailable(tmp_path, monkeypatch, no_network, cold_encodings,
                                                           payload):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    _fake_shipped(monkeypatch, tmp_path, payload)

    with pytest.raises(TokenizerUnavailable) as direct:
        ensure_encodings(["o200k_base"])
    with pytest.raises(TokenizerUnavailable) as via_load:
        tokens.get_encoding("o200k_base")

    for info in (direct, via_load):
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("o200k_base: shipped file ")
        assert " is corrupt " in message  # (tmp_path itself contains the word "corrupt")
    assert no_network == []
    assert not (tmp_path / "cache").exists()  # nothing was written for tiktoken to read


def test_tiktoken_never_downloads_even_if_its_cache_misses(tmp_path, monkeypatch, cold_encodings):
    # Simulate tiktoken and us disagreeing on the cache file name.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tokens, "_cache_file_name", lambda url: "elsewhere-" + hashlib.sha1(url.encode()).hexdigest())
    original_read_file = tiktoken.load.read_file

    with pytest.raises(TokenizerUnavailable, match="tried to download"):
        tokens.get_encoding("cl100k_base")
    assert tiktoken.load.read_file is original_read_file


def test_module_main_seeds_and_prints_dir_and_hashes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert tokens.main() == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and O200K_SHA in out and CL100K_SHA in out


# --------------------------------------------------------------------------- model -> encoding


@pytest.mark.parametrize("model,expected", [
    ("gpt-4o", "o200k_base"),
    ("gpt-4o-mini-2024-07-18", "o200k_base"),
    ("gpt-4.1-nano", "o200k_base"),
    ("gpt-4.5-preview", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-5-mini", "o200k_base"),
    ("o1-preview", "o200k_base"),
    ("o3-mini", "o200k_base"),
    ("o4-mini", "o200k_base"),
    ("chatgpt-4o-latest", "o200k_base"),
    ("gpt-oss-120b", "o200k_base"),
    ("openai/gpt-4o", "o200k_base"),
    ("openrouter/openai/gpt-oss-20b", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-4-turbo", "cl100k_base"),
    ("gpt-4-0613", "cl100k_base"),
    ("gpt-3.5-turbo", "cl100k_base"),
    ("gpt-35-turbo", "cl100k_base"),
    ("openai/gpt-4", "cl100k_base"),
    ("ft:gpt-3.5-turbo:acme::abc123", "cl100k_base"),
    ("text-embedding-3-small", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
    ("claude-sonnet-4", "o200k_base"),
    ("", "o200k_base"),
    (None, "o200k_base"),
])
def test_model_names_map_to_encodings(model, expected):
    assert encoding_name_for_model(model) == expected
    assert encoding_for_model(model).name == expected


# --------------------------------------------------------------------------- counting rules


@pytest.fixture
def o200k():
    return tokens.get_encoding("o200k_base")


@pytest.fixture
def cl100k():
    return tokens.get_encoding("cl100k_base")


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
                                         "function": {"name": "bash", "arguments": f'{{"command": "cat file_{i}.py"}}'}}]})
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
    assert tokens.CACHE_CAPACITY >= 100_000
