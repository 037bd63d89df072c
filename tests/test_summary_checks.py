"""Summaries are checked before they replace history, identifiers are ranked and unique, and compactions
leave room to grow, on a small window as on a large one."""

from __future__ import annotations

import json
import re

import pytest
from proxy_server import InProcessProxy, make_settings
from test_compress import MODEL, SUMMARY, agent_run, chat_requests, is_summary_call, post, settings

from proxy.rewrite.compress.history import identifiers
from proxy.rewrite.compress.summarizer import SECTIONS, summary_problem
from proxy.wire.chat.codec import CHAT

HEADINGS = "\n".join(f"## {s}\nDetails about {s.lower()} in src/app/core.py." for s in SECTIONS)


@pytest.mark.parametrize("text,span,ok", [
    ("ok 6849", 24_000, False),
    ("", 5_000, False),
    ("   \n ", 5_000, False),
    ("I'm sorry, but I can't help with that request.\n" + HEADINGS, 5_000, False),
    ("I cannot summarize this conversation.", 5_000, False),
    ("As an AI, I won't do that.", 5_000, False),
    ("The agent read many modules and fixed the crash in src/app/core.py. " * 10, 5_000, False),  # no headings
    (SUMMARY, 20_000, True),
    (HEADINGS, 5_000, True),
])
def test_summary_problem(text, span, ok):
    assert (summary_problem(text, span, "gpt-4o") is None) == ok


@pytest.mark.parametrize("answer", ["ok", "", "ok 6849", "I'm sorry, I can't help with summarizing this.",
                                    "Summary: the agent read files. " * 20])
def test_a_bad_summary_answer_falls_back_and_says_why(upstream, tmp_path, answer):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        upstream.script(*[lambda req: answer if is_summary_call(req) else "ok"] * 10)
        r = post(p, agent_run(24))
        assert r.status_code == 200
        assert r.headers["x-ctxproxy-compacted"] in ("clear", "archive")
        assert r.headers["x-ctxproxy-summary-rejected"]
        sent = json.dumps(chat_requests(upstream)[-1].json["messages"])
        assert "<context_summary>" not in sent
        calls = sum(is_summary_call(x.json) for x in upstream.requests)
        assert calls >= 1
        # The breaker counts it as a failure: the next compaction soon after does not ask again.
        r2 = post(p, agent_run(30), key="sk-a")
        assert r2.status_code == 200
        assert sum(is_summary_call(x.json) for x in upstream.requests) == calls


def test_a_good_summary_is_still_accepted(upstream, tmp_path):
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000)) as p:
        upstream.script(*[lambda req: SUMMARY if is_summary_call(req) else "ok"] * 10)
        r = post(p, agent_run(24))
    assert r.headers["x-ctxproxy-compacted"] == "summary" and "x-ctxproxy-summary-rejected" not in r.headers


# ---- identifiers: ranked by what the agent acted on, each once

def _call(i: int, args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "edit", "arguments": json.dumps(args)}}]}


def test_identifiers_rank_what_the_agent_acted_on_first_and_never_repeat():
    log = "\n".join(f"commit {i:08x}abc0 merged into /var/log/build/{i}.log" for i in range(40))
    msgs = [{"role": "user", "content": "Fix the bug reported at https://bugs.example/7"},
            {"role": "tool", "tool_call_id": "c0", "content": log},
            _call(1, {"path": "src/pkg/loader.py", "symbol": "load_config"}),
            {"role": "tool", "tool_call_id": "c1", "content": "Traceback (most recent call last):\n"
             "  File \"src/pkg/loader.py\", line 3\nModuleNotFoundError: No module named yaml (ENOENT)"},
            {"role": "assistant", "content": "The loader in src/pkg/loader.py needs tests/test_loader.py too."}]
    ids = identifiers(CHAT, msgs, 8)
    assert len(ids) == len(set(ids))
    assert ids[:4] == ["src/pkg/loader.py", "load_config", "tests/test_loader.py", "ModuleNotFoundError"]
    assert "ENOENT" in ids and "https://bugs.example/7" in ids
    # the hashes and paths a log merely printed are what the cap cuts
    assert sum(1 for v in ids if v.endswith(".log") or re.fullmatch(r"[0-9a-f]{12}", v)) == 8 - 6
    everything = identifiers(CHAT, msgs, 1000)
    assert len(everything) == len(set(everything)) and "src/pkg/loader.py" in everything


# ---- compactions land where they should on a small window

SMALL = 4096


def _verbose(req: dict) -> str:
    """A small model that writes up to its whole answer budget, headings and all."""
    if not is_summary_call(req):
        return "ok"
    budget = req.get("max_tokens") or 2000
    filler = " ".join(f"src/app/module_{i}.py was read." for i in range(budget))
    words = filler.split()[: int(budget * 0.6)]
    return "\n".join(f"## {s}\n" + " ".join(words[k::len(SECTIONS)]) for k, s in enumerate(SECTIONS))


def test_small_window_compactions_leave_room_and_never_come_back_to_back(upstream, tmp_path):
    upstream.windows[MODEL] = SMALL
    cfg = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", models={MODEL: {"context_window": SMALL}},
                        defaults={"offload": {"enabled": False}, "status_bar": {"enabled": False},
                                  "compress": {"keep_recent_tokens": 600, "min_clear_tokens": 100_000}})
    run = agent_run(40)
    upstream.script(*[_verbose] * 400)
    with InProcessProxy(cfg) as p:
        responses = [post(p, run[:i]) for i in range(4, len(run) + 1, 2)]
    assert all(r.status_code == 200 for r in responses)
    compacted = [i for i, r in enumerate(responses) if "x-ctxproxy-compacted" in r.headers]
    assert len(compacted) >= 2
    assert all(b - a > 1 for a, b in zip(compacted, compacted[1:])), compacted
    trigger = 0.85 * SMALL
    for i in compacted:
        assert int(responses[i].headers["x-ctxproxy-tokens-after"]) < trigger
    calls = [r.json for r in upstream.requests if is_summary_call(r.json)]
    assert calls and all(c["max_tokens"] <= SMALL // 16 for c in calls)  # the budget scales with the window
    for req in chat_requests(upstream):
        for m in req.json["messages"]:
            text = str(m.get("content"))
            if "## Identifiers" in text:
                listed = text.split("## Identifiers", 1)[1].split("\n", 1)[1].split("</context_summary>")[0]
                lines = [x for x in listed.splitlines() if x.strip()]
                assert len(lines) == len(set(lines))


@pytest.mark.parametrize("text", ["a" * 2_000_000, ("x" * 1000 + " ") * 2000, ("ab." * 300 + " ") * 2000])
def test_identifiers_take_bounded_time_on_any_text(text):
    """Compaction lists identifiers: a long word run must not make that quadratic (which on these texts runs
    for many minutes: the deadline fails it; the time itself is no assertion)."""
    import subprocess
    import sys
    code = ("import sys; from proxy.rewrite.compress.history import identifiers; "
            "from proxy.wire.chat.codec import CHAT; t=sys.stdin.read(); "
            "ids = identifiers(CHAT, [{'role':'assistant','content':t},{'role':'tool','tool_call_id':'c',"
            "'content':t}], 400); print(len(ids))")
    r = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, timeout=45)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) <= 400
