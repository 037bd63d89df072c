"""What one request did, measured once: the definitions every figure of the proxy uses.

The response headers, the session timeline, the store's counters, /metrics,
the dashboard, `ctxproxy stats` and the inspector all read one request's
`Figures`, so they cannot disagree (README, "What the figures mean"):

- `placeholders`: offload placeholders in the prompt as sent - what is in
  effect in this request (a placeholder is in effect in every later request
  too, so this is never summed);
- `offloads_new`: the contents this request stored (distinct handles): an
  offload is counted once, by the request that stored it;
- `client_tokens` / `sent_tokens`: prompt tokens of the request as the client
  sent it and as the provider got it (its first call; hidden read-back rounds
  are usage, not savings), both by the proxy's own count (proxy/tokens/counter.py:
  messages, tool definitions and the top-level system prompt; `sent_tokens` is
  `Conversation.prompt_tokens`, the size the status bar states and the headers
  `x-ctxproxy-prompt-tokens` / `-tokens-after` carry); `reserve`, the answer's
  `max_tokens`, is apart from both;
- `saved` = client_tokens - sent_tokens, split exactly into
  `saved_offload + saved_compress - added` by aligning the two message lists:
  each message the proxy wrote is charged with what it replaced, the status
  bar and the read tool are what the proxy added;
- `compactions`: compaction records this request was the first to send, each
  counted once (it wrote them, or a count_tokens did: proxy/rewrite/first_send.py);
  `removed`: the tokens they took out of the prompt, so the prompt without them
  was `sent_tokens + removed` (`x-ctxproxy-tokens-before`).

Pure computation on what the request already holds (digests and counts the
accounting trace computed); it never changes what is sent upstream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.accounting.prefix_check import PrefixTrace
from proxy.request import Conversation
from proxy.request.events import Compacted, Degraded, Offloaded
from proxy.rewrite.marks import ARCHIVE, CLEARED, OFFLOAD, REWRITTEN, STATUS, SUMMARY, SYNTHETIC, legacy_kind
from proxy.tokens.counter import default_counter
from proxy.tokens.prefix import common_prefix

CATEGORY = {OFFLOAD: "offload", CLEARED: "compress", SUMMARY: "compress", ARCHIVE: "compress",
            SYNTHETIC: "compress", STATUS: "added", REWRITTEN: "added"}
GIVEN_KINDS = frozenset({OFFLOAD, CLEARED})  # placeholders whose handle counts for the read-back rate
_INSERTED = frozenset({STATUS, SYNTHETIC})  # written beside the client's messages, replacing none of them

# A segment of the prompt as sent, in order:
#   ("c", start, stop)                 client messages [start, stop) sent as they were
#   ("p", pos, kind, start, stop)      sent message `pos`, written by the proxy, in place of client [start, stop)
#   ("x", start, stop)                 client messages [start, stop) the proxy left out, replaced by nothing
Segment = tuple[Literal["c", "x"], int, int] | tuple[Literal["p"], int, str, int, int]


def written(conv: Conversation, pos: int) -> tuple[str, str | None]:
    """What the message sent at `pos` is and the handle it names, as the transform that wrote it said
    (Conversation.wrote); a message nobody said is one the proxy rewrote otherwise."""
    return conv.written_at(pos) or (REWRITTEN, None)


def align(kind_at: Callable[[int], str], client: Sequence[bytes], sent: Sequence[bytes]) -> list[Segment]:
    """The prompt as sent, segment by segment, against the client's messages (by digest).

    Runs the client's messages share with what was sent are found in C; between
    two runs, the sent messages are the proxy's and stand for the client's
    messages skipped there: one for one when they match in number (offload and
    cleared placeholders), else the first takes them all (a summary, an archive
    note). Status bars and synthetic tool results replace nothing.
    """
    out: list[Segment] = []
    i = j = 0
    n, m = len(sent), len(client)
    members: set[bytes] | None = None  # the client's digests, once the lists first differ
    while i < n or j < m:
        k = common_prefix(sent, client, i, j) if i < n else 0
        if k:
            out.append(("c", j, j + k))
            i, j = i + k, j + k
            continue
        if members is None:
            members = set(client)
        start, anchor = i, m
        while i < n:
            if sent[i] in members:  # else certainly the proxy's: no scan of the client's list
                try:
                    anchor = client.index(sent[i], j)
                    break
                except ValueError:  # only earlier in the client's list: not where it continues
                    pass
            i += 1
        out += _group(kind_at, range(start, i), j, anchor)
        j = anchor
    return out


def _group(kind_at: Callable[[int], str], positions: range, start: int, stop: int) -> list[Segment]:
    kinds = [kind_at(p) for p in positions]
    replacing = [p for p, k in zip(positions, kinds) if k not in _INSERTED]
    span = stop - start
    out: list[Segment] = []
    if span and not replacing:
        out.append(("x", start, stop))
    for p, k in zip(positions, kinds):
        if replacing and len(replacing) == span and k not in _INSERTED:
            r = start + replacing.index(p)
            out.append(("p", p, k, r, r + 1))
        elif replacing and p == replacing[0]:
            out.append(("p", p, k, start, stop))
        else:
            out.append(("p", p, k, start, start))
    return out


@dataclass
class Figures:
    """One request's figures (see the module docstring for what each means)."""

    segments: list[Segment]
    client_counts: list[int]
    client_tokens: int
    sent_tokens: int
    client_tool_tokens: int
    sent_tool_tokens: int
    saved_offload: int
    saved_compress: int
    placeholders: int
    given: list[str]  # handles of the offload and cleared placeholders in the prompt, in order, distinct
    offloads_new: list[str]
    compactions: list[str]  # layers, in order
    compaction_detail: dict[str, Any] = field(default_factory=dict)  # the last one's record
    removed: int = 0  # tokens this request's compactions took out of the prompt
    reserve: int = 0  # the answer's max_tokens: must fit in the window beside the prompt, not part of it
    degraded: bool = False  # forwarded unmodified: the store was unavailable

    @property
    def saved(self) -> int:
        return self.client_tokens - self.sent_tokens

    @property
    def added(self) -> int:
        """Tokens the proxy added (status bars, the read tool): what makes the split add up exactly."""
        return self.saved_offload + self.saved_compress - self.saved

    @property
    def compacted(self) -> str | None:
        return self.compactions[-1] if self.compactions else None

    def compaction_sizes(self) -> dict[str, int | None]:
        """The prompt without this request's compactions and with them (as sent): one definition of its size."""
        if not self.compactions:
            return {"tokens_before": None, "tokens_after": None}
        return {"tokens_before": self.sent_tokens + self.removed, "tokens_after": self.sent_tokens}


def client_tools(conv: Conversation) -> list[Any]:
    """The client's tool definitions: the ones sent, less the read tool the proxy appended last."""
    tools = conv.tools or []
    return tools[:-1] if conv.read_tool is not None and tools else tools


def measure(conv: Conversation, trace: PrefixTrace) -> Figures:
    """The request's figures, from the conversation as sent and the trace accounting computed for it.

    Counting the client's messages goes through the request's message facts,
    so with the session's memo only the messages new in this request are
    tokenized (and the memo keeps their counts for the next one).
    """
    client_counts = conv.counts(conv.client_messages)
    client_tool_tokens = default_counter.count_tools(client_tools(conv), conv.model)
    system = conv.prefix_tokens()  # the top-level system prompt: the client's and the sent one are the same
    segments = align(lambda pos: written(conv, pos)[0], trace.raw, trace.sent)
    saved = {"offload": 0, "compress": 0, "added": 0}
    placeholders = 0
    given: dict[str, None] = {}  # handles in order, distinct
    for seg in segments:
        if seg[0] == "p":
            _, pos, kind, start, stop = seg
            saved[CATEGORY[kind]] += sum(client_counts[start:stop]) - trace.counts[pos]
            placeholders += kind == OFFLOAD
            if kind in GIVEN_KINDS:
                h = written(conv, pos)[1]
                if h:
                    given[h] = None
        elif seg[0] == "x":
            _, start, stop = seg
            # statuses a client sent back (its copy of the proxy's text), left out: they were the proxy's to begin with
            statuses = all(legacy_kind(conv.wire.first_text(m)) == STATUS for m in conv.client_messages[start:stop])
            saved["added" if statuses else "compress"] += sum(client_counts[start:stop])
    events = conv.earlier_events + conv.events
    new = dict.fromkeys(e.handle for e in events if isinstance(e, Offloaded) and e.new)
    compacts = [e.as_record() for e in events if isinstance(e, Compacted)]
    return Figures(segments=segments, client_counts=client_counts,
                   client_tokens=sum(client_counts) + client_tool_tokens + system, sent_tokens=trace.prompt,
                   client_tool_tokens=client_tool_tokens, sent_tool_tokens=trace.tool_tokens - system,
                   saved_offload=saved["offload"], saved_compress=saved["compress"], placeholders=placeholders,
                   given=list(given), offloads_new=list(new), compactions=[d["layer"] for d in compacts],
                   compaction_detail=compacts[-1] if compacts else {},
                   removed=sum(d["before"] - d["after"] for d in compacts),
                   reserve=conv.wire.output_reserve(conv.body),
                   degraded=any(isinstance(e, Degraded) for e in conv.events))


def carry_events(old: Conversation, new: Conversation) -> None:
    """A request run through the pipeline again (a learned window): what the first run stored still counts."""
    new.earlier_events = [*old.earlier_events, *old.events]
