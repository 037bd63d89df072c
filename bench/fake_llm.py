"""A deterministic stand-in for the LLM behind the proxies' own calls (summaries, notes), for the replay.

The mock provider (tests/mock_upstream.py) answers "ok" to everything. That is
right for the agent's own requests (the replay ignores the answer), but a
proxy that summarizes history would then put "ok" where a summary belongs,
which makes its prompts unrealistically small. `respond(body)` is queued as
the mock's script callable (public API: `mock.script(respond, ...)`) and
answers:

* ctxproxy's summarizer call (system prompt "You maintain the working memory
  of a long-running autonomous agent", proxy/rewrite/compress/summarizer.py) with a markdown
  summary in the seven requested sections;
* the same in ctxproxy's cached shape (the agent's conversation re-sent,
  closed by an instruction opening with "<ctxproxy_compaction>"): the span is
  every message after the head (system + first user message) above it;
* ctxproxy's `facts` strategy questions ("Answer one question about the
  transcript ...") with the same kind of digest, shorter;
* ctxkeeper's notes calls: the in-place one (its request ends with
  "[[Message from the context keeper, not part of the task]] Every turn
  above ...") in the NEW RULES / CHANGES / OPEN layout, and the full rewrite
  ("=== TURNS BEING MOVED OUT ===") in the RULES / STATE / OPEN layout;
* everything else with "ok", as the mock does.

Messages API bodies (top-level ``system``, content blocks) likewise
(``bench/replay/messages_items.to_messages``: system a leading system message,
tool results tool messages, ``tool_use`` blocks tool calls): ctxproxy's
instruction is then the last text block of the last user message, which may
also carry the last tool results (they read as the tool messages before it).
Responses API bodies (``input`` items, ``instructions``) are read as the
chat messages they stand for (``bench/replay/responses_items.to_messages``:
instructions a leading system message, calls gathered, outputs as tool
messages), so the same rules apply: ctxproxy's instruction is the last
``input`` item, its transcript-shape call a system and a user message (the
transcript in the last user message). The answer is text either way; the
mock wraps it in the API's reply shape.

What the fake writes is built only from what the call sends: the FIRST LINE of
each message of the part being compacted (capped at LINE_CHARS characters),
labelled with its role, plus the lines of the previous summary or NOTES the
call carries (folded in, as the prompts ask). When the lines exceed
SUMMARY_TOKENS (o200k tokens, ~400-600 tokens with the headings), the newest are
kept and the oldest age out. Nothing else is added: in particular no
identifier is copied from anywhere but those first lines, so identifiers that
survive a compaction do so because the proxy's own mechanism (ctxproxy's
code-written identifier list, ctxkeeper's archive, ...) kept them, or because
they happened to be on a first line, as a real summary would keep some.

Deterministic: the same request always gets the same answer.
"""

from __future__ import annotations

import re
from typing import Any

import tiktoken

from bench.identifiers import head_end
from bench.replay import messages_items
from bench.replay.responses_items import to_messages

SUMMARY_TOKENS = 500  # budget of the digest lines (headings come on top: ~520-560 tokens in all)
LINE_CHARS = 160  # a message's first line, at most this many characters

CTXPROXY_SUMMARY = "You maintain the working memory of a long-running autonomous agent"
CTXPROXY_FACT = "Answer one question about the transcript of an agent's work"
CTXPROXY_CACHED = "<ctxproxy_compaction>"  # the instruction closing ctxproxy's cached-shape call
CTXPROXY_SECTIONS = ("Goal and constraints", "Decisions and why", "Files and artifacts", "Verified state",
                     "Open TODOs", "Approaches that failed", "Next step")
KEEPER_INPLACE = "[[Message from the context keeper, not part of the task]] Every turn above"
KEEPER_FULL = "=== TURNS BEING MOVED OUT ==="
KEEPER_PIN = "[[NOTES kept by the context keeper:"
KEEPER_OPEN = "[[Still open, kept in view by the context keeper"

_enc: tiktoken.Encoding | None = None


def _tokens(text: str) -> int:
    global _enc
    if _enc is None:
        try:  # the mock's offline o200k (no download), else tiktoken's own
            from tests import mock_upstream as mu
            _enc = mu.encoding()
        except Exception:  # pragma: no cover - outside the repo
            _enc = tiktoken.get_encoding("o200k_base")
    return len(_enc.encode_ordinary(text))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _message_text(m: dict[str, Any]) -> str:
    parts = [_text(m.get("content"))]
    for c in m.get("tool_calls") or ():
        fn = (c.get("function") or {}) if isinstance(c, dict) else {}
        parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n".join(p for p in parts if p)


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = " ".join(line.split())
        if line:
            return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…"
    return ""


def messages_of(body: dict[str, Any]) -> list[Any]:
    """A request's conversation as chat messages: chat's `messages`, or a Responses body's `input` or a Messages
    body read as them."""
    if "messages" not in body and "input" in body:
        return to_messages(body["input"], body.get("instructions"))
    if messages_items.is_messages_body(body):
        return messages_items.to_messages(body)
    msgs = body.get("messages") or []
    return msgs if isinstance(msgs, list) else []


def kind(body: Any) -> str | None:
    """Which proxy-own call this request is ('summary', 'facts', 'notes-inplace', 'notes-full'),
    None for the agent's. Chat, Responses or Messages bodies alike."""
    if not isinstance(body, dict):
        return None
    msgs = messages_of(body)
    if not isinstance(msgs, list) or not msgs:
        return None
    first = _text(msgs[0].get("content")) if isinstance(msgs[0], dict) else ""
    if msgs[0].get("role") == "system" and first.startswith(CTXPROXY_SUMMARY):
        return "summary"
    if msgs[0].get("role") == "system" and first.startswith(CTXPROXY_FACT):
        return "facts"
    last = msgs[-1] if isinstance(msgs[-1], dict) else {}
    if last.get("role") == "user" and _text(last.get("content")).startswith(CTXPROXY_CACHED):
        return "facts" if "\nQuestion: " in _text(last.get("content")) else "summary"
    for m in msgs:
        if isinstance(m, dict) and m.get("role") == "user":
            t = _text(m.get("content"))
            if t.startswith(KEEPER_INPLACE):
                return "notes-inplace"
            if KEEPER_FULL in t:
                return "notes-full"
    return None


def _newest_within(lines: list[str], budget: int = SUMMARY_TOKENS) -> list[str]:
    """The newest lines whose tokens fit in `budget`, in their original order."""
    kept, used = [], 0
    for line in reversed(lines):
        n = _tokens(line) + 1
        if used + n > budget:
            break
        kept.append(line)
        used += n
    return kept[::-1]


# --------------------------------------------------------------------------- ctxproxy

# the transcript's section headings: chat roles and tool results, and in the Responses API the item types the
# proxy labels non-message items with (its transcript says "### function_call_output", without the tool's name)
_SECTION = re.compile(r"^### (user|assistant|system|developer|tool result \([^)\n]*\)|tool|function_call_output|"
                      r"custom_tool_call_output|function_call|custom_tool_call|reasoning|\?)\n", re.M)


def _span(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of each message of the span the call asks about, in either of ctxproxy's shapes."""
    msgs = messages_of(body)
    if not _text(msgs[-1].get("content")).startswith(CTXPROXY_CACHED):
        return _sections(_transcript(msgs))
    # the cached shape: every message after the head (system + first user message), up to the instruction
    names = {c.get("id"): (c.get("function") or {}).get("name") for m in msgs for c in m.get("tool_calls") or ()
             if isinstance(c, dict)}
    return [(f"tool result ({names.get(m.get('tool_call_id')) or 'tool'})" if m.get("role") == "tool"
             else m.get("role", "?"), _message_text(m)) for m in msgs[head_end(msgs):-1]]


def _transcript(msgs: list[Any]) -> str:
    """The transcript of a transcript-shape call: in its (last) user message, the one after the system prompt."""
    user = next((_text(m.get("content")) for m in reversed(msgs) if m.get("role") == "user"), "")
    m = re.search(r"<transcript>\n(.*)\n</transcript>", user, re.S)
    return m.group(1) if m else user


def _sections(transcript: str) -> list[tuple[str, str]]:
    heads = list(_SECTION.finditer(transcript))
    out = []
    for k, h in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(transcript)
        out.append((h.group(1), transcript[h.end():end].strip("\n")))
    return out


def _summary_lines(sections: list[tuple[str, str]]) -> list[str]:
    lines: list[str] = []
    for label, text in sections:
        if text.lstrip().startswith("<context_summary>"):
            # an earlier summary: fold its digest lines in (not its identifier list, which is code-written)
            body = text.split("\n## Identifiers", 1)[0]
            lines += [ln[2:] for ln in body.splitlines() if ln.startswith("- ")]
            continue
        line = first_line(text)
        if line:
            lines.append(f"{label}: {line}")
    return lines


def ctxproxy_summary(body: dict[str, Any]) -> str:
    lines = _newest_within(_summary_lines(_span(body)))
    if not lines:
        lines = ["(nothing recorded)"]
    n = len(CTXPROXY_SECTIONS)
    per = -(-len(lines) // n)
    out = []
    for k, name in enumerate(CTXPROXY_SECTIONS):
        chunk = lines[k * per:(k + 1) * per]
        out.append(f"## {name}")
        out += [f"- {ln}" for ln in chunk] or ["- (none)"]
    return "\n".join(out)


def ctxproxy_fact(body: dict[str, Any]) -> str:
    lines = _newest_within(_summary_lines(_span(body)), SUMMARY_TOKENS // 4)
    return "\n".join(f"- {ln}" for ln in lines) or "none"


# --------------------------------------------------------------------------- ctxkeeper

def _letters(n: int) -> str:
    """A name without digits (ctxkeeper's full rewrite puts back lost STATE names that contain one)."""
    s = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        s = chr(97 + r) + s
    return "m" + s


def _index(name: str) -> int:
    """Inverse of _letters (-1 for a name it did not make)."""
    if not re.fullmatch(r"m[a-z]+", name):
        return -1
    n = 0
    for ch in name[1:]:
        n = n * 26 + (ord(ch) - 96)
    return n - 1


def _keeper_value(line: str) -> str:
    # ctxkeeper reads `name: value` lines and checks working written as `a + b = c`: a first line of code with
    # an "=" in it is not working, so it is written without one (a model following the layout would do the same)
    return line.replace("=", "~")


def _state_lines(notes: str) -> list[str]:
    out, on = [], False
    for ln in notes.splitlines():
        head = ln.strip().strip("#*_ ").rstrip(":").upper()
        if head in ("RULES", "STATE", "OPEN"):
            on = head == "STATE"
        elif on and ln.strip():
            out.append(ln.strip())
    return out


def keeper_inplace(body: dict[str, Any]) -> str:
    msgs = messages_of(body)
    at = max(i for i, m in enumerate(msgs)
             if m.get("role") == "user" and _text(m.get("content")).startswith(KEEPER_INPLACE))
    start, archived, notes = 0, 0, ""
    for i, m in enumerate(msgs[:at]):
        t = _text(m.get("content"))
        if m.get("role") == "user" and t.startswith(KEEPER_PIN):
            start, notes = i + 1, t.split("\n", 1)[1] if "\n" in t else ""
            got = re.match(r"\[\[NOTES kept by the context keeper: (\d+) earlier", t)
            archived = int(got.group(1)) if got else 0
        elif m.get("role") == "user" and t.startswith(KEEPER_OPEN):
            start = i + 1
    if not start:  # no cut yet: the turns start after the opening messages (system + first user message)
        while start < at and msgs[start].get("role") in ("system", "developer"):
            start += 1
        if start < at and msgs[start].get("role") == "user":
            start += 1
    new = []
    for j, m in enumerate(msgs[start:at]):
        line = first_line(_message_text(m))
        if line:
            new.append(f"{_letters(archived + j)}: {m.get('role')}: {_keeper_value(line)}")
    # keep STATE near the same budget as every other summary: the oldest lines are removed
    old = [ln for ln in _state_lines(notes) if not ln.endswith(": removed")]
    keep = set(_newest_within(old + new))
    removed = [f"{ln.split(':', 1)[0].lstrip('-* ')}: removed" for ln in old if ln not in keep]
    changes = removed + [ln for ln in new if ln in keep] or ["(none)"]
    return "NEW RULES\n(none)\nCHANGES\n" + "\n".join(changes) + "\nOPEN\n(none)"


def keeper_full(body: dict[str, Any]) -> str:
    user = next(_text(m.get("content")) for m in messages_of(body)
                if m.get("role") == "user" and KEEPER_FULL in _text(m.get("content")))
    notes = user.split("=== CURRENT NOTES ===\n", 1)[-1].split("\n\n=== ", 1)[0]
    turns = user.split(KEEPER_FULL + "\n", 1)[1].split("\n\n=== END OF THE TURNS ===", 1)[0]
    old = [ln.lstrip("-* ") for ln in _state_lines(notes) if not ln.endswith(": removed")]
    base = 1 + max((_index(ln.split(":", 1)[0]) for ln in _state_lines(notes)), default=-1)
    new = []
    pieces = re.split(r"^(SYSTEM|USER|ASSISTANT|TOOL)(?: \(result of call [^)]*\))?: ", turns, flags=re.M)
    for j in range(1, len(pieces) - 1, 2):
        line = first_line(pieces[j + 1])
        if line:
            new.append(f"{_letters(base + len(new))}: {pieces[j].lower()}: {_keeper_value(line)}")
    lines = _newest_within(old + new)
    return "RULES\n(none)\nSTATE\n" + "\n".join(lines or ["(none)"]) + "\nOPEN\n(none)"


# --------------------------------------------------------------------------- entry point

def respond(body: dict[str, Any]) -> str:
    """The mock's answer to one request (script callable)."""
    k = kind(body)
    if k == "summary":
        return ctxproxy_summary(body)
    if k == "facts":
        return ctxproxy_fact(body)
    if k == "notes-inplace":
        return keeper_inplace(body)
    if k == "notes-full":
        return keeper_full(body)
    return "ok"
