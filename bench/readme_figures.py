"""The figures the README quotes, produced from the shipped examples: `python -m bench.readme_figures [--write]`.

A README that quotes a command's output drifts the moment the code changes
what it prints. Each quoted block sits between `<!-- figures:NAME -->` and
`<!-- /figures:NAME -->` markers; this script runs the commands behind them
(`ctxproxy replay --simulate`, in process: the simulator is deterministic) and
either rewrites the blocks (`--write`) or, by default, exits 1 naming each
block that disagrees, which tests/test_readme_figures.py does in CI.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)


def _replay(*args: str) -> str:
    """What `ctxproxy replay --simulate ARGS` prints to a pipe, each line without its trailing padding."""
    done = subprocess.run([sys.executable, "-c", "from proxy.cli import main; main()", "replay", "--simulate", *args],
                          capture_output=True, text=True, timeout=600, cwd=README.parent)
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


def disagreements(text: str) -> tuple[str, list[str]]:
    """The README with every block produced afresh, and the names of the blocks that differed (or are missing)."""
    found = {m.group("name") for m in _BLOCK.finditer(text)}
    wrong = [f"{name} (no markers)" for name in BLOCKS if name not in found]
    made = {name: make() for name, make in BLOCKS.items() if name in found}

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in made:
            wrong.append(f"{name} (no script makes it)")
            return m.group(0)
        if m.group("body") != made[name]:
            wrong.append(name)
        return m.group(1) + made[name] + m.group(4)

    return _BLOCK.sub(fill, text), wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the README's blocks instead of checking them")
    args = ap.parse_args(argv)
    fresh, wrong = disagreements(README.read_text(encoding="utf-8"))
    if args.write:
        README.write_text(fresh, encoding="utf-8")
        print(f"README.md: {len(wrong)} block(s) rewritten" + (f": {', '.join(wrong)}" if wrong else ""))
        return 0
    if wrong:
        print(f"README.md disagrees with what the commands print: {', '.join(wrong)}; "
              "run python -m bench.readme_figures --write", file=sys.stderr)
        return 1
    print("README.md: every quoted figure is what the commands print")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
