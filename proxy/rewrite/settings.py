"""Every transform's settings: one pydantic model per config section, with its documented defaults.

Kept apart from the transforms themselves so that validating a config file
(proxy/config.py) needs only these models, not the transforms, the store or
the HTTP client. Each model reads only its own section; what one transform
needs of another reaches it typed, through `Peers` (proxy/rewrite/pipeline.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxy.rewrite.preview import error_matcher
from proxy.rewrite.status_bar.shapes import DEFAULT_ERROR_PATTERN, TodoShape


class Impossible(ValueError):
    """Settings of one section that cannot work together (or cannot work at all): refused at start.

    `keys` names them, dotted within the section, so the configuration error can
    say where they were set (a route's own section, or the defaults it inherits).
    """

    def __init__(self, keys: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.keys = keys


MIN_THRESHOLD_TOKENS = 256  # the smallest offload threshold allowed (texts under it are never looked up)
USER_SHARE_FACTOR = 2  # a user message may take twice the window share a tool result may
TAIL_SHARE_OF_TARGET = 0.5  # compression's verbatim tail takes at most half of the target
DEFAULT_FACTS = ("What is the task, with its constraints?", "Which files were read, created or changed, and how?",
                 "What has been verified to work, and what failed?", "What remains to be done, and what is next?")


class OffloadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    tool_result_tokens: int = Field(default=20_000, ge=MIN_THRESHOLD_TOKENS)  # offload a tool result over this
    user_message_tokens: int = Field(default=50_000, ge=MIN_THRESHOLD_TOKENS)  # ... a user message over this
    preview_head_lines: int = Field(default=10, ge=0)  # first lines shown in the placeholder
    preview_tail_lines: int = Field(default=5, ge=0)  # last lines shown
    preview_line_chars: int = Field(default=200, ge=40)  # each preview line cut to this many characters
    preview_max_share: float = Field(default=0.25, gt=0, lt=1)  # a preview costs at most this share of the original
    retention_days: float = Field(default=7, gt=0)  # how long stored text stays readable
    # Thresholds never exceed this share of the model's window (twice it for user messages), so a
    # small local model gets early offloading without retuning (32k window: tool results over 8k tokens).
    max_window_share: float = Field(default=0.25, gt=0, le=1)
    # A preview also shows the lines matching this anywhere in the text, with their line numbers (RE2
    # syntax; by default the status bar's error pattern), at most `preview_error_lines` of them.
    error_pattern: str = DEFAULT_ERROR_PATTERN
    preview_error_lines: int = Field(default=10, ge=0)

    @field_validator("error_pattern")
    @classmethod
    def _re2(cls, v: str) -> str:
        if error_matcher(v) is None:
            raise ValueError("must be a regular expression in RE2 syntax (no backreferences or lookaround)")
        return v

    def threshold(self, role: str | None, window: int) -> int:
        """Tokens over which a message of `role` is offloaded, for a model of `window` tokens (the one definition,
        used by the transform and printed by `ctxproxy check`)."""
        if role == "user":  # the task itself: offloaded only when truly huge for the window
            limit = min(self.user_message_tokens, int(window * self.max_window_share * USER_SHARE_FACTOR))
        else:
            limit = min(self.tool_result_tokens, int(window * self.max_window_share))
        return max(MIN_THRESHOLD_TOKENS, limit)


class CompressSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    trigger: float = Field(default=0.75, gt=0, le=1)  # compact when the prompt passes this share of the window
    target: float = Field(default=0.2, gt=0, lt=1)  # ... down to this share (lower: fewer, larger steps)
    keep_recent_tokens: int = Field(default=8000, ge=0)  # newest messages kept verbatim
    exclude_tools: tuple[str, ...] = ()  # tool results never cleared
    min_clear_tokens: int = Field(default=200, ge=1)  # smaller tool results are not worth a placeholder
    summary: bool = True  # layer 2 on
    strategy: Literal["summary", "facts"] = "summary"  # one summary call, or one call per question
    facts: tuple[str, ...] = DEFAULT_FACTS  # the questions of the facts strategy
    summary_model: str | None = None  # None: the request's model
    # cached: re-send the conversation as the provider last saw it plus one instruction (a cache hit, whole
    # span read); transcript: a separate prompt with the span cut to summary_input_tokens (billed in full).
    # A different summary_model always uses the transcript shape.
    summary_prompt: Literal["cached", "transcript"] = "cached"
    summary_input_tokens: int = Field(default=6000, ge=1000)  # the transcript shape is cut to this (billed uncached)
    # the summary's length limit (sent as its max_tokens; a longer answer is cut to it by lines, every heading
    # kept); None: a thirty-second of the window, 256 to 2,000 tokens (a fixed 2,000 would be half of a 4k window)
    summary_max_tokens: int | None = Field(default=None, ge=100)
    summary_timeout: float = Field(default=60, gt=0)  # seconds; then layer 1 / archive fallback
    identifiers_cap: int = Field(default=400, ge=0)  # identifiers listed verbatim under a summary
    identifiers_max_share: float = Field(default=0.08, ge=0, lt=1)  # ... costing at most this share of the window
    breaker_cooldown: float = Field(default=300, gt=0)  # seconds without summarizer calls after a failure
    # past this share of the window the next compaction's summary is written in the background, so the
    # request crossing `trigger` does not wait for it; null: never
    # 0.03 under the trigger: the tail that arrives after the background summary stays verbatim in the compacted
    # prompt, paid on every later turn (0.07 under it cost 2.6% more at 32k)
    precompute: float | None = Field(default=0.72, gt=0, lt=1)
    retention_days: float = Field(default=7, gt=0)  # how long archived history stays readable

    def recent_tokens(self, window: int) -> int:
        """Tokens of newest messages kept verbatim: room must stay under the target, or it can't be reached."""
        return min(self.keep_recent_tokens, int(window * self.target * TAIL_SHARE_OF_TARGET))

    @model_validator(mode="after")
    def _coherent(self) -> CompressSettings:
        if self.trigger <= self.target:
            raise Impossible(("trigger", "target"), f"trigger ({self.trigger:g}) must be above target "
                             f"({self.target:g}): a compaction brings the prompt from trigger down to target")
        # Left at its default under a lowered trigger it only never fires (a warning, proxy/cli/check.py);
        # set explicitly it is a mistake.
        if self.precompute is not None and self.precompute >= self.trigger and "precompute" in self.model_fields_set:
            raise Impossible(("precompute", "trigger"), f"precompute ({self.precompute:g}) must be below trigger "
                             f"({self.trigger:g}): the summary is written before the prompt crosses trigger "
                             f"(null turns it off)")
        if self.strategy == "facts" and not self.facts:
            raise Impossible(("strategy", "facts"), "strategy facts needs at least one question in facts")
        return self


class ContextReadSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    rounds: int = Field(default=4, ge=0, le=16)  # context_read rounds answered per client request
    max_chars: int = Field(default=20_000, ge=1000)  # characters one context_read answer returns at most


class Guidance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: float = Field(gt=0)  # threshold: a count, or a share of the window for `context`
    text: str  # "" disables the line


class StatusBarSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    agents_only: bool = True  # only requests with tools or tool messages get a status
    role: Literal["user", "system", "developer"] = "user"
    mode: Literal["append", "replace"] = "replace"
    # every this many turns (turn 0, N, 2N, ...) the status states everything (tool counts, todo, errors,
    # elapsed time); between, only the turn, the context use and the warnings. 1, the default: every status is
    # whole - models miscount these from the raw history, and a whole status costs a few dozen tokens
    full_every: int = Field(default=1, ge=1)
    error_pattern: str = DEFAULT_ERROR_PATTERN  # a tool result matching this looks like a failure
    todo: TodoShape = TodoShape()
    repeated_call: Guidance = Guidance(at=3, text="the same call keeps repeating: change approach")
    consecutive_errors: Guidance = Guidance(at=2, text="errors in a row: read the error and diagnose before retrying")
    context: Guidance = Guidance(at=0.8, text="context nearly full: finish the task or save your state")
    # ... instead, where the route compresses: the agent need not hurry, nothing it needs is lost.
    context_compressed: Guidance = Guidance(at=0.8, text="context filling up: the proxy will compact older "
                                            "messages soon; what it removes stays readable by handle, so keep working")

    @field_validator("error_pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        re.compile(v)
        return v

    @model_validator(mode="after")
    def _shares(self) -> StatusBarSettings:
        for name in ("context", "context_compressed"):
            at = getattr(self, name).at
            if at > 1:
                raise Impossible((f"{name}.at",), f"{name}.at ({at:g}) is a share of the window: at most 1, "
                                 f"or the advice never shows")
        return self


class CacheHintsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # auto: "session" when the upstream is OpenAI's API, else off (other servers may reject the field)
    prompt_cache_key: Literal["auto", "session", "tenant", "off"] = "auto"
    breakpoints: Literal["auto", "none", "openai", "anthropic"] = "auto"
    retention: str | None = None  # e.g. "24h": sent as prompt_cache_retention
    max_breakpoints: int = Field(default=4, ge=1)  # Anthropic allows 4 per request, the client's own counted
    # Anthropic-style breakpoints' cache lifetime: null (the provider's default, 5 minutes), "5m" or "1h".
    # A 1h mark is never placed after a shorter-lived one of the client's (the API refuses that order).
    ttl: Literal["5m", "1h"] | None = None
    openai_breakpoint_models: tuple[str, ...] = ("gpt-5.6*",)  # models that cache only at markers
    anthropic_models: tuple[str, ...] = ("claude*", "*/claude*", "anthropic/*")

    @model_validator(mode="after")
    def _anthropic_limit(self) -> CacheHintsSettings:
        if self.breakpoints == "anthropic" and self.max_breakpoints > ANTHROPIC_MAX_BREAKPOINTS:
            raise Impossible(("breakpoints", "max_breakpoints"), f"max_breakpoints ({self.max_breakpoints}) "
                             f"must be at most {ANTHROPIC_MAX_BREAKPOINTS} with breakpoints anthropic: the API "
                             f"refuses a request with more")
        return self


ANTHROPIC_MAX_BREAKPOINTS = 4  # cache_control blocks per request the Messages API accepts

SECTION_MODELS: dict[str, type[BaseModel]] = {
    "offload": OffloadSettings,
    "compress": CompressSettings,
    "context_read": ContextReadSettings,
    "status_bar": StatusBarSettings,
    "cache_hints": CacheHintsSettings,
}


@dataclass(frozen=True)
class Peers:
    """What a transform may know of the other transforms on its route: their settings, typed, None when off.

    The compressor's summary call must send the tools and cache fields the agent's
    request carries (so it hits the agent's cached prefix), and the status bar words
    its context advice by whether compression is on; nothing else crosses over.
    """

    compress: CompressSettings | None = None
    context_read: ContextReadSettings | None = None
    cache_hints: CacheHintsSettings | None = None
