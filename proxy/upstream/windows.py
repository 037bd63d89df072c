"""How many tokens a model's context window holds: config first, then a built-in table, then the route default.

A wrong guess costs either a dead run (too large) or needless compaction (too
small); the `models:` section of config.yaml overrides anything here.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from proxy.config import Settings

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
    bare = model.rsplit("/", 1)[-1]
    for glob, window in BUILTIN_WINDOWS:
        if fnmatchcase(bare, glob):
            return window
    return route_default
