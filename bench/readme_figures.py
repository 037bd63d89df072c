"""The figures README.md and docs/ quote, made from the shipped examples: `python -m bench.readme_figures [--write]`.

A README that quotes a command's output drifts the moment the code changes
what it prints. Each quoted block, in README.md or a page of docs/, sits between
`<!-- figures:NAME -->` and `<!-- /figures:NAME -->` markers; this script runs
the commands behind them (`ctxproxy replay --simulate`, in process: the
simulator is deterministic) and either rewrites the blocks (`--write`) or, by
default, exits 1 naming each block that disagrees (and each block no file
quotes), which tests/test_readme_figures.py does in CI.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)


def pages() -> list[Path]:
    """The files whose blocks are checked: README.md, then every page of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _replay(*args: str) -> str:
    """What `ctxproxy replay --simulate ARGS` prints to a pipe, each line without its trailing padding."""
    done = subprocess.run([sys.executable, "-c", "from proxy.cli import main; main()", "replay", "--simulate", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"ctxproxy replay --simulate {' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip()[-500:]}")
    return "\n".join(line.rstrip() for line in done.stdout.splitlines()) + "\n"


def demo() -> str:
    """The no-argument demo in one sentence: what dies without the proxy, what it costs with it."""
    t = json.loads(_replay("--json"))["totals"]
    none, ours, both = t["no_proxy"], t["ctxproxy"], t["both_answered"]
    change = both["ctxproxy"]["effective_cost"] / both["no_proxy"]["effective_cost"] - 1
    compactions = ", ".join(f"{n} {kind}" for kind, n in sorted(ours["compactions"].items())) or "none"
    return (f"straight to the provider {none['rejected']} of its turns are rejected and the agent would have died;\n"
            f"through ctxproxy all {ours['answered']} turns of the four examples are answered (compactions: "
            f"{compactions}),\nand the {both['turns']} turns both answer cost {abs(change):.1%} "
            f"{'less' if change < 0 else 'more'} (effective cost, cached tokens at 0.1).\n")


def window_8000_07() -> str:
    """The quoted output of `ctxproxy replay --simulate --window 8000 07`, as a fenced block."""
    return "```\n" + _replay("--window", "8000", "07").rstrip("\n") + "\n```\n"


BLOCKS: dict[str, Callable[[], str]] = {"demo": demo, "replay-window-8000-07": window_8000_07}


def disagreements(text: str, made: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """One file's text with every block it quotes produced afresh, and the names of the blocks that differed (or
    that no script makes). `made` caches what each script printed, so a block quoted twice is produced once."""
    made = {} if made is None else made
    wrong: list[str] = []

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            wrong.append(f"{name} (no script makes it)")
            return m.group(0)
        if name not in made:
            made[name] = BLOCKS[name]()
        if m.group("body") != made[name]:
            wrong.append(name)
        return m.group(1) + made[name] + m.group(4)

    return _BLOCK.sub(fill, text), wrong


def check(files: list[Path] | None = None) -> tuple[dict[Path, str], list[str]]:
    """Every file's text produced afresh, and what is wrong: `FILE: NAME` for a block that differs, `NAME (no
    markers)` for a block no file quotes."""
    made: dict[str, str] = {}
    fresh: dict[Path, str] = {}
    wrong: list[str] = []
    quoted: set[str] = set()
    for path in pages() if files is None else files:
        text = path.read_text(encoding="utf-8")
        quoted |= {m.group("name") for m in _BLOCK.finditer(text)}
        fresh[path], differ = disagreements(text, made)
        wrong += [f"{path.relative_to(ROOT)}: {name}" for name in differ]
    wrong += [f"{name} (no markers)" for name in BLOCKS if name not in quoted]
    return fresh, wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the blocks of README.md and docs/*.md instead of "
                                                          "checking them")
    args = ap.parse_args(argv)
    fresh, wrong = check()
    names = ", ".join(str(path.relative_to(ROOT)) for path in fresh)
    if args.write:
        for path, text in fresh.items():
            if text != path.read_text(encoding="utf-8"):
                path.write_text(text, encoding="utf-8")
        print(f"{names}: {len(wrong)} block(s) rewritten or missing" + (f": {', '.join(wrong)}" if wrong else ""))
        return 0
    if wrong:
        print(f"the quoted figures disagree with what the commands print: {', '.join(wrong)}; "
              "run python -m bench.readme_figures --write", file=sys.stderr)
        return 1
    print(f"{names}: every quoted figure is what the commands print")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
