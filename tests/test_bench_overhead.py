"""The overhead benchmark's wiring: each client API it measures goes through each of its targets.

`python -m bench.overhead` takes minutes; this starts its own processes the
way it does (bench/overhead/processes.py: the mock subprocess, `ctxproxy serve`
with only ``CTXPROXY_UPSTREAM`` pointing at the mock, the floor) and sends one
request of each kind, so a route the proxy's config lacks, a header the floor
drops or a body the mock refuses fails here rather than halfway through a run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson

from bench.overhead.client import Target, chat_body, messages_body, responses_body
from bench.overhead.config import DIRECT, FLOOR, MESSAGES_AUTH, MESSAGES_MODEL, PROXY, SMALL_MESSAGES
from bench.overhead.processes import Processes, wait_healthy


def test_the_messages_body_is_what_anthropic_takes() -> None:
    body = orjson.loads(messages_body(SMALL_MESSAGES))
    assert body["model"] == MESSAGES_MODEL and MESSAGES_MODEL.startswith("claude-")
    assert body["system"] == SMALL_MESSAGES[0]["content"] and body["max_tokens"] > 0
    assert body["messages"] == [{"role": "user", "content": SMALL_MESSAGES[1]["content"]}]
    assert MESSAGES_AUTH["anthropic-version"] == "2023-06-01" and "authorization" not in MESSAGES_AUTH


async def _each_api_through_each_target(procs: Processes) -> dict[str, dict[str, list[str]]]:
    mock_url = procs.start_mock()
    proxy_url, floor_url = procs.start_proxy(), procs.start_floor()
    async with aiohttp.ClientSession() as session:
        assert procs.proxy is not None and procs.floor is not None
        await wait_healthy(session, proxy_url, procs.proxy, procs.proxy_log)
        await wait_healthy(session, floor_url, procs.floor, procs.floor_log, what="floor")
        targets = [Target(DIRECT, mock_url, session), Target(PROXY, proxy_url + "/v1", session),
                   Target(FLOOR, floor_url + "/v1", session)]
        for t in targets:  # each raises on anything but a 200 with the API's own answer object
            assert await t.post(chat_body(SMALL_MESSAGES), "chat") > 0
            assert await t.post_responses(responses_body(SMALL_MESSAGES), "responses") > 0
            assert await t.post_messages(messages_body(SMALL_MESSAGES), "messages") > 0
        return {t.name: t.request_ids for t in targets}


def test_each_api_goes_through_the_mock_the_proxy_and_the_floor(tmp_path: Path) -> None:
    procs = Processes(str(tmp_path), None)
    try:
        ids = asyncio.run(_each_api_through_each_target(procs))
    finally:
        procs.stop()
    # ctxproxy handled each one itself (its request id came back), the others are not ctxproxy
    assert {k: len(v) for k, v in ids[PROXY].items()} == {"chat": 1, "responses": 1, "messages": 1}
    assert ids[DIRECT] == {} and ids[FLOOR] == {}


def test_the_floor_targets_are_read_off_one_runs_medians_and_throughput() -> None:
    from bench.overhead.targets import floor_targets

    def sc(direct: float, floor: float, proxy: float) -> dict[str, dict[str, float]]:
        return {"direct": {"median": direct}, "floor": {"median": floor}, "proxy": {"median": proxy}}

    res = {"scenarios": {"small": sc(1.0, 2.0, 2.5), "small_messages": sc(1.0, 2.0, 2.6), "long": sc(10.0, 12.0, 14.0),
                         "c16_rps": {"direct": {"rps": 900.0}, "floor": {"rps": 400.0}, "proxy": {"rps": 299.0}}}}
    rows = {r["scenario"]: r for r in floor_targets(res)}
    assert set(rows) == {"small", "small_messages", "long", "c16_rps"}  # only what ran
    assert (rows["small"]["value"], rows["small"]["met"]) == (1.5, True)
    assert rows["small_messages"]["met"] is False  # 1.6 > 1.5
    assert (rows["long"]["value"], rows["long"]["met"]) == (2.0, True)
    assert rows["c16_rps"]["value"] == 299.0 / 400.0 and rows["c16_rps"]["met"] is False


def test_a_scenario_with_degraded_requests_meets_no_target() -> None:
    """A request forwarded unmodified skipped the proxy's work: its speed says nothing of the proxy."""
    from bench.overhead.targets import floor_targets

    res = {"scenarios": {"small": {"direct": {"median": 1.0}, "floor": {"median": 2.0}, "proxy": {"median": 2.2}},
                         "c16_rps": {"direct": {"rps": 900.0}, "floor": {"rps": 400.0}, "proxy": {"rps": 390.0}}},
           "proxy_log": {"small": {"degraded": 0}, "c16": {"degraded": 3}}}
    rows = {r["scenario"]: r for r in floor_targets(res)}
    assert rows["small"]["met"] is True
    assert (rows["c16_rps"]["met"], rows["c16_rps"]["degraded"]) == (False, 3)


def test_the_long_body_throughput_target_is_read_from_its_own_scenario():
    from bench.overhead.targets import floor_targets
    res = {"scenarios": {"c16_long_rps": {"direct": {"rps": 90.0}, "floor": {"rps": 40.0}, "proxy": {"rps": 21.0}}},
           "proxy_log": {"c16_long": {"degraded": 0}}}
    (row,) = floor_targets(res)
    assert (row["scenario"], row["bound"], row["value"], row["met"]) == ("c16_long_rps", 0.5, 21.0 / 40.0, True)
