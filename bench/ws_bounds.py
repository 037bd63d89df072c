"""Does the Responses WebSocket keep its bounds? A flooding socket's memory, and /healthz while a big frame is in.

``python -m bench.ws_bounds [--sockets 2] [--frames 8] [--frame-mb 30] [--turn-mb 0] [--hold 40] [--items 300000]``

Two checks of what proxy/http/responses_ws.py promises, each beside the HTTP path's figure for the same bytes,
measured in the same run (these machines are noisy: read the ratios).

1. **Memory per socket.** The mock provider (bench.load's, in its own process) holds every answer `--hold`
   seconds before its first event. `--sockets` clients each open a socket, send one `response.create` (the turn
   the provider holds: a few words, or `--turn-mb` MiB), then `--frames` frames of `--frame-mb` MiB as fast as
   the socket takes them: once the proxy stops reading, a send waits, and one that waits `--stall` seconds ends
   that client's sending. The proxy's RSS (VmRSS, with any children) is read before, and at its peak from the
   first send until `--sample` seconds after the last one ended; the growth is set against the documented budget
   per socket, 3 x max_body_bytes + websocket_queue_bytes + websocket_history_bytes (ServerSettings' defaults).
   Then, on a fresh proxy, the same frames go as sockets x frames HTTP POSTs to /v1/responses at once, one body
   each, held the same way: what the HTTP path holds for the same bytes.
2. **/healthz while a big frame is in.** The provider answers at once; a client sends one `response.create` of
   `--items` small input items (bench.loop_stall's neighbour) over a socket, and the same body as an HTTP POST,
   while /healthz is polled every 5 ms (bench.loop_stall's Poller): max and p99 of each, and WS / HTTP. The
   issue's target: /healthz under 100 ms while a WebSocket client sends 100,000 items (a verdict line).

Each proxy is a real ``python -m proxy.cli serve`` (default config, SQLite store in a temporary directory; the
`proxy` package the import path finds first, as bench.loop_stall), warmed by one small turn over each transport
(the tokenizer loads on the first request). About 75 s. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from bench.load.processes import LoadProcesses
from bench.loop_stall import Poller, figures, neighbour
from bench.machine import machine_facts
from bench.paths import ROOT
from proxy.config import ServerSettings

MIB = 1024 * 1024
TOKEN = "Bearer sk-ws-bounds"
HEADERS = {"authorization": TOKEN, "content-type": "application/json"}
POLL_EVERY_S = 0.005
TARGET_MS, TARGET_ITEMS = 100.0, 100_000


# --------------------------------------------------------------------------- the proxy's memory

def budget() -> tuple[int, str]:
    """The bytes one socket may hold by the documented rule, at the defaults, and the sum spelled out."""
    s = ServerSettings()
    total = 3 * s.max_body_bytes + s.websocket_queue_bytes + s.websocket_history_bytes
    return total, (f"3 x {s.max_body_bytes / MIB:g} MiB (max_body_bytes) + {s.websocket_queue_bytes / MIB:g} MiB "
                   f"(websocket_queue_bytes) + {s.websocket_history_bytes / MIB:g} MiB (websocket_history_bytes)")


def rss(pid: int) -> int:
    """VmRSS of `pid` and of its descendants (workers, if any), in bytes; 0 for a process gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(rss(int(child)) for child in f.read().split())
    except (OSError, ValueError):
        pass
    return total


class PeakRss:
    """The highest RSS of a process while the block runs, read every 20 ms by a thread (the event loop is busy
    sending)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# --------------------------------------------------------------------------- the bodies

def filler(size: int) -> str:
    """`size` characters of random lowercase words, built once (each frame puts its own tag in front)."""
    rng = random.Random(7)
    block = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(12_000))
    return (block * (size // len(block) + 1))[:size]


def big_body(text: str, tag: str, size: int) -> str:
    """A streamed Responses body of `size` characters: one user message of the filler, tagged, so every frame
    is a new text (nothing deduplicated by hash)."""
    head = f'{{"model":"gpt-4o","stream":true,"input":[{{"type":"message","role":"user","content":"{tag} '
    tail = '"}]}'
    return head + text[:size - len(head) - len(tail)] + tail


def small_body(words: int = 3) -> str:
    """A small streamed turn; with 100 words its message is over 256 bytes, so the proxy loads its tokenizer."""
    text = " ".join(["warm"] * words)
    return json.dumps({"model": "gpt-4o", "stream": True, "input": [{"role": "user", "content": text}]})


def as_frame(body: str) -> str:
    """The `response.create` frame of a Responses body."""
    return '{"type":"response.create",' + body[1:]


async def open_socket(ws_url: str) -> ClientConnection:
    """A socket as a plain client opens one: no compression (a frame's bytes are the bytes on the wire), no
    frame size limit on answers, no environment proxy, no client pings (they would queue behind a stalled frame)."""
    return await connect(ws_url, additional_headers={"authorization": TOKEN}, compression=None, max_size=None,
                         proxy=None, ping_interval=None, close_timeout=1, open_timeout=30)


async def ws_turn(ws: ClientConnection, frame: str, timeout: float) -> str:
    """Send one turn and read its events to the last; the type of the last ('response.completed', 'error', ...)."""
    await ws.send(frame)
    async with asyncio.timeout(timeout):
        while True:
            kind = json.loads(await ws.recv()).get("type")
            if kind in ("response.completed", "response.failed", "response.incomplete", "error"):
                return str(kind)


async def warm(url: str) -> None:
    """One small turn over HTTP and one over a socket, with the provider answering at once: the tokenizer and
    every lazy import are loaded before anything is measured."""
    async with httpx.AsyncClient(timeout=60) as c:
        (await c.post(url + "/v1/responses", content=small_body(100), headers=HEADERS)).raise_for_status()
    ws = await open_socket(url.replace("http://", "ws://") + "/v1/responses")
    try:
        await ws_turn(ws, as_frame(small_body(100)), 60)
    finally:
        await ws.close()


# --------------------------------------------------------------------------- 1. memory per socket

async def flood_socket(ws_url: str, n: int, text: str, args: argparse.Namespace) -> tuple[ClientConnection, int]:
    """Socket `n`: a turn the provider holds (small, or `--turn-mb` MiB), then big frames until one waits `--stall`
    s. Returns the open socket and how many big frames it took."""
    ws = await open_socket(ws_url)
    held = big_body(text, f"s{n}held", int(args.turn_mb * MIB)) if args.turn_mb else small_body()
    await ws.send(as_frame(held))
    taken = 0
    for k in range(args.frames):
        try:  # a cancelled send leaves the socket unusable: it is dropped right after
            await asyncio.wait_for(ws.send(as_frame(big_body(text, f"s{n}f{k}", args.size))), args.stall)
        except TimeoutError:
            break
        taken += 1
    return ws, taken


async def flood_http(url: str, n: int, text: str, args: argparse.Namespace) -> tuple[asyncio.StreamWriter, int]:
    """POST `n`: one big body on its own connection (raw, so the upload's end is seen: the answer is held);
    1 if the proxy read it within `--stall` s."""
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    body = big_body(text, f"p{n}", args.size).encode()
    writer.write(f"POST /v1/responses HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: {TOKEN}\r\n"
                 f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    try:
        await asyncio.wait_for(writer.drain(), args.stall)
    except TimeoutError:
        return writer, 0
    return writer, 1


async def flood(procs: LoadProcesses, transport: str, text: str, args: argparse.Namespace) -> dict[str, Any]:
    """One transport on a fresh, warmed proxy: RSS before, and its peak while flooding and `--sample` s after."""
    url = await procs.start_healthy_proxy(restart=True)
    procs.mock_command(cmd="set", delay=0)
    await warm(url)
    procs.mock_command(cmd="set", delay=args.hold)
    assert procs.proxy is not None
    pid = procs.proxy.pid
    before = rss(pid)
    with PeakRss(pid) as peak:
        t0 = time.monotonic()
        if transport == "websocket":
            ws_url = url.replace("http://", "ws://") + "/v1/responses"
            sockets = await asyncio.gather(*(flood_socket(ws_url, n, text, args) for n in range(args.sockets)))
            taken, leave = [t for _, t in sockets], [ws.transport.abort for ws, _ in sockets]
        else:
            posts = await asyncio.gather(*(flood_http(url, n, text, args)
                                           for n in range(args.sockets * args.frames)))
            taken, leave = [sum(t for _, t in posts)], [w.transport.abort for w, _ in posts]
        sent_s = time.monotonic() - t0
        await asyncio.sleep(args.sample)
    for abort in leave:  # the clients leave without a goodbye; the proxy is restarted for the next transport
        abort()
    return {"transport": transport, "taken": taken, "sent_s": sent_s, "before": before, "peak": peak.peak,
            "growth": peak.peak - before}


# --------------------------------------------------------------------------- 2. /healthz while a big frame is in

def healthz_during(url: str, transport: str, body: bytes, timeout: float) -> dict[str, Any]:
    """One neighbour turn of `body` over `transport` with /healthz polled every POLL_EVERY_S; the latencies (s),
    what the neighbour got and how long it took."""
    with Poller(url, POLL_EVERY_S) as poller:
        time.sleep(0.1)
        t0 = time.perf_counter()
        try:
            if transport == "websocket":
                outcome = asyncio.run(_ws_neighbour(url, as_frame(body.decode()), timeout))
            else:
                outcome = str(httpx.post(url + "/v1/responses", content=body, headers=HEADERS,
                                         timeout=timeout).status_code)
        except (OSError, TimeoutError, httpx.HTTPError) as e:
            outcome = type(e).__name__
        took = time.perf_counter() - t0
        time.sleep(0.1)
    return {"latencies": poller.latencies, "errors": poller.errors, "outcome": outcome, "took_s": took}


async def _ws_neighbour(url: str, frame: str, timeout: float) -> str:
    ws = await open_socket(url.replace("http://", "ws://") + "/v1/responses")
    try:
        return await ws_turn(ws, frame, timeout)
    finally:
        await ws.close()


def healthz_runs(url: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """`--rounds` rounds of one WebSocket and one HTTP neighbour (which goes first alternates), each a new
    conversation; per transport, the polls of all its rounds."""
    out: dict[str, dict[str, Any]] = {t: {"latencies": [], "errors": 0, "outcomes": [], "took_s": []}
                                      for t in ("websocket", "http")}
    for r in range(args.rounds):
        for transport in ("websocket", "http") if r % 2 == 0 else ("http", "websocket"):
            _, body = neighbour("responses", args.items, args.chars, seed=int(time.time() * 1000))
            got = healthz_during(url, transport, body, args.timeout)
            acc = out[transport]
            acc["latencies"] += got["latencies"]
            acc["errors"] += got["errors"]
            acc["outcomes"].append(got["outcome"])
            acc["took_s"].append(round(got["took_s"], 1))
            acc["body_mb"] = len(body) / MIB
    return out


# --------------------------------------------------------------------------- report

def print_memory(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    per_socket, spelled = budget()
    turn = f"{args.turn_mb:g} MiB" if args.turn_mb else "small"
    print(f"1. memory: {args.sockets} sockets, each 1 held turn ({turn}) + {args.frames} frames of "
          f"{args.frame_mb:g} MiB; "
          f"the provider holds each answer {args.hold:g} s; a send waiting {args.stall:g} s ends a client's sending")
    print(f"   budget per socket = {spelled} = {per_socket / MIB:g} MiB")
    print(f"   {'path':<26} {'taken':>9} {'sent in':>8} {'RSS before':>11} {'peak':>9} {'growth':>9} "
          f"{'per socket':>11} {'growth/(N x budget)':>20}")
    for r in runs:
        what = (f"websocket ({args.sockets} sockets)" if r["transport"] == "websocket"
                else f"http ({args.sockets * args.frames} POSTs at once)")
        of = args.frames if r["transport"] == "websocket" else args.sockets * args.frames
        print(f"   {what:<26} {'+'.join(map(str, r['taken'])) + f'/{of}':>9} {r['sent_s']:>6.1f} s "
              f"{r['before'] / MIB:>7.0f} MiB {r['peak'] / MIB:>5.0f} MiB {r['growth'] / MIB:>5.0f} MiB "
              f"{r['growth'] / args.sockets / MIB:>7.0f} MiB {r['growth'] / (args.sockets * per_socket):>20.2f}")
    ws, http = (next(r for r in runs if r["transport"] == t) for t in ("websocket", "http"))
    if ws["growth"] > 0:
        print(f"   http / websocket growth for the same frames: {http['growth'] / ws['growth']:.1f}x")


def print_healthz(runs: dict[str, dict[str, Any]], quiet: dict[str, float], args: argparse.Namespace) -> None:
    print(f"2. /healthz every {POLL_EVERY_S * 1000:g} ms while a neighbour sends {args.items:,} items of "
          f"{args.chars} characters ({runs['websocket'].get('body_mb', 0):.1f} MiB) in one turn, "
          f"{args.rounds} round(s) each")
    print(_poll_row("quiet", quiet))
    fig = {t: figures(r["latencies"]) for t, r in runs.items()}
    for t, r in runs.items():
        print(_poll_row(t, fig[t]) + f"  neighbour {r['outcomes']} in {r['took_s']} s"
              + (f"  ({r['errors']} failed polls)" if r["errors"] else ""))
    ws, http = fig["websocket"], fig["http"]
    print(f"   websocket / http: p99 {ws['p99_ms'] / http['p99_ms']:.2f}x, "
          f"max {ws['worst_ms'] / http['worst_ms']:.2f}x")
    met = ws["worst_ms"] < TARGET_MS
    print(f"   verdict: target (/healthz under {TARGET_MS:g} ms while a WebSocket client sends {TARGET_ITEMS:,} "
          f"items) {'met' if met else 'NOT met'}: max {ws['worst_ms']:.1f} ms with {args.items:,} items")


def _poll_row(name: str, fig: dict[str, float]) -> str:
    return f"   {name:<10} {fig['polls']:>6} polls  p99 {fig['p99_ms']:>7.1f} ms  max {fig['worst_ms']:>7.1f} ms"


# --------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.ws_bounds", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sockets", type=int, default=2, help="flooding sockets (and x --frames HTTP POSTs)")
    ap.add_argument("--frames", type=int, default=8, help="big frames each socket tries to queue")
    ap.add_argument("--frame-mb", type=float, default=30.0, help="MiB per frame (under server.max_body_bytes)")
    ap.add_argument("--turn-mb", type=float, default=0.0,
                    help="MiB of the held turn itself (default: a few words; the HTTP side is unchanged)")
    ap.add_argument("--hold", type=float, default=40.0, help="seconds the provider holds an answer in part 1")
    ap.add_argument("--stall", type=float, default=10.0, help="seconds a send may wait before it counts as refused")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds RSS is watched after the last send")
    ap.add_argument("--items", type=int, default=300_000, help="input items of part 2's big frame")
    ap.add_argument("--chars", type=int, default=48, help="characters per item in part 2")
    ap.add_argument("--rounds", type=int, default=1, help="part 2's rounds per transport")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds part 2's neighbour turn may take")
    args = ap.parse_args(argv)
    args.size = int(args.frame_mb * MIB)
    limit = ServerSettings().max_body_bytes - 1024
    if not 0 < args.size <= limit or args.turn_mb * MIB > limit or args.sockets < 1 or args.frames < 1:
        ap.error(f"--frame-mb must stay under server.max_body_bytes ({ServerSettings().max_body_bytes / MIB:g} MiB); "
                 "--sockets and --frames at least 1")
    if args.sample + args.stall * 2 >= args.hold:
        ap.error("--hold must outlast the sending and the sampling (--hold > --sample + 2 x --stall)")
    return args


async def memory(procs: LoadProcesses, args: argparse.Namespace) -> list[dict[str, Any]]:
    text = filler(args.size)
    return [await flood(procs, transport, text, args) for transport in ("websocket", "http")]


async def fresh_proxy(procs: LoadProcesses) -> str:
    """A new proxy with the provider answering at once, warmed."""
    procs.mock_command(cmd="set", delay=0)
    url = await procs.start_healthy_proxy(restart=True)
    await warm(url)
    return url


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # The proxy runs as `python -m proxy.cli` from a temporary directory: it imports what PYTHONPATH puts first
    # (bench.all's snapshot), else this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p)
    m = machine_facts()
    print(f"ctxproxy {m['git']}; {m['cpu_count']} CPUs, load {m['loadavg_at_start']}; python {m['python']}")
    with tempfile.TemporaryDirectory(prefix="ctxproxy-ws-bounds-") as tmp:
        procs = LoadProcesses(tmp, [sys.executable, "-m", "proxy.cli"])
        try:
            procs.start_mock()
            mem = asyncio.run(memory(procs, args))
            print_memory(mem, args)
            url = asyncio.run(fresh_proxy(procs))
            with Poller(url, POLL_EVERY_S) as quiet:
                time.sleep(1.0)
            print_healthz(healthz_runs(url, args), figures(quiet.latencies), args)
        finally:
            procs.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
