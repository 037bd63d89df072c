"""Helpers the checks and the tables share: percentages, shares, which settings ran."""

from __future__ import annotations

from typing import Any


def pct(x: float | None) -> str:
    """A share as a percentage with two decimals; "n/a" when there is none."""
    return "n/a" if x is None else f"{x * 100:.2f}%"


def share(kept: int, total: int) -> str:
    """`kept` of `total` as "12.3% (kept/total)"; "n/a" for nothing to keep."""
    return f"{kept / total * 100:.1f}% ({kept}/{total})" if total else "n/a"


def available(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The settings that ran (one that could not be installed or started has no "total")."""
    return [r for r in results if "total" in r]


def ids_over(res: dict[str, Any], subset: list[str]) -> dict[str, int]:
    """Identifier counts of one setting, summed over the trajectories in `subset`."""
    rows = [t["identifiers"] for t in res["traces"] if t["trace"] in subset]
    return {k: sum(r[k] for r in rows) for k in ("total", "kept", "after_head", "after_head_kept")}
