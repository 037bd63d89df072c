"""bench.replay's cost side by side: the split between trajectories that fit without a proxy and the others, and
issue 27's checks, on made-up totals."""

from __future__ import annotations

from bench.replay.costs import cost_criteria, cost_markdown, fitting_traces


def _setting(name: str, per_trace: dict[str, tuple[float, int]], kept: int = 10, total: int = 10) -> dict:
    traces = [{"trace": t, "cost_units": c, "rejected": r} for t, (c, r) in per_trace.items()]
    return {"setting": name, "traces": traces,
            "total": {"cost_units": sum(c for c, _ in per_trace.values()),
                      "rejected": sum(r for _, r in per_trace.values()), "hit_rate": 0.9,
                      "identifiers": {"kept": kept, "total": total}}}


def _run(ours_fit: float, ours_rest: float, kept: int = 10) -> list[dict]:
    return [_setting("no-proxy", {"a": (100.0, 0), "b": (50.0, 3)}),
            _setting("ctxproxy", {"a": (ours_fit, 0), "b": (ours_rest, 0)}, kept=kept),
            _setting("ctxproxy-previous-defaults", {"a": (104.0, 0), "b": (300.0, 0)}),
            _setting("cliffcompaction", {"a": (100.0, 0), "b": (280.0, 0)}, kept=9)]


def test_only_trajectories_no_proxy_served_whole_fit():
    assert fitting_traces(_run(100, 200)) == ["a"]


def test_the_checks_are_met_only_within_their_bounds():
    met = {c["criterion"].split(": ", 1)[1][:20]: c["met"] for c in cost_criteria(_run(103.0, 270.0), 32000)}
    assert list(met.values()) == [True, True, True]
    # 103 + 278 > 380 = the peer's total; 103.5 > 100 x 1.03; 301 > the previous defaults' 300
    assert [c["met"] for c in cost_criteria(_run(103.0, 278.0), 32000)][0] is False
    assert [c["met"] for c in cost_criteria(_run(103.5, 200.0), 32000)][1] is False
    assert [c["met"] for c in cost_criteria(_run(79.0, 301.0), 32000)][2] is False
    assert [c["met"] for c in cost_criteria(_run(100.0, 200.0, kept=9), 32000)][0] is False  # 90% kept < 97%


def test_where_everything_fits_the_peer_check_is_left_to_the_no_proxy_one():
    run = [_setting(n, {"a": (c, 0)}) for n, c in (("no-proxy", 100.0), ("ctxproxy", 102.0),
                                                   ("cliffcompaction", 100.0))]
    (only,) = cost_criteria(run, 128000)
    assert "fit without a proxy" in only["criterion"] and only["met"]


def test_the_table_states_each_ratio():
    table = cost_markdown(_run(103.0, 270.0))
    row = next(line for line in table.splitlines() if line.startswith("| ctxproxy |"))
    assert "| 0.982x |" in row and "| 1.030x |" in row and "| 0.900x |" in row
