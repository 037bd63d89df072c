"""Token usage as providers report it, in every spelling, with "reported 0" kept apart from "not reported".

OpenAI: usage.prompt_tokens_details.cached_tokens. Anthropic-style:
cache_read_input_tokens / cache_creation_input_tokens (input_tokens then
excludes them). DeepSeek-style: prompt_cache_hit_tokens / prompt_cache_miss_tokens.
Some add cache_write_tokens. Google (Gemini's `usageMetadata`): promptTokenCount
(cached included), cachedContentTokenCount (absent when nothing was cached),
candidatesTokenCount and thoughtsTokenCount (both output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    prompt: int
    completion: int
    cached: int | None  # None: the provider did not say
    cache_write: int | None = None
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # as the provider spelled it

    def __add__(self, other: Usage) -> Usage:
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)
        return Usage(self.prompt + other.prompt, self.completion + other.completion,
                     add(self.cached, other.cached), add(self.cache_write, other.cache_write))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_usage(usage: Any) -> Usage | None:
    """A provider's `usage` object, normalized; None when there is none."""
    if not isinstance(usage, dict):
        return None
    if "promptTokenCount" in usage:
        return Usage(prompt=_int(usage.get("promptTokenCount")) or 0,
                     completion=(_int(usage.get("candidatesTokenCount")) or 0)
                     + (_int(usage.get("thoughtsTokenCount")) or 0),
                     cached=_int(usage.get("cachedContentTokenCount")) or 0, raw=usage)
    completion = _int(usage.get("completion_tokens")) or _int(usage.get("output_tokens")) or 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    write = _int(usage.get("cache_write_tokens"))
    if isinstance(details, dict) and write is None:
        write = _int(details.get("cache_write_tokens"))
    prompt = _int(usage.get("prompt_tokens"))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        read = _int(usage.get("cache_read_input_tokens")) or 0
        created = _int(usage.get("cache_creation_input_tokens")) or 0
        base = _int(usage.get("input_tokens"))
        cached = read if cached is None else cached
        write = created if write is None else write
        if prompt is None and base is not None:
            prompt = base + read + created
    if "prompt_cache_hit_tokens" in usage:
        hit = _int(usage.get("prompt_cache_hit_tokens"))
        cached = hit if hit is not None else cached
        if prompt is None:
            prompt = (hit or 0) + (_int(usage.get("prompt_cache_miss_tokens")) or 0)
    if prompt is None:
        prompt = _int(usage.get("input_tokens")) or 0
    return Usage(prompt=prompt, completion=completion, cached=cached, cache_write=write, raw=usage)


def summed(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """Usage objects of several provider calls added up in the provider's own spelling.

    Every number is summed wherever it sits (prompt, completion, total, cached,
    reasoning, cache reads and writes), nested objects field by field; anything
    else keeps the last call's value. The last call's key order is kept.
    """
    out: dict[str, Any] = {}
    for u in usages:
        for k, v in u.items():
            old = out.get(k)
            if _number(v) and _number(old):
                out[k] = old + v
            elif isinstance(v, dict) and isinstance(old, dict):
                out[k] = summed([old, v])
            elif v is None and old is not None:
                continue  # a call that did not say keeps what the others said
            else:
                out[k] = v
    last = usages[-1] if usages else {}
    return {**{k: out[k] for k in last}, **out}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
