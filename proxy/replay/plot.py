"""`--plot FILE.png`: tokens that reached the provider per turn, with and without the proxy, and the window.

matplotlib draws it when it is installed (it is not a dependency); otherwise a
small raster line chart is drawn here and written as a PNG with the standard
library (zlib + struct): axes with tick labels in a 3x5 pixel font, a red line
for "no proxy", a blue one for ctxproxy, a dashed grey line at the window, and
light vertical lines between traces. Each trace is drawn apart (a line never
runs from one trace's last turn into the next one's first, which would look like
a compaction); a turn the provider rejected without the proxy is a red X on the
window line, and a turn where ctxproxy compacted is marked C above the plot.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

RED = (214, 39, 40)  # no proxy
BLUE = (31, 119, 180)  # ctxproxy
GREY = (120, 120, 120)  # the window
LEGEND = ("red: no proxy (X: a turn it got rejected), blue: ctxproxy (C: a compaction), dashed grey: the window; "
          "traces apart")
_WHITE, _AXIS, _GRID, _SEP, _TEXT = (255, 255, 255), (60, 60, 60), (228, 228, 228), (200, 200, 200), (40, 40, 40)

Series = Sequence[int | None]


def plot(path: str | Path, no_proxy: Series, ctxproxy: Series, window: int, separators: Sequence[int] = (),
         title: str = "ctxproxy replay", backend: str = "auto", rejected: Sequence[int] = (),
         compactions: Sequence[int] = ()) -> str:
    """Write the chart; returns the backend used ("matplotlib" or "builtin"). `separators`: turn counts before each
    new trace; `rejected`, `compactions`: the turns (1-based) rejected without the proxy, compacted through it."""
    if backend == "matplotlib" or (backend == "auto" and importlib.util.find_spec("matplotlib") is not None):
        try:
            _matplotlib(Path(path), no_proxy, ctxproxy, window, separators, title, rejected, compactions)
            return "matplotlib"
        except ImportError:
            if backend == "matplotlib":
                raise
    Path(path).write_bytes(chart_png(no_proxy, ctxproxy, window, separators, title, rejected, compactions))
    return "builtin"


def _apart(series: Series, separators: Sequence[int]) -> list[float]:
    """The series for a line chart, a gap between traces (NaN before each trace's first turn)."""
    starts = {s + 1 for s in separators}
    out: list[float] = []
    for i, v in enumerate(series, 1):
        if i in starts:
            out.append(float("nan"))
        out.append(float("nan") if v is None else float(v))
    return out


def _matplotlib(path: Path, a: Series, b: Series, window: int, separators: Sequence[int], title: str,
                rejected: Sequence[int] = (), compactions: Sequence[int] = ()) -> None:
    import matplotlib  # type: ignore[import-not-found, unused-ignore]  # optional, not a dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]  # optional
    from matplotlib.ticker import MaxNLocator  # type: ignore[import-not-found, unused-ignore]  # optional

    starts = {s + 1 for s in separators}
    xs = [x for i in range(1, len(a) + 1) for x in ((i - 0.5, i) if i in starts else (i,))]
    fig, ax = plt.subplots(figsize=(9.6, 4.8), dpi=100)
    try:
        for s in separators:
            ax.axvline(s + 0.5, color="#c8c8c8", linewidth=1)
        ax.plot(xs, _apart(a, separators), color="#d62728", marker=".", label="no proxy")
        ax.plot(xs, _apart(b, separators), color="#1f77b4", marker=".", label="ctxproxy")
        ax.axhline(window, color="#787878", linestyle="--", label=f"window ({window:,})")
        if rejected:
            ax.scatter(list(rejected), [window] * len(rejected), color="#d62728", marker="x", s=60, zorder=3,
                       label="rejected without the proxy")
        for k, turn in enumerate(compactions):
            ax.axvline(turn, color="#1f77b4", linestyle=":", linewidth=1, label="compaction" if k == 0 else None)
        ax.set_xlabel("turn")
        ax.set_ylabel("tokens that reached the provider")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- the builtin raster chart

_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    "-": "000000111000000", ".": "000000000000010", ":": "000010000010000", "/": "001001010100100",
    ",": "000000000010100", "(": "010100100100010", ")": "010001001001010", " ": "000000000000000",
}
_SCALE = 2
_W, _H = 960, 480
_LEFT, _RIGHT, _TOP, _BOTTOM = 74, 24, 56, 48


class _Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = bytearray(bytes(_WHITE) * (w * h))

    def set(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int], width: int = 1,
             dash: int = 0) -> None:
        """Bresenham; `width` pixels thick; `dash` > 0 draws dash-length on, dash-length off."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n, r = dx + dy, 0, width // 2
        while True:
            if not dash or (n // dash) % 2 == 0:
                self.rect(x0 - r, y0 - r, x0 - r + width - 1, y0 - r + width - 1, c)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy
            n += 1

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int] = _TEXT) -> int:
        """Draw `s` with its top-left corner at (x, y); returns the width drawn."""
        start = x
        for ch in s.upper():
            glyph = _GLYPHS.get(ch, _GLYPHS[" "])
            for row in range(5):
                for col in range(3):
                    if glyph[row * 3 + col] == "1":
                        self.rect(x + col * _SCALE, y + row * _SCALE, x + col * _SCALE + _SCALE - 1,
                                  y + row * _SCALE + _SCALE - 1, c)
            x += 4 * _SCALE
        return x - start


def text_width(s: str) -> int:
    return len(s) * 4 * _SCALE


def _nice_step(span: float, ticks: int) -> int:
    raw = max(span / max(ticks, 1), 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return max(1, int(m * mag))
    return int(10 * mag)


def _label(v: int) -> str:
    return f"{v // 1000}K" if v >= 1000 and v % 1000 == 0 else (f"{v / 1000:.1f}K" if v >= 1000 else str(v))


def chart_png(no_proxy: Series, ctxproxy: Series, window: int, separators: Sequence[int] = (),
              title: str = "ctxproxy replay", rejected: Sequence[int] = (), compactions: Sequence[int] = ()) -> bytes:
    """The chart as PNG bytes (RGB, 8 bits), drawn without any plotting library."""
    c = _Canvas(_W, _H)
    n = max(len(no_proxy), len(ctxproxy), 1)
    values = [v for v in (*no_proxy, *ctxproxy) if v is not None]
    ymax = max([window, *values, 1]) * 1.08
    ystep = _nice_step(ymax, 6)
    ymax = math.ceil(ymax / ystep) * ystep
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP  # plot area: y0 is the bottom edge

    def px(i: int) -> int:  # turn i (1-based)
        return x0 + round((i - 0.5) * (x1 - x0) / n)

    def py(v: float) -> int:
        return y0 - round(v * (y0 - y1) / ymax)

    for v in range(0, int(ymax) + 1, ystep):  # grid and y labels
        c.line(x0, py(v), x1, py(v), _GRID)
        lab = _label(v)
        c.text(x0 - 8 - text_width(lab), py(v) - 5, lab)
    xstep = _nice_step(n, 12)
    for i in [1, *(i for i in range(xstep, n + 1, xstep) if i - 1 >= xstep * 0.6)]:
        c.line(px(i), y0, px(i), y0 + 5, _AXIS)
        c.text(px(i) - text_width(str(i)) // 2, y0 + 9, str(i))
    for s in separators:
        if 0 < s < n:
            xs = (px(s) + px(s + 1)) // 2
            c.line(xs, y0, xs, y1, _SEP)
    c.line(x0, y0, x1, y0, _AXIS, 2)
    c.line(x0, y0, x0, y1, _AXIS, 2)
    c.line(x0, py(window), x1, py(window), GREY, 2, dash=8)
    starts = {s + 1 for s in separators}
    for series, colour in ((no_proxy, RED), (ctxproxy, BLUE)):
        prev = None
        for i, value in enumerate(series, 1):
            if value is None or i in starts:  # a gap, or a new trace: no line into it
                prev = None
            if value is None:
                continue
            point = (px(i), py(value))
            if prev is not None:
                c.line(*prev, *point, colour, 2)
            c.rect(point[0] - 2, point[1] - 2, point[0] + 2, point[1] + 2, colour)
            prev = point
    for i in rejected:  # an X on the window line
        x, y = px(i), py(window)
        c.line(x - 5, y - 5, x + 5, y + 5, RED, 2)
        c.line(x - 5, y + 5, x + 5, y - 5, RED, 2)
    for i in compactions:  # a C above the plot, a dotted tick down to it
        c.text(px(i) - text_width("C") // 2, y1 - 14, "C", BLUE)
        c.line(px(i), y1, px(i), y0, BLUE, 1, dash=3)
    c.text(x0, 14, title)
    c.text(x0 - 40, y1 - 22, "TOKENS")
    c.text((x0 + x1) // 2 - text_width("TURN") // 2, y0 + 28, "TURN")
    x = x1 - text_width(f"NO PROXY    CTXPROXY    WINDOW {window}") - 3 * 22
    for label, colour, dashed in (("NO PROXY", RED, False), ("CTXPROXY", BLUE, False), (f"WINDOW {window}", GREY,
                                                                                        True)):
        c.line(x, 35, x + 16, 35, colour, 3, dash=4 if dashed else 0)
        x += 22
        x += c.text(x, 30, label) + 24
    marks = "X REJECTED WITHOUT THE PROXY   C COMPACTION"
    c.text(x1 - text_width(marks) - 24, 46, marks)
    return encode_png(c.w, c.h, bytes(c.px))


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """RGB pixels (row-major, 3 bytes each) as a PNG file: one IDAT, filter type 0 on every row."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
