"""The package's layering holds: the codecs know shapes only, reading the config loads no codec, modules stay small.

DESIGN.md: a codec does no I/O and knows nothing of the store, the upstream
client or the transforms; the read-back loop is written once, above the
codecs (proxy/rewrite/context_read/loop.py). These read the source and the
import graph, so a change that breaks the layering fails here, not in review; what imports what is
import-linter's contracts (pyproject.toml [tool.importlinter], `lint-imports` in .ci/run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PROXY = Path(__file__).resolve().parent.parent / "proxy"
MAX_LINES = 450


def imports(path: Path) -> list[str]:
    """Every module a file imports, TYPE_CHECKING blocks and function bodies included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_reading_the_config_loads_no_codec() -> None:
    code = "import sys, proxy.config; print(sorted(m for m in sys.modules if m.startswith('proxy.wire')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=PROXY.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['proxy.wire', 'proxy.wire.dialects']", done.stdout  # names, no codec


def test_the_read_back_loop_is_written_once() -> None:
    """Only the loop sends a request for a hidden round; no codec module reads an upstream answer."""
    senders = sorted(str(p.relative_to(PROXY.parent)) for p in PROXY.rglob("*.py")
                     if "iter_raw(" in p.read_text(encoding="utf-8") and "def iter_raw" not in p.read_text())
    assert senders == ["proxy/engine/passthrough.py", "proxy/engine/turn.py", "proxy/rewrite/context_read/loop.py"], \
        senders


def test_no_module_is_over_450_lines() -> None:
    long = {str(p.relative_to(PROXY.parent)): n for p in PROXY.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_no_import_cycle_in_the_package() -> None:
    """Every import statement counts: inside functions and under TYPE_CHECKING too (grimp reads them all)."""
    import grimp

    graph = grimp.build_graph("proxy", include_external_packages=False)
    done: set[str] = set()

    def cycle_from(start: str) -> list[str] | None:  # depth first, an explicit stack: the path is the cycle found
        path, on_path, stack = [start], {start}, [iter(sorted(graph.find_modules_directly_imported_by(start)))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.find_modules_directly_imported_by(nxt))))
        return None

    for module in sorted(graph.modules):
        if module not in done:
            found = cycle_from(module)
            assert found is None, " -> ".join(found)
