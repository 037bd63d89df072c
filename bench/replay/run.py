"""One setting over every trajectory: start what it needs in front of the mock, replay, sum up."""

from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
import time
from typing import Any

import httpx

from bench import external_proxies as ext
from bench import fake_llm
from bench.replay.apis import CHAT, AnyTrace, Api
from bench.replay.compaction import load_proxy_history
from bench.replay.native import NativeMessagesTrace, NativeTrace
from bench.replay.settings import MODEL, Setting
from bench.replay.targets import (
    cpu_seconds,
    external_state,
    free_port,
    proxy_inprocess,
    proxy_log,
    proxy_log_for,
    proxy_subprocess,
)
from bench.replay.turns import aggregate, replay_trace
from tests import mock_upstream as mu

REQUEST_TIMEOUT = 300.0  # seconds, per request (bounded: nothing here waits forever)


def replay_setting(setting: Setting, traces: list[AnyTrace], mock: mu.MockUpstream, window: int,
                   proxy_mode: str, final_turn: bool = False, progress: bool = True,
                   proxy_src: str | None = None, api: Api = CHAT, corpus: str = "trajectories") -> dict[str, Any]:
    """Every trajectory through `setting` in `api`, with the mock reset first; the setting's result (totals,
    trajectories), marked with the API and the corpus (`trajectories`: the chat corpus; `native`: the
    recorded sessions, Codex's in the Responses API, Claude Code's in the Messages API).

    A setting whose proxy cannot be installed or started is returned as "unavailable", with the exact error,
    so the other settings still run; so is one that has no form in `api` (the open-source proxies are replayed
    in chat only; a client-side transform has no chat messages to cut in a native session).
    """
    where = {"api": api.name, "corpus": corpus}
    if api is not CHAT and setting.external:
        return {**_unavailable(setting, "api", f"{setting.name} is replayed in chat only"), **where}
    if setting.transform is not None and any(isinstance(t, NativeTrace | NativeMessagesTrace) for t in traces):
        return {**_unavailable(setting, "api", f"{setting.name} transforms chat messages; the native sessions "
                                                "have none"), **where}
    mock.reset()
    mock.default_window = window
    mock.windows[MODEL] = window
    # the proxies' own summary / notes calls get a deterministic digest of what they send (bench/fake_llm.py);
    # every other request gets "ok", as before. Bounded queue, far above what any setting uses.
    mock.script(*[fake_llm.respond] * (20 * sum(len(t.turns(final_turn)) for t in traces) + 1000))
    history = load_proxy_history(proxy_src) if setting.proxied else None
    with tempfile.TemporaryDirectory(prefix=f"replay-{setting.name}-") as tmp:
        proxy_info: dict[str, Any] = {}
        cm: contextlib.AbstractContextManager[dict[str, Any]]
        if setting.proxied:
            runner = proxy_subprocess if proxy_mode == "subprocess" else proxy_inprocess
            cm = runner(setting.config_for(window), mock.base_url, tmp, proxy_src)
        elif setting.external:
            spec = ext.EXTERNALS[setting.external]
            try:
                proxy_info["install"] = ext.ensure_installed(
                    spec, log=lambda m: print(f"  {setting.name}: {m}", file=sys.stderr, flush=True))
            except ext.ExternalUnavailable as err:
                return {**_unavailable(setting, "install", str(err)), **where}
            cm = ext.running(spec, free_port(), mock.base_url[:-len("/v1")], window, tmp)
        else:
            cm = contextlib.nullcontext({"url": None, "log": None, "cmd": None, "start_s": 0.0, "pid": None})
        try:
            with cm as info, httpx.Client(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10.0)) as client:
                base = info["url"] + "/v1" if info["url"] else mock.base_url
                rows = []
                t0 = time.perf_counter()
                for trace in traces:
                    t1 = time.perf_counter()
                    row = replay_trace(client, base, setting, trace, mock, final_turn, window, history, api)
                    row["wall_s"] = round(time.perf_counter() - t1, 3)
                    rows.append(row)
                    if progress:
                        label = setting.name if api is CHAT else f"{setting.name} [{api.name}, {corpus}]"
                        print(f"  {label:<24} {trace.id} {row['requests']:>4} req {row['rejected']:>3} rej "
                              f"{row['prompt_tokens']:>10,} tok {row['wall_s']:7.2f}s", file=sys.stderr, flush=True)
                wall = time.perf_counter() - t0
                if info["cmd"]:
                    proxy_info.update(cmd=" ".join(shlex.quote(c) for c in info["cmd"]),
                                      start_s=round(info["start_s"], 3), cpu_s=cpu_seconds(info["pid"]))
                if setting.external and info.get("log"):
                    with open(info["log"], errors="replace") as f:
                        proxy_info["log_tail"] = f.read()[-4000:]
                    proxy_info["state"] = external_state(info.get("state"))
        except ext.ExternalUnavailable as err:
            return {**_unavailable(setting, "start", str(err)), **where}
        except RuntimeError as err:  # ctxproxy did not start (e.g. a config section an older --proxy-src lacks)
            if not setting.proxied:
                raise
            return {**_unavailable(setting, "start", str(err)), **where}
        if setting.proxied and info["log"]:
            proxy_info.update(proxy_log(info["log"]))
            failed = [(row["trace"], q) for row in rows for q in row["rows"] if q.get("proxy_request_id")]
            said = proxy_log_for(info["log"], {q["proxy_request_id"] for _, q in failed})
            keep = ("status", "error", "client_messages", "attempted_prompt_tokens", "compacted", "tokens_before",
                    "tokens_after", "summary_rejected", "proxy_call_kinds")
            proxy_info["rejected"] = [{"trace": tid, "turn": q["turn"], **{k: q[k] for k in keep if k in q},
                                       "log": said.get(q["proxy_request_id"], [])} for tid, q in failed]
        if mock.errors:
            proxy_info["mock_errors"] = list(mock.errors)
    total = aggregate([r for row in rows for r in row["rows"]])
    total.update(wall_s=round(wall, 3), client_s=round(sum(r["client_s"] for r in rows), 3),
                 pairing_problems=sum(r["pairing_problems"] for r in rows),
                 pairing_problems_strict=sum(r["pairing_problems_strict"] for r in rows),
                 client_pairing_problems=sum(r["client_pairing_problems"] for r in rows))
    ids = [r["identifiers"] for r in rows]
    total["identifiers"] = {k: sum(x[k] for x in ids) for k in ("total", "kept", "after_head", "after_head_kept")}
    if setting.proxied:
        total["rewrites"] = _sum_rewrites([r["rewrites"] for r in rows])
    return {"setting": setting.name, "description": setting.description, **where,
            "proxy_config": setting.config_for(window) if setting.proxied else None,
            "proxy": proxy_info, "total": total, "traces": rows}


def _unavailable(setting: Setting, stage: str, error: str) -> dict[str, Any]:
    print(f"  {setting.name}: not run ({stage} failed):\n{error}", file=sys.stderr, flush=True)
    return {"setting": setting.name, "description": setting.description, "unavailable": {"stage": stage,
                                                                                          "error": error}}


def _sum_rewrites(parts: list[dict[str, Any]]) -> dict[str, Any]:
    shares = [p["max_preview_share"] for p in parts if p["max_preview_share"] is not None]
    return {
        "messages_checked": sum(p["messages_checked"] for p in parts),
        "rewritten_messages": sum(p["rewritten_messages"] for p in parts),
        "original_tokens": sum(p["original_tokens"] for p in parts),
        "preview_tokens": sum(p["preview_tokens"] for p in parts),
        "max_preview_share": max(shares) if shares else None,
        "preview_not_smaller": sum(len(p["preview_not_smaller"]) for p in parts),
        "unstable_rewrites": sum(len(p["unstable_rewrites"]) for p in parts),
        "altered_without_placeholder": sum(len(p["altered_without_placeholder"]) for p in parts),
        "placeholder_without_read_tool": sum(len(p["placeholder_without_read_tool"]) for p in parts),
        "fewer_messages_upstream": sum(len(p["fewer_messages_upstream"]) for p in parts),
        "over_threshold_not_offloaded": sum(len(p["over_threshold_not_offloaded"]) for p in parts),
    }
