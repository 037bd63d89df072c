"""How many tokens a model's context window holds: config first, then a built-in table, then the route default.

A wrong guess costs either a dead run (too large) or needless compaction (too
small); the `models:` section of config.yaml overrides anything here.

Learned windows: context windows learned from the provider's own context-length errors.

A user of a local 32k model should not have to tell the proxy its window: the
first overflow says "maximum context length is N tokens". The proxy records N
(in the store, so restarts and replicas know it too), compacts to fit, and
retries once; the client sees a normal answer.

What is learned shrinks later requests, so it is learned carefully:
- only from a genuine context-length error: the provider's own numbers
  (llama.cpp's `n_ctx` beside its `exceed_context_size_error`) or a message
  that *starts* with the provider's wording (OpenAI's and vLLM's "maximum
  context length is N tokens", Anthropic's two, Google's "The input token count (N)
  exceeds the maximum number of tokens allowed (M)"), whatever the error's code.
  A phrase somewhere inside a message may be the client's own text echoed
  back (a field's value quoted in "Invalid value for ..."), and is never
  believed, in any wording and for any API: the rule is applied before any
  wording is looked for;
- only when N is below the prompt that was rejected (the size the error states,
  else the proxy's own count with room for another tokenizer);
- per tenant, route and model: one tenant cannot shrink another's requests;
- for a limited time (`TTL_S`): a model redeployed with a bigger window is
  used fully again by the next day.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import orjson

from proxy.config import Settings
from proxy.store import Store, StoreError
from proxy.store.keys import tenant_key

# Longest glob first wins; provider prefixes ("openai/gpt-4o") are stripped before matching.
BUILTIN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1*", 1_047_576),
    ("gpt-5*", 400_000),
    ("gpt-4o*", 128_000),
    ("chatgpt-4o*", 128_000),
    ("gpt-4-turbo*", 128_000),
    ("gpt-4-32k*", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo*", 16_385),
    ("o1*", 200_000),
    ("o3*", 200_000),
    ("o4*", 200_000),
    ("gpt-oss*", 131_072),
    ("claude-*", 200_000),
    ("gemini-*", 1_048_576),
    ("deepseek-*", 128_000),
)


def context_window(settings: Settings, model: str | None, route_default: int) -> int:
    if not model:
        return route_default
    facts = settings.models.get(model)
    if facts and facts.context_window:
        return facts.context_window
    return _builtin_window(model.rsplit("/", 1)[-1]) or route_default


@functools.lru_cache(maxsize=1024)
def _builtin_window(bare: str) -> int | None:
    """The built-in table's window for a model name (the first glob it matches), found once per name: a request
    otherwise matched its model against the table's globs one by one."""
    return next((window for glob, window in BUILTIN_WINDOWS if fnmatchcase(bare, glob)), None)


TTL_S = 24 * 3600.0  # how long a learned window holds
_CODES = frozenset({"context_length_exceeded"})
_TYPES = frozenset({"exceed_context_size_error"})  # llama.cpp's server
# The provider's own opening words (OpenAI, vLLM, and the servers that copy them).
_OPENING = re.compile(r"(?:this model's )?maximum context length is ([\d,]+) tokens", re.IGNORECASE)
_REQUESTED = re.compile(r"(?:you requested|resulted in) ([\d,]+) tokens", re.IGNORECASE)
# Anthropic's two wordings: the prompt alone, and the prompt with max_tokens.
_ANTHROPIC = re.compile(r"prompt is too long: ([\d,]+) tokens > ([\d,]+) maximum", re.IGNORECASE)
_ANTHROPIC_BUDGET = re.compile(r"input length and `?max_tokens`? exceed context limit: ([\d,]+) \+ ([\d,]+) > ([\d,]+)",
                               re.IGNORECASE)
# Google's (the Gemini API's), the prompt alone.
_GOOGLE = re.compile(r"the input token count \(([\d,]+)\) exceeds the maximum number of tokens allowed \(([\d,]+)\)",
                     re.IGNORECASE)
# Our count of the rejected prompt may be this much lower than the provider's own tokenizer's.
_TOKENIZER_SLACK = 1.5
_MAX_KNOWN = 10_000  # in-process entries before the cache is dropped and re-read from the store


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _hashable_in(value: Any, known: frozenset[str]) -> bool:
    """`value in known` for a value from the provider's JSON, which may be a list or an object."""
    return isinstance(value, str) and value in known


def _error_of(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else None


def overflow_limit(content: bytes, sent_tokens: int, reserve: int = 0) -> int | None:
    """The window a genuine context-length error names, if it is below the prompt it rejected; else None.

    `sent_tokens`: the proxy's own count of the rejected request (prompt plus completion budget);
    `reserve`: that completion budget.
    """
    err = _error_of(content)
    if err is None:
        return None
    raw_message = err.get("message")
    # Only the message's opening is the provider's own wording: every pattern is matched there, never searched.
    message = raw_message.lstrip() if isinstance(raw_message, str) else ""
    if (anthropic := _anthropic_limit(message, sent_tokens, reserve)) is not None:
        return anthropic
    limit: int | None = None
    n_ctx = err.get("n_ctx")
    if _hashable_in(err.get("code"), _CODES) or _hashable_in(err.get("type"), _TYPES):
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
            limit = n_ctx
    if limit is None and (m := _OPENING.match(message)):
        limit = _int(m.group(1))
    if limit is None or limit <= 0:
        return None
    requested = err.get("n_prompt_tokens")
    if not (isinstance(requested, int) and not isinstance(requested, bool)):
        m = _REQUESTED.search(message)
        requested = _int(m.group(1)) if m else None
    if requested is not None and limit >= requested:
        return None
    if limit >= sent_tokens * _TOKENIZER_SLACK:
        return None
    return limit


def _anthropic_limit(message: str, sent_tokens: int, reserve: int) -> int | None:
    """Anthropic's (or Google's) window, in the proxy's tokens: their tokenizers are not ours, so the room for the
    prompt is scaled by how our count of the rejected prompt compares with the provider's (else a window learned in the
    provider's tokens would never be below the prompt as we count it, and the retry would be rejected again)."""
    ours = sent_tokens - reserve
    if m := _ANTHROPIC.match(message) or _GOOGLE.match(message):  # the prompt alone is over the window
        theirs, window = _int(m.group(1)), _int(m.group(2))
        if theirs <= window or theirs <= 0 or ours <= 0:
            return None
        return max(1, window * ours // theirs)
    if m := _ANTHROPIC_BUDGET.match(message):  # the prompt and max_tokens are: the budget is not tokenized
        theirs, budget, window = _int(m.group(1)), _int(m.group(2)), _int(m.group(3))
        if theirs + budget <= window or theirs <= 0 or ours <= 0 or window <= budget:
            return None
        return max(1, (window - budget) * ours // theirs) + reserve
    return None


@dataclass(frozen=True)
class _Known:
    window: int | None
    until: float  # monotonic time after which the store is asked again


class LearnedWindows:
    """Per (tenant, route, model): the smallest window a provider has reported lately. Cached in process."""

    def __init__(self, store: Store, ttl: float = TTL_S) -> None:
        self.store = store
        self.ttl = ttl
        self._known: dict[tuple[str, str, str], _Known] = {}

    @staticmethod
    def _key(tenant: str, route: str, model: str) -> str:
        return tenant_key(tenant, "window", route, model)

    async def get(self, tenant: str, route: str, model: str | None) -> int | None:
        if not model:
            return None
        k = (tenant, route, model)
        known = self._known.get(k)
        now = time.monotonic()
        if known is None or now >= known.until:
            try:
                raw = await self.store.get(self._key(*k))
            except StoreError:
                return None
            window = int(raw) if raw else None
            # A stored window expires in the store; re-read it now and then so its expiry shows here too.
            known = _Known(window, now + min(self.ttl, 60.0))
            self._remember(k, known)
        return known.window

    async def learn(self, tenant: str, route: str, model: str, window: int) -> None:
        k = (tenant, route, model)
        self._remember(k, _Known(window, time.monotonic() + min(self.ttl, 60.0)))
        try:
            await self.store.put(self._key(*k), str(window).encode(), ttl=self.ttl)
        except StoreError:
            pass  # known in this process; other replicas learn on their own first overflow

    def _remember(self, k: tuple[str, str, str], known: _Known) -> None:
        if len(self._known) >= _MAX_KNOWN:
            self._known.clear()
        self._known[k] = known
