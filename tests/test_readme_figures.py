"""README.md and docs/ quote only what the commands print: their marked blocks are produced afresh and compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import readme_figures


@pytest.mark.timeout(180)
def test_every_quoted_figure_is_what_the_commands_print() -> None:
    _, wrong = readme_figures.check()
    assert not wrong, f"blocks {wrong} differ from what the commands print (bench.readme_figures --write)"


def test_the_pages_checked_are_the_readme_and_the_docs() -> None:
    pages = readme_figures.pages()
    assert pages[0] == readme_figures.README
    assert {p.name for p in pages[1:]} >= {"figures.md", "benchmarks.md"}


def test_a_drifted_figure_is_caught() -> None:
    text = readme_figures.README.read_text(encoding="utf-8")
    drifted = text.replace("<!-- figures:demo -->\n", "<!-- figures:demo -->\nthe demo costs 6.9% less\n", 1)
    blocks = dict(readme_figures.BLOCKS)
    try:  # only the cheap block is produced here; the drift is in the demo's text
        readme_figures.BLOCKS.clear()
        readme_figures.BLOCKS["demo"] = lambda: "the demo's true sentence\n"
        _, wrong = readme_figures.disagreements(drifted)
    finally:
        readme_figures.BLOCKS.clear()
        readme_figures.BLOCKS.update(blocks)
    assert "demo" in wrong


def test_a_block_no_page_quotes_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("no figures here\n", encoding="utf-8")
    blocks = dict(readme_figures.BLOCKS)
    root = readme_figures.ROOT
    try:
        readme_figures.BLOCKS.clear()
        readme_figures.BLOCKS["demo"] = lambda: "the demo's true sentence\n"
        readme_figures.ROOT = tmp_path
        _, wrong = readme_figures.check([page])
    finally:
        readme_figures.ROOT = root
        readme_figures.BLOCKS.clear()
        readme_figures.BLOCKS.update(blocks)
    assert wrong == ["demo (no markers)"]
