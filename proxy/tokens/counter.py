"""Token counting for chat requests, with a per-message cache.

Why this module exists
----------------------
The proxy decides what to keep in an agent's context window by counting
tokens, and it does so on every request. The tiktoken encodings come from
:mod:`proxy.tokens.encodings`, which provides them offline (no network, ever).
**Requests repeat themselves**: an agent re-sends the whole conversation on
every turn, so of 200 messages typically 199 were counted before. Each
message is identified by :func:`message_digest` (a hash of its canonical
JSON) and its count is kept in a bounded LRU; only new messages are
tokenized.

Counting rules
--------------
They follow OpenAI's published recipe for chat models (the "how to count
tokens" cookbook). It is exact for plain text messages on the models it was
written for and an approximation elsewhere:

* every message costs :data:`TOKENS_PER_MESSAGE` (3), plus the tokens of its
  ``role`` and ``name`` strings, plus :data:`TOKENS_PER_NAME` (1) if it has a
  ``name``; every request adds :data:`REPLY_PRIMING_TOKENS` (3);
* ``content`` (Gemini's ``parts``) may be a string, None, or a list of parts: text parts
  (``text``/``input_text``/``output_text``) count their text, ``refusal`` parts
  their refusal, image parts a fixed estimate (:data:`IMAGE_TOKENS_LOW_DETAIL`
  for ``detail="low"``, :data:`IMAGE_TOKENS_DEFAULT` otherwise - the real cost
  depends on the image size, which we do not decode), any other part its JSON;
* ``reasoning_content``, ``refusal`` and ``tool_call_id`` strings count as text;
* each assistant tool call (and the legacy ``function_call``) counts its
  function name and arguments string plus :data:`TOKENS_PER_TOOL_CALL`
  (approximation);
* each tool definition counts the JSON of its function definition plus
  :data:`TOKENS_PER_TOOL_DEFINITION` (approximation: OpenAI renders tools into
  a TypeScript-like preamble, which JSON slightly overestimates);
* other message keys are metadata and are not counted.

Huge strings
------------
A string over :data:`EXACT_COUNT_BYTES` of UTF-8 is not tokenized whole: its
count is estimated from an exact count of :data:`SAMPLE_WINDOWS` windows of
:data:`SAMPLE_CHARS` characters spread evenly over it, scaled by its length.
Tokenizing it whole would cost seconds of CPU (tiktoken needs ~6 s for 10 MB of
one repeated letter) and, to build the list of token ids, hold the GIL for tens
of milliseconds; the estimate costs a bounded fraction of that and is
deterministic: the same string gives the same count on every process.
:func:`is_estimated` tells which strings are counted this way. Every real
tool result and message (a long log is 50k-800k characters) is counted exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import tiktoken

from proxy.lru import LockedLRU
from proxy.tokens.encodings import encoding_for_model

__all__ = [
    "CACHE_CAPACITY",
    "EXACT_COUNT_BYTES",
    "IMAGE_TOKENS_DEFAULT",
    "IMAGE_TOKENS_LOW_DETAIL",
    "REPLY_PRIMING_TOKENS",
    "SAMPLE_CHARS",
    "SAMPLE_WINDOWS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOKENS_PER_TOOL_CALL",
    "TOKENS_PER_TOOL_DEFINITION",
    "TokenCounter",
    "default_counter",
    "is_estimated",
    "message_digest",
]

# --------------------------------------------------------------------------- constants

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# Approximations (see module docstring).
TOKENS_PER_TOOL_CALL = 3
TOKENS_PER_TOOL_DEFINITION = 8
IMAGE_TOKENS_LOW_DETAIL = 85
IMAGE_TOKENS_DEFAULT = 765  # a 1024x1024 image at high detail: 85 + 4 tiles x 170

CACHE_CAPACITY = 30_000  # entries; each is a (str, 16-byte digest) -> int pair

# Strings up to this many bytes of UTF-8 are tokenized whole (a token is at least a byte, so its id
# list stays under a million entries); longer ones get a sampled estimate (module docstring).
EXACT_COUNT_BYTES = 1 << 20
SAMPLE_WINDOWS = 16
SAMPLE_CHARS = 8192  # 16 x 8k = 128k characters tokenized for any huge string

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})
# --------------------------------------------------------------------------- canonical bytes and digests


def _canonical_bytes(obj: Any) -> bytes:
    """Canonical JSON of ``obj``: orjson with sorted keys, the same on every process.

    Objects orjson refuses (lone surrogates from a non-orjson parser, integers
    beyond 64 bits) fall back, deterministically, to the standard library.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )


def _digest(obj: Any) -> bytes:
    canonical = _canonical_bytes(obj)
    if b'"cache_control":' in canonical:  # a cache marker is not content: providers match prefixes without it
        canonical = _canonical_bytes(_unmarked(obj))
    return hashlib.blake2b(canonical, digest_size=16).digest()


def _unmarked(v: Any) -> Any:
    """`v` without its `cache_control` keys, at any depth (Claude Code moves its marker every turn)."""
    if isinstance(v, Mapping):
        return {k: _unmarked(x) for k, x in v.items() if k != "cache_control"}
    if isinstance(v, list):
        return [_unmarked(x) for x in v]
    return v


def message_digest(message: Mapping[str, Any]) -> bytes:
    """16-byte blake2b of the message's canonical JSON (sorted keys, orjson).

    The one place a message is hashed: equal messages (as JSON values, key
    order ignored, cache markers left out) give equal digests on any process;
    use it for caches and hash chains.
    """
    return _digest(message)


_ITEM_KEYS_UNSEEN = frozenset({"type", "id", "status", "encrypted_content"})  # not read by the model as text
# Encrypted reasoning is billed as the reasoning the provider decrypts, not as the ciphertext's text: base64 of
# about as many bytes as the plaintext, ~4 bytes a token, so 3 tokens per 16 characters.
ENCRYPTED_TOKENS_PER_CHAR_16 = 3


def _item_text(item: Mapping[str, Any]) -> str:
    """What of a non-message item reaches the model: its strings (name, arguments, output, summaries...)."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, Mapping):
            for k, x in v.items():
                if k not in _ITEM_KEYS_UNSEEN:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif v is not None and not isinstance(v, bool):
            out.append(str(v))

    walk(item)
    return "\n".join(out)


def _json_text(obj: Any) -> str:
    # Canonical, so that a count depends only on what the digest identifies.
    return _canonical_bytes(obj).decode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- huge strings


def is_estimated(text: str) -> bool:
    """Whether `text` is counted by the sampled estimate rather than tokenized whole."""
    n = len(text)
    if n <= EXACT_COUNT_BYTES // 4 or (n <= EXACT_COUNT_BYTES and text.isascii()):
        return False  # at most 4 bytes a character
    return n > EXACT_COUNT_BYTES or len(text.encode("utf-8", "surrogatepass")) > EXACT_COUNT_BYTES


def _estimate(enc: tiktoken.Encoding, text: str) -> int:
    """Tokens of a huge string, from windows at fixed places: deterministic, bounded work."""
    n = len(text)
    step = (n - SAMPLE_CHARS) // (SAMPLE_WINDOWS - 1)
    sampled = sum(len(enc.encode_ordinary(text[i * step:i * step + SAMPLE_CHARS])) for i in range(SAMPLE_WINDOWS))
    return -(-sampled * n // (SAMPLE_WINDOWS * SAMPLE_CHARS))  # rounded up


# --------------------------------------------------------------------------- the counter


class TokenCounter:
    """Counts tokens of chat requests; remembers per-message and per-tool-list counts.

    Cache keys are ``(encoding name, digest)``; message digests come from
    :func:`message_digest`, so a message counted once is never tokenized again
    while it stays in the cache, whatever dict object carries it.
    """

    def __init__(self, capacity: int = CACHE_CAPACITY) -> None:
        self._cache: LockedLRU[tuple[str, bytes], int] = LockedLRU(capacity)
        self.hits = 0
        self.misses = 0

    # -- plumbing

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()
        self.hits = self.misses = 0

    @staticmethod
    def _n(enc: tiktoken.Encoding, text: str) -> int:
        if not text:
            return 0
        if len(text) > EXACT_COUNT_BYTES // 4 and is_estimated(text):
            return _estimate(enc, text)
        # encode_ordinary: "<|endoftext|>" in user text is just text, never an error.
        return len(enc.encode_ordinary(text))

    # -- text

    def count_text(self, text: str, model: str | None = None) -> int:
        """Tokens of a plain string (not cached: the caller knows if it repeats)."""
        return self._n(encoding_for_model(model), text)

    # -- messages

    def count_message(self, message: Mapping[str, Any], model: str | None = None) -> int:
        """Tokens one message adds to a request, including its per-message overhead."""
        return self._message_count(message, encoding_for_model(model))

    def message_counts(self, messages: Sequence[Mapping[str, Any]], model: str | None = None,
                       digests: Sequence[bytes] | None = None) -> list[int]:
        """Per-message counts, in order (each includes its overhead; no reply priming).

        ``digests``: the messages' :func:`message_digest` values when the caller has them
        already (e.g. for a hash chain), so no message is hashed twice.
        """
        enc = encoding_for_model(model)
        if digests is None:
            return [self._message_count(m, enc) for m in messages]
        return [self._message_count(m, enc, d) for m, d in zip(messages, digests)]

    def count_messages(self, messages: Sequence[Mapping[str, Any]], model: str | None = None) -> int:
        """Tokens of a message list as a request prompt: the messages plus reply priming."""
        return sum(self.message_counts(messages, model)) + REPLY_PRIMING_TOKENS

    def _message_count(self, message: Mapping[str, Any], enc: tiktoken.Encoding, digest: bytes | None = None) -> int:
        key = (enc.name, digest if digest is not None else message_digest(message))
        count = self._cache.touch(key)
        if count is not None:
            self.hits += 1
            return count
        self.misses += 1
        count = self._count_message_uncached(message, enc)
        self._cache.put(key, count)
        return count

    def _count_message_uncached(self, message: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        n = TOKENS_PER_MESSAGE
        if not isinstance(message, Mapping):  # malformed; count what is there
            return n + self._n(enc, _json_text(message))
        if "role" not in message:  # an API's item that is not a message (a Responses call, result, reasoning)
            blob = message.get("encrypted_content")
            sealed = len(blob) * ENCRYPTED_TOKENS_PER_CHAR_16 // 16 if isinstance(blob, str) else 0
            return n + self._n(enc, _item_text(message)) + sealed
        role = message.get("role")
        if isinstance(role, str):
            n += self._n(enc, role)
        name = message.get("name")
        if name is not None:
            n += TOKENS_PER_NAME + self._n(enc, name if isinstance(name, str) else _json_text(name))
        n += self._content_count(message.get("content", message.get("parts")), enc)  # Gemini's: `parts`
        for key in ("reasoning_content", "refusal", "tool_call_id"):
            value = message.get(key)
            if isinstance(value, str):
                n += self._n(enc, value)
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                n += self._tool_call_count(call, enc)
        function_call = message.get("function_call")  # legacy single call
        if isinstance(function_call, Mapping):
            n += self._function_count(function_call, enc)
        return n

    def _content_count(self, content: Any, enc: tiktoken.Encoding) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self._n(enc, content)
        if isinstance(content, list):
            return sum(self._part_count(part, enc) for part in content)
        return self._n(enc, _json_text(content))

    def _part_count(self, part: Any, enc: tiktoken.Encoding) -> int:
        if isinstance(part, str):
            return self._n(enc, part)
        if not isinstance(part, Mapping):
            return self._n(enc, _json_text(part))
        kind = part.get("type")
        if kind is None and isinstance(part.get("text"), str):  # a Gemini text part (its signature is not text)
            return self._n(enc, part["text"])
        if not isinstance(kind, str):  # a list or an object: not looked up, counted as JSON
            return self._n(enc, _json_text(part))
        if kind in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            return self._n(enc, part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self._n(enc, part["refusal"])
        if kind in _IMAGE_PART_TYPES:
            image = part.get("image_url")
            detail = image.get("detail") if isinstance(image, Mapping) else part.get("detail")
            return IMAGE_TOKENS_LOW_DETAIL if detail == "low" else IMAGE_TOKENS_DEFAULT
        return self._n(enc, _json_text(part))

    def _tool_call_count(self, call: Any, enc: tiktoken.Encoding) -> int:
        if isinstance(call, Mapping):
            fn = call.get("function")
            if not isinstance(fn, Mapping):
                fn = call.get("custom")  # custom tools: {"name", "input"}
            if isinstance(fn, Mapping):
                return self._function_count(fn, enc)
        return TOKENS_PER_TOOL_CALL + self._n(enc, _json_text(call))

    def _function_count(self, fn: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        n = TOKENS_PER_TOOL_CALL
        for key in ("name", "arguments", "input"):
            value = fn.get(key)
            if isinstance(value, str):
                n += self._n(enc, value)
            elif value is not None:
                n += self._n(enc, _json_text(value))
        return n

    # -- tools

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None, model: str | None = None) -> int:
        """Tokens of a tool list: per tool, its function definition's JSON plus an overhead."""
        if not tools:
            return 0
        enc = encoding_for_model(model)
        key = (enc.name, b"tools:" + _digest(tools))
        count = self._cache.touch(key)
        if count is not None:
            self.hits += 1
            return count
        self.misses += 1
        count = 0
        for tool in tools:
            definition = tool.get("function", tool) if isinstance(tool, Mapping) else tool
            count += TOKENS_PER_TOOL_DEFINITION + self._n(enc, _json_text(definition))
        self._cache.put(key, count)
        return count

    # -- whole request

    def count_request(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a chat-completions body: messages, tools, legacy functions, schema.

        ``response_format`` with a JSON schema counts the schema's JSON (an
        approximation: the provider injects it into the prompt in some form).
        """
        model = body.get("model")
        model = model if isinstance(model, str) else None
        n = self.count_messages(body.get("messages") or [], model)
        n += self.count_tools(body.get("tools"), model)
        n += self.count_tools(body.get("functions"), model)  # legacy: bare definitions
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping) and isinstance(response_format.get("json_schema"), Mapping):
            n += self._n(encoding_for_model(model), _json_text(response_format["json_schema"]))
        return n


default_counter = TokenCounter()
