"""The README quotes only what the commands print: its marked blocks are produced afresh and compared."""

from __future__ import annotations

import pytest

from bench import readme_figures


@pytest.mark.timeout(180)
def test_every_quoted_figure_is_what_the_commands_print() -> None:
    _, wrong = readme_figures.disagreements(readme_figures.README.read_text(encoding="utf-8"))
    assert not wrong, f"README.md blocks {wrong} differ from what the commands print (bench.readme_figures --write)"


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
