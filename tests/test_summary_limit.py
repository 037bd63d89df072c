"""A summary longer than its limit is cut to it by lines, every heading and each section's first line kept."""

from __future__ import annotations

import json

from proxy_server import InProcessProxy
from test_compress import agent_run, chat_requests, is_summary_call, post, settings

from proxy.rewrite.compress.summarizer import SECTIONS
from proxy.rewrite.compress.summary_limit import within_limit
from proxy.tokens.counter import default_counter


def _long_summary(lines_per_section: dict[str, int]) -> str:
    out = []
    for s in SECTIONS:
        out.append(f"## {s}")
        out += [f"- {s.lower()} detail {k}: src/app/mod_{k}.py checked, value {k * 7}"
                for k in range(lines_per_section.get(s, 2))]
    return "\n".join(out)


def _tokens(text: str) -> int:
    return default_counter.count_text(text, "gpt-4o")


def test_a_summary_within_its_limit_is_untouched():
    text = _long_summary({})
    assert within_limit(text, _tokens(text), "gpt-4o") == text


def test_an_over_long_summary_loses_lines_from_its_longest_sections_first():
    text = _long_summary({"Verified state": 60, "Files and artifacts": 30, "Next step": 1})
    limit = _tokens(text) // 3
    cut = within_limit(text, limit, "gpt-4o")
    assert _tokens(cut) <= limit
    kept = cut.split("\n")
    original = text.split("\n")
    it = iter(original)
    assert all(line in it for line in kept)  # the lines kept, in their order
    for s in SECTIONS:
        at = original.index(f"## {s}")
        assert original[at] in kept and original[at + 1] in kept  # every heading and its first line
    short = [f"## {s}" for s in SECTIONS if s not in ("Verified state", "Files and artifacts")]
    for heading in short:  # the short sections are whole
        at = original.index(heading)
        end = next((k for k in range(at + 1, len(original)) if original[k].startswith("## ")), len(original))
        assert all(line in kept for line in original[at:end])
    assert sum(1 for line in kept if "verified state detail" in line) < 60


def test_the_structure_stays_even_when_it_alone_is_over_the_limit():
    text = _long_summary({s: 3 for s in SECTIONS})
    cut = within_limit(text, 10, "gpt-4o")
    assert [line for line in cut.split("\n") if line.startswith("## ")] == [f"## {s}" for s in SECTIONS]
    assert len(cut.split("\n")) == 2 * len(SECTIONS)


def test_the_proxy_sends_the_summary_cut_to_summary_max_tokens(upstream, tmp_path):
    answer = _long_summary({s: 40 for s in SECTIONS})
    limit = 400
    assert _tokens(answer) > 4 * limit
    with InProcessProxy(settings(upstream, f"sqlite:///{tmp_path}/c.db", min_clear_tokens=100_000,
                                 summary_max_tokens=limit)) as p:
        upstream.script(*[lambda req: answer if is_summary_call(req) else "ok"] * 10)
        r = post(p, agent_run(24))
    assert r.headers["x-ctxproxy-compacted"] == "summary"
    (summary,) = [m["content"] for m in chat_requests(upstream)[-1].json["messages"]
                  if "<context_summary>" in json.dumps(m)]
    written = summary.split("\n\n", 1)[1].split("\n## Identifiers", 1)[0]  # the model-written part
    assert _tokens(written) <= limit
    assert all(f"## {s}" in written for s in SECTIONS)
