"""How much of a request repeats the previous request of its session, and why a cached prefix broke.

Providers cache byte-identical prefixes (tool definitions first, then messages).
The proxy knows what it sent last time for a session, so it can say what
*could* have been cached (a per-message hash chain, no re-tokenizing) and, when
the shared prefix falls well short of the previous prompt, whose change broke
it: the client's (system prompt, tools, an edited or truncated history) or the
proxy's own (a compaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.tokens.prefix import common_prefix

# A break costs less than this many tokens (or share of the previous prompt): not worth a cause.
MIN_LOST_TOKENS = 256
MIN_LOST_SHARE = 0.05


@dataclass
class PrefixTrace:
    """One request of a session, as the client sent it and as the provider received it."""

    raw: list[bytes]  # message digests, client's view
    system: int  # leading system/developer messages in the client's view
    sent: list[bytes]  # message digests, as sent upstream
    counts: list[int]  # tokens of each sent message
    tools: bytes  # digest of the tool list sent ("" if none)
    tool_names: list[str]
    tool_tokens: int
    compaction: int  # the compaction version applied
    prefix: bytes = b""  # digest of the top-level system prompt (Messages' system, Responses' instructions)

    @property
    def prompt(self) -> int:
        return self.tool_tokens + sum(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {"raw": list(map(bytes.hex, self.raw)), "system": self.system, "sent": list(map(bytes.hex, self.sent)),
                "counts": self.counts, "tools": self.tools.hex(), "tool_names": self.tool_names,
                "tool_tokens": self.tool_tokens, "compaction": self.compaction, "prefix": self.prefix.hex()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PrefixTrace:
        return cls([bytes.fromhex(x) for x in d["raw"]], d["system"], [bytes.fromhex(x) for x in d["sent"]],
                   d["counts"], bytes.fromhex(d["tools"]), d["tool_names"], d["tool_tokens"], d["compaction"],
                   bytes.fromhex(d.get("prefix", "")))


@dataclass(frozen=True)
class PrefixCheck:
    cacheable: int  # tokens this request shares byte for byte with the previous one of its session
    previous: int  # tokens of the previous prompt (0: the session had none for this model)
    cause: str | None  # why the shared prefix fell short, when it did
    measured: bool = True  # False: the prompt is not all in the request (the provider holds the history)


UNMEASURED = PrefixCheck(0, 0, None, measured=False)


def _tools_cause(prev: PrefixTrace, cur: PrefixTrace) -> str:
    if sorted(prev.tool_names) == sorted(cur.tool_names):
        return "tools reordered" if prev.tool_names != cur.tool_names else "tool definitions changed"
    if set(prev.tool_names) < set(cur.tool_names):
        return "tools added"
    if set(cur.tool_names) < set(prev.tool_names):
        return "tools removed"
    return "tools changed"


def compare(prev: PrefixTrace | None, cur: PrefixTrace) -> PrefixCheck:
    if prev is None:
        return PrefixCheck(0, 0, None)
    if prev.tools != cur.tools:
        return PrefixCheck(0, prev.prompt, _tools_cause(prev, cur))
    if prev.prefix != cur.prefix:
        return PrefixCheck(0, prev.prompt, "system prompt changed")
    common = common_prefix(prev.sent, cur.sent)
    cacheable = cur.tool_tokens + sum(cur.counts[:common])
    lost = prev.prompt - cacheable
    if common == len(prev.sent) or lost < max(MIN_LOST_TOKENS, MIN_LOST_SHARE * prev.prompt):
        return PrefixCheck(cacheable, prev.prompt, None)
    raw_common = common_prefix(prev.raw, cur.raw)
    if raw_common < len(prev.raw):
        if raw_common < max(prev.system, cur.system):
            cause = "system prompt changed"
        elif raw_common == len(cur.raw):
            cause = "history truncated by the client"
        else:
            cause = "earlier message edited by the client"
    elif cur.compaction != prev.compaction:
        cause = "proxy compaction"
    else:
        cause = "proxy rewrite"
    return PrefixCheck(cacheable, prev.prompt, cause)


def expiry_cause(check: PrefixCheck, cached: int | None, min_cacheable: int = 1024) -> str | None:
    """Prefix intact, yet the provider cached nothing: its cache expired or evicted the prefix."""
    if check.cause is None and cached == 0 and check.cacheable >= min_cacheable:
        return "cache expired (prefix intact, nothing cached)"
    return check.cause


def hidden_cacheable(first_prompt: int, added: Sequence[int], sent: Sequence[int], first_items: int,
                     calls: int) -> int:
    """What a turn's hidden read-back calls could reuse from the provider's cache: each call repeats the
    whole prompt of the call before it (the read loop only appends), so call k could reuse all of call k-1's.

    `first_prompt`: the tokens of the turn's first call; `added`: the counts of the items the rounds
    appended; `sent[j]`: how many items hidden call j+1 sent, of which the first call's were `first_items`;
    `calls`: hidden calls the provider answered. Summed, as the usage of those calls is summed.
    """
    prompts = [first_prompt]
    for items in sent[:max(0, calls - 1)]:
        prompts.append(first_prompt + sum(added[:items - first_items]))
    return sum(prompts[:calls])
