"""The published plot: effective input cost and cache hit rate per setting, from a replay's JSON.

    python -m bench.replay --window 32000 --settings compress,ctxproxy-status-replace --json replay_32k.json
    python -m bench.plot replay_32k.json [-o bench/results.png]

Two bar panels, one bar per setting of the replay (in its order): cost units
(uncached prompt tokens + 0.1 x cached, the proxies' own calls included) and
the provider's cache hit rate (all requests; the agent's requests alone as a
tick when they differ). A setting that had requests rejected is marked on both
panels (its cost is low partly because rejected requests bill nothing).

matplotlib is not a dependency of ctxproxy: when it is not importable, this
script creates ``bench/.venvs/plot`` (gitignored), pip-installs the pinned
``MATPLOTLIB`` there the first time, and re-runs itself with that venv's
Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venvs", "plot")
MATPLOTLIB = "matplotlib==3.11.2"
INSTALL_TIMEOUT = 600

KIND_COLOURS = {"direct": "#9e9e9e", "client": "#d68a3a", "external": "#6a8fc7", "ctxproxy": "#3b9c5a"}
EXTERNAL = ("cliffcompaction", "ctxkeeper")
CLIENT = ("sliding-window", "middle-out")
ZOOM_HIT_RATE = 0.85  # the trade-off panel shows settings above this hit rate (the client-side ones are far off)


def _kind(name: str) -> str:
    if name == "no-proxy":
        return "direct"
    if name.startswith(CLIENT):
        return "client"
    if name.startswith(EXTERNAL):
        return "external"
    return "ctxproxy"


def _ensure_matplotlib(argv: list[str]) -> None:
    """Import matplotlib, or re-run this script in bench/.venvs/plot (installed on first use)."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("CTXPROXY_PLOT_VENV") == "1":
        raise SystemExit(f"matplotlib still not importable in {VENV}")
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py) or subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode:
        print(f"installing {MATPLOTLIB} into {os.path.relpath(VENV)} (one-off)", file=sys.stderr, flush=True)
        for cmd in ([sys.executable, "-m", "venv", VENV],
                    [py, "-m", "pip", "install", "--disable-pip-version-check", "-q", MATPLOTLIB]):
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if out.returncode:
                raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}:\n{(out.stdout + out.stderr)[-3000:]}")
    env = {**os.environ, "CTXPROXY_PLOT_VENV": "1", "MPLBACKEND": "Agg"}
    raise SystemExit(subprocess.run([py, os.path.abspath(__file__), *argv], env=env).returncode)


def load(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = [r for r in data["results"] if "total" in r]
    order = list(KIND_COLOURS)
    rows.sort(key=lambda r: order.index(_kind(r["setting"])))  # stable: the replay's order within a kind
    return data, rows


def plot(path: str, out: str, title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data, every = load(path)
    rows = [r for r in every if "+" not in r["setting"]]  # derived ctxproxy settings go on the trade-off panel
    names = [r["setting"] for r in rows]
    cost = [r["total"]["cost_units"] / 1e6 for r in rows]
    hit = [100 * (r["total"]["hit_rate"] or 0) for r in rows]
    agent = [100 * (r["total"].get("agent_hit_rate") or 0) for r in rows]
    rejected = [r["total"]["rejected"] for r in rows]
    requests = [r["total"]["requests"] for r in rows]
    colours = [KIND_COLOURS[_kind(n)] for n in names]
    window = data.get("window")

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(19, 5.6), dpi=100)
    x = range(len(names))
    bars = ax1.bar(x, cost, color=colours)
    for i, b in enumerate(bars):
        ax1.annotate(f"{cost[i]:.2f}M", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                     va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        if rejected[i]:
            b.set_hatch("//")
            b.set_edgecolor("white")
            ax1.annotate(f"{rejected[i]} of {requests[i]}\nrejected", (b.get_x() + b.get_width() / 2,
                         b.get_height() / 2), ha="center", va="center", fontsize=7, color="black")
    ax1.set_ylabel("cost units, millions")
    ax1.set_title("Effective input cost: uncached + 0.1 x cached prompt tokens\n(lower is better)", fontsize=10)

    bars = ax2.bar(x, hit, color=colours)
    for i, b in enumerate(bars):
        ax2.annotate(f"{hit[i]:.1f}%", (b.get_x() + b.get_width() / 2, max(hit[i], agent[i])), ha="center",
                     va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        if abs(agent[i] - hit[i]) >= 0.05:
            ax2.plot([b.get_x() + 0.1, b.get_x() + b.get_width() - 0.1], [agent[i]] * 2, color="black", lw=1)
        if rejected[i]:
            b.set_hatch("//")
            b.set_edgecolor("white")
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("provider cache hit rate, % of prompt tokens")
    ax2.set_title("Provider cache hit rate (higher is better)\nblack tick: the agent's requests alone", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    _tradeoff(ax3, every)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOURS.values()]
    fig.legend(handles, ["no context management", "client-side", "open-source proxies", "ctxproxy"],
               loc="upper center", ncol=4, frameon=False, fontsize=9, bbox_to_anchor=(0.5, 0.93))
    git = data.get("git") or {}
    commit = git.get("commit") or git.get("head") or ""
    src = f"ctxproxy at {commit[:7]}" if commit else f"ctxproxy from {data.get('proxy_src') or 'the working tree'}"
    fig.suptitle(title or f"Replay of 30 agent trajectories ({requests[0]:,} requests each) at a "
                 f"{window:,}-token window; {src}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(out)
    print(f"wrote {out} ({', '.join(names)}; {commit})")


DEFAULT_TRIGGER = 0.75  # proxy/rewrite/settings.py's compress.trigger (the plot runs where proxy may not import)
_FRONTIER_PARTS = ("compress.trigger=", "status_bar.enabled=false")


def _trigger(name: str) -> float:
    for part in name.split("+"):
        if part.startswith("compress.trigger="):
            return float(part.split("=", 1)[1])
    return DEFAULT_TRIGGER


def _on_frontier(name: str) -> bool:
    """The defaults, without the status bar, and their trigger variants: nothing else changed."""
    base, _, rest = name.partition("+")
    if base != "ctxproxy":
        return name == "ctxproxy-no-status-bar"
    return all(part.startswith(_FRONTIER_PARTS) for part in rest.split("+")) if rest else True


def _tradeoff(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Cost against hit rate for every setting with no rejection; ctxproxy's settings joined by trigger."""
    fine = [r for r in rows if r["total"]["rejected"] == 0 and r["total"]["hit_rate"] >= ZOOM_HIT_RATE]
    for r in fine:
        t, name = r["total"], r["setting"]
        if _kind(name) == "ctxproxy" and "+" in name:
            continue
        x, y = 100 * t["hit_rate"], t["cost_units"] / 1e6
        ax.scatter([x], [y], color=KIND_COLOURS[_kind(name)], s=30, zorder=3)
        ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    lines = {"status bar on (default)": lambda n: "status_bar.enabled=false" not in n and n != "ctxproxy-no-status-bar",
             "status bar off": lambda n: "status_bar.enabled=false" in n or n == "ctxproxy-no-status-bar"}
    for (label, keep), style in zip(lines.items(), ("-", "--")):
        pts = sorted((_trigger(r["setting"]), 100 * r["total"]["hit_rate"], r["total"]["cost_units"] / 1e6)
                     for r in fine if _on_frontier(r["setting"]) and keep(r["setting"]))
        if len(pts) < 2:
            continue
        ax.plot([p[1] for p in pts], [p[2] for p in pts], style, color=KIND_COLOURS["ctxproxy"], marker="o", ms=4,
                label=f"ctxproxy, {label}")
        for trig, x, y in pts:
            ax.annotate(f"{trig:g}", (x, y), fontsize=7, xytext=(-4, -10), textcoords="offset points",
                        color=KIND_COLOURS["ctxproxy"])
    ax.set_xlabel("provider cache hit rate, %")
    ax.set_ylabel("cost units, millions")
    ax.set_title(f"Trade-off, settings with no rejection and hit rate >= {100 * ZOOM_HIT_RATE:.0f}%\n"
                 "ctxproxy points labelled with compress.trigger; lower right is better", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.margins(x=0.15, y=0.12)
    ax.spines[["top", "right"]].set_visible(False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("replay_json", help="a `python -m bench.replay --json` file")
    ap.add_argument("-o", "--out", default=os.path.join(HERE, "results.png"))
    ap.add_argument("--title", help="figure title (default: window, requests, proxy source)")
    args = ap.parse_args(argv)
    _ensure_matplotlib(argv)
    plot(args.replay_json, args.out, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
