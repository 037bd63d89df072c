"""What the overhead benchmark sends, to whom, and how many times (full and ``--quick``)."""

from __future__ import annotations

MODEL = "gpt-4o"
# The long conversation is ~150k tokens; the mock's gpt-4o window is 128k, so the
# mock process is told this model has a larger one.
MOCK_WINDOW = 1_000_000
AUTH = {"authorization": "Bearer sk-bench-overhead", "content-type": "application/json"}
# The Messages API scenario: a Claude model (the mock gives `claude-*` a 200k window), the key
# in x-api-key and the version header, as Anthropic's SDK and Claude Code send them.
MESSAGES_MODEL = "claude-sonnet-4-6"
MESSAGES_MAX_TOKENS = 256
MESSAGES_AUTH = {"x-api-key": "sk-bench-overhead", "anthropic-version": "2023-06-01",
                 "content-type": "application/json"}
SMALL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say ok."},
]
CONCURRENCY = 16
TARGET_ADDED_MEDIAN_MS = 2.0
# The targets, in the order the interleaved rounds start from (LiteLLM last, when it runs).
DIRECT, PROXY, FLOOR, LITELLM = "direct", "proxy", "floor", "litellm"
# LiteLLM's proxy, pinned. Newer releases do not install from the package index here:
# 1.110.x's `proxy` extra pins `litellm-proxy==<same version>`, 1.108.8-1.108.14 pin
# `litellm-enterprise==0.1.79.post2` / `litellm-proxy-extras==0.4.110.post1`, none of
# which the index has; 1.108.4 installs on CPython 3.11 (`pip install --dry-run`).
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.4"
LITELLM_START_TIMEOUT = 120.0

FULL = dict(small=1000, small_warm=200, stream=500, stream_warm=50, c16=3000, c16_batches=6,
            c16_warm=320, long=50, long_warm=5, c16_long=320, c16_long_warm=32)
QUICK = dict(small=200, small_warm=50, stream=100, stream_warm=20, c16=600, c16_batches=2,
             c16_warm=64, long=10, long_warm=2, c16_long=96, c16_long_warm=16)
