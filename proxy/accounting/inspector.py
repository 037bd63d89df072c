"""The inspector: for each request of a session, what went upstream, against what the client sent.

Stored compactly per request (one entry in the session's inspect log, appended
with its timeline entry): for every client message its index, role, token
count and digest only; for every message the proxy wrote (placeholders,
summaries, archive notes, status bars) its kind, role, count, digest, handle
and which client messages it stands for; the tools and top-level fields the
proxy added; the hidden read-back rounds. The text the proxy wrote is kept in
the session's texts log, once per distinct message (a status or placeholder
in effect for 300 requests is stored once). The client's own content is
stored only with `logging.log_content: true` (in the same texts log).

Readers get `expand()`: the prompt as sent, message by message, each proxy
message in place with the text that was sent and the client messages it
replaced.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from proxy.accounting.figures import Figures, client_tools, written
from proxy.accounting.prefix_check import PrefixTrace
from proxy.request import Conversation
from proxy.tokens.counter import default_counter, message_digest
from proxy.wire.codec import Codec, Item

DIGEST_HEX = 16  # hex characters of a message digest kept per message (64 bits)
_ROLE_CODES = {"system": "s", "developer": "d", "user": "u", "assistant": "a", "tool": "t", "function": "f",
               "tool_result": "r"}  # the last: a Messages tool_result block, lifted out of its user turn
_ROLES = {v: k for k, v in _ROLE_CODES.items()}
_FIELDS = ("prompt_cache_key", "prompt_cache_retention", "stream_options")  # top-level fields the proxy may add
_SHORT = operator.itemgetter(slice(0, DIGEST_HEX // 2))  # the digest bytes kept
_ANSWER_HEAD_CHARS = 300  # the first line of a read-back answer kept (the proxy's own "[handle: lines ...]")


def short(digest: bytes) -> str:
    return digest.hex()[:DIGEST_HEX]


def _tool_calls(wire: Codec, message: Item) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in wire.calls(message)]


def read_rounds(wire: Codec, rounds_messages: Sequence[Item], usages: Sequence[Any], model: Any
                ) -> list[dict[str, Any]]:
    """The hidden read-back rounds: the model's read calls and the proxy's answers, round by round."""
    out: list[dict[str, Any]] = []
    for m in rounds_messages:
        if wire.role(m) == "assistant":
            u = usages[len(out)] if len(out) < len(usages) else None
            out.append({"calls": _tool_calls(wire, m), "answers": [],
                        "usage": {"prompt": u.prompt, "completion": u.completion, "cached": u.cached} if u else None})
        elif out and wire.role(m) == "tool":
            text = wire.text(m) or ""
            out[-1]["answers"].append({"tool_call_id": wire.answers(m),
                                       "tokens": default_counter.count_message(m, model),
                                       "digest": short(message_digest(m)),
                                       "head": text.split("\n", 1)[0][:_ANSWER_HEAD_CHARS]})
    return out


def roles(conv: Conversation) -> str:
    """The role code of each client message (a walk over all of them: done where the request is measured)."""
    return "".join(map(_ROLE_CODES.get, map(conv.wire.label, conv.client_messages), repeat("?")))


def record(request_id: str, conv: Conversation, trace: PrefixTrace, figures: Figures,
           rounds: list[dict[str, Any]], client_roles: str | None = None) -> dict[str, Any]:
    """The compact inspector record of one request (`client_roles`: `roles(conv)`, when already known)."""
    codes = roles(conv) if client_roles is None else client_roles
    sent = conv.messages
    segments: list[list[Any]] = []
    for seg in figures.segments:
        if seg[0] == "p":
            _, pos, kind, start, stop = seg
            m = conv.unmarked.get(pos, sent[pos])
            segments.append(["p", pos, kind, start, stop, conv.wire.label(m), trace.counts[pos],
                             short(trace.sent[pos]), written(conv, pos)[1]])
        else:
            segments.append(list(seg))
    raw = conv.raw
    tools = conv.tools or []
    fields = {k: conv.body[k] for k in _FIELDS if k in conv.body and f'"{k}"'.encode() not in raw}
    if "stream_options" in conv.body and b'"include_usage"' not in raw:
        fields["stream_options"] = conv.body["stream_options"]
    return {"id": request_id, "roles": codes, "tokens": figures.client_counts,
            "digests": b"".join(map(_SHORT, trace.raw)).hex(), "segments": segments,
            "marks": sorted(conv.unmarked),
            "tools": {"client": conv.wire.tool_names(client_tools(conv)), "client_tokens": figures.client_tool_tokens,
                      "sent": conv.wire.tool_names(tools), "sent_tokens": figures.sent_tool_tokens},
            # the prompt's size as the headers and the status bar give it; the answer's reserve beside it
            "prompt": {"client": figures.client_tokens, "sent": figures.sent_tokens, "system": conv.prefix_tokens(),
                       "output_reserve": figures.reserve},
            "fields": fields, "rounds": rounds}


def new_texts(conv: Conversation, trace: PrefixTrace, figures: Figures, previous: PrefixTrace | None,
              log_content: bool, rounds_messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Texts the inspector will need that the session's previous request did not already store.

    Messages the proxy wrote, and, with `log_content`, the client's messages and
    the read-back answers, each keyed by its digest.
    """
    seen = set(previous.sent) if previous is not None else set()
    out: dict[str, Any] = {}
    unmarked = conv.unmarked
    for seg in figures.segments:
        if seg[0] == "p" and trace.sent[seg[1]] not in seen:
            out[short(trace.sent[seg[1]])] = unmarked.get(seg[1], conv.messages[seg[1]])
    if log_content:
        known = set(previous.raw) if previous is not None else set()
        for d, m in zip(trace.raw, conv.client_messages):
            if d not in known:
                out[short(d)] = m
        for m in rounds_messages:
            out[short(conv.digest(m))] = m
    return [{"d": d, "m": m} for d, m in out.items()]


def _client_row(rec: dict[str, Any], i: int, texts: dict[str, Any]) -> dict[str, Any]:
    d = rec["digests"][i * DIGEST_HEX:(i + 1) * DIGEST_HEX]
    row = {"index": i, "role": _ROLES.get(rec["roles"][i], "?"), "tokens": rec["tokens"][i], "digest": d}
    if d in texts:
        row["message"] = texts[d]
    return row


def expand(rec: dict[str, Any], texts: dict[str, Any]) -> dict[str, Any]:
    """The record for people: every message sent, in order, proxy-written ones in place of what they replaced."""
    messages: list[dict[str, Any]] = []
    marks = set(rec.get("marks") or ())
    for seg in rec["segments"]:
        if seg[0] == "c":
            for i in range(seg[1], seg[2]):
                row = {"position": len(messages), "source": "client", "kind": "client", **_client_row(rec, i, texts)}
                messages.append(row)
        elif seg[0] == "x":
            messages.append({"position": None, "source": "proxy", "kind": "dropped", "role": None, "tokens": 0,
                             "replaces": [_client_row(rec, i, texts) for i in range(seg[1], seg[2])]})
        else:
            _, pos, kind, start, stop, role, tokens, digest, handle = seg
            row = {"position": pos, "source": "proxy", "kind": kind, "role": role, "tokens": tokens,
                   "digest": digest, "handle": handle, "message": texts.get(digest),
                   "replaces": [_client_row(rec, i, texts) for i in range(start, stop)]}
            messages.append(row)
    for row in messages:
        if row["position"] is not None and row["position"] in marks:
            row["cache_marker"] = True
    for rnd in rec["rounds"]:
        for answer in rnd["answers"]:
            if answer.get("digest") in texts:  # the whole answer, when the client's content is recorded
                answer["message"] = texts[answer["digest"]]
    return {"messages": messages, "tools": rec["tools"], "prompt": rec.get("prompt"), "fields": rec["fields"],
            "rounds": rec["rounds"],
            "client_messages": len(rec["roles"]),
            "client_content": any(d in texts for d in _digests(rec))}


def _digests(rec: dict[str, Any]) -> list[str]:
    s = rec["digests"]
    return [s[i:i + DIGEST_HEX] for i in range(0, len(s), DIGEST_HEX)]
