"""How the simulator answers the proxy's own calls: summaries and facts extracted from the transcript by code.

No model writes them: lines are picked from the span by what they say (files,
checks that passed, failures, what is still to do), so a replay costs nothing and
is the same every run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.replay.sim_prompt import _LINE_CHARS, _SECTION_LINES, ORDINARY_ANSWER, SUMMARY_NOTE, _content_text
from proxy.rewrite.compress import summarizer
from proxy.rewrite.compress.history import head_end
from proxy.wire.chat.codec import CHAT
from proxy.wire.codec import Codec

# --------------------------------------------------------------------------- the proxy's own calls

_PATH = re.compile(r"(?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|pyi|js|ts|tsx|json|md|txt|ya?ml|toml|cfg|"
                   r"ini|c|h|cc|cpp|go|rs|java|rb|sh|html|css|sql|lock|log|pony)\b")
_VERIFIED = re.compile(r"\b(pass(?:ed|es)?|ok|success(?:ful(?:ly)?)?|works?|fixed|confirmed|resolved|"
                       r"completed?)\b", re.I)
_FAILED = re.compile(r"\b(error|errors|fail(?:ed|s|ure)?|exception|traceback|not found|no such|denied|invalid|"
                     r"cannot|unable)\b", re.I)
_TODO = re.compile(r"\b(todo|need to|needs to|should|next|remaining|still|will)\b", re.I)
_STOP = frozenset("what which where when how does did have been were with that this from into them they "
                  "there their about answer only question transcript tersely keeping".split())


# A Responses transcript labels items by type: calls are the assistant's, their outputs tool results.
_ASSISTANT_LABELS = frozenset({"assistant", "function_call", "custom_tool_call"})
_RESULT_LABELS = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass
class _Block:
    label: str  # "system", "user", "assistant", "tool result (name)", ...
    lines: list[str]


def _transcript(text: str) -> list[_Block]:
    """The summarizer's transcript (proxy/rewrite/compress/summarizer.py render()) back into labelled blocks."""
    text = text.split("<transcript>", 1)[-1].split("</transcript>", 1)[0]
    blocks: list[_Block] = []
    for line in text.splitlines():
        if line.startswith("### "):
            blocks.append(_Block(line[4:].strip(), []))
        elif blocks:
            stripped = line.strip()
            if stripped and not stripped.startswith("[…"):
                blocks[-1].lines.append(stripped)
    return blocks


def _cut(line: str) -> str:
    return line if len(line) <= _LINE_CHARS else line[:_LINE_CHARS - 1] + "…"


def _pick(lines: list[str], limit: int = _SECTION_LINES, newest: bool = False) -> list[str]:
    seen: dict[str, None] = {}
    for line in lines:
        seen.setdefault(_cut(line), None)
    out = list(seen)
    return out[-limit:] if newest else out[:limit]


def extractive_summary(transcript: str) -> str:
    """A deterministic stand-in for ctxproxy's summary: each requested heading with lines copied from the transcript."""
    blocks = _transcript(transcript)
    user = [b for b in blocks if b.label == "user" and not (b.lines and b.lines[0].startswith("<agent_status>"))]
    assistant = [b for b in blocks if b.label in _ASSISTANT_LABELS]
    tools = [b for b in blocks if b.label.startswith("tool") or b.label in _RESULT_LABELS]
    every = [line for b in blocks for line in b.lines]
    sections = {
        "Goal and constraints": _pick(user[0].lines if user else every, 3),
        "Decisions and why": _pick([b.lines[0] for b in assistant if b.lines], newest=True),
        "Files and artifacts": _pick([m.group(0) for line in every for m in _PATH.finditer(line)
                                      if re.search(r"[A-Za-z]", m.group(0))], 6),
        "Verified state": _pick([x for b in tools for x in b.lines if _VERIFIED.search(x)], newest=True),
        "Open TODOs": _pick([x for b in assistant + user for x in b.lines if _TODO.search(x)], 3, newest=True),
        "Approaches that failed": _pick([x for b in tools for x in b.lines if _FAILED.search(x)], newest=True),
        "Next step": _pick(assistant[-1].lines if assistant else [], 1),
    }
    out = [SUMMARY_NOTE]
    for heading in summarizer.SECTIONS:
        out.append(f"\n## {heading}")
        out += [f"- {x}" for x in sections.get(heading) or []] or ["- none found in the transcript"]
    return "\n".join(out)


def extractive_fact(transcript: str, question: str) -> str:
    """A deterministic stand-in for a facts-strategy answer: the transcript lines sharing most words with the
    question."""
    words = {w for w in re.findall(r"[a-z]{4,}", question.lower()) if w not in _STOP}
    scored = []
    for n, line in enumerate(x for b in _transcript(transcript) for x in b.lines):
        score = len(words & set(re.findall(r"[a-z]{4,}", line.lower())))
        if score:
            scored.append((-score, n, line))
    best = sorted(scored)[:3]
    if not best:
        return "(simulated) none"
    return "(simulated: lines copied from the transcript)\n" + "\n".join(
        f"- {_cut(line)}" for _, _, line in sorted(best, key=lambda x: x[1]))


def call_kind(body: Mapping[str, Any]) -> str:
    """"summary" / "facts" for ctxproxy's summarizer calls, else "turn"."""
    messages = body.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    system = first.get("content") if first.get("role") == "system" else None
    if system == summarizer.SYSTEM_PROMPT:
        return "summary"
    if isinstance(system, str) and system.startswith(summarizer.FACT_PROMPT):
        return "facts"
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    text = last.get("content") if last.get("role") == "user" else None
    if isinstance(text, str) and text.startswith(summarizer.COMPACTION_OPEN):
        return "facts" if "\nQuestion: " in text else "summary"
    return "turn"


def _answer(kind: str, body: Mapping[str, Any]) -> str:
    if kind == "turn":
        return ORDINARY_ANSWER
    messages = body.get("messages") or []
    user = _content_text(messages[-1].get("content")) if len(messages) > 1 and isinstance(messages[-1], dict) else ""
    return answer_from(kind, CHAT, messages, user)


def answer_from(kind: str, wire: Codec, items: Sequence[Any], user: str) -> str:
    """The answer to a request of `kind` whose items (in `wire`'s API) end with a user message of text `user`."""
    if kind == "turn":
        return ORDINARY_ANSWER
    if user.startswith(summarizer.COMPACTION_OPEN):  # the cached shape: the span is the conversation above
        span = [m for m in items[head_end(wire, items):-1] if isinstance(m, dict)]
        question = user.split("\nQuestion: ", 1)[1].split("\n", 1)[0] if "\nQuestion: " in user else ""
        user = summarizer.render(wire, span) + (f"\n\nQuestion: {question}" if question else "")
    if kind == "summary":
        return extractive_summary(user)
    transcript, _, question = user.rpartition("\n\nQuestion: ")
    return extractive_fact(transcript or user, question)


