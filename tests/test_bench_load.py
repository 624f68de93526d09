"""`duplex bench load` and `soak` (agent.bench.load) against an in-process server wired as
`duplex serve` wires it (test_serving.serving), with the test doubles for models: three
conversations against a cap of two are counted admitted 2, refused 1 (503 with its reason),
dropped 0, with both voice-to-voice figures, lag and RSS from /metrics, and a conversation served
right after; a short soak reports RSS at its marks and no failures."""
from __future__ import annotations

import io

import numpy as np
import pytest
from doubles import burst
from test_serving import serving

from agent.bench.load import (
    make_question,
    one_conversation,
    print_load,
    print_soak,
    run_load,
    run_soak,
    ws_url,
)

pytestmark = pytest.mark.usefixtures("virtual_clock")

RATE = 16000


def question():
    return make_question("burst", "what time is it", np.concatenate([burst(1.0, seed=1),
                                                                     np.zeros(int(0.3 * RATE), np.float32)]))


def test_urls():
    assert ws_url("ws://127.0.0.1:8080") == "ws://127.0.0.1:8080/ws"
    assert ws_url("ws://127.0.0.1:8080/", "a b") == "ws://127.0.0.1:8080/ws?token=a+b"
    assert ws_url("wss://h:1/ws?x=1", "t") == "wss://h:1/ws?x=1&token=t"


async def test_load_against_a_cap_of_two():
    q = question()
    async with serving(max_sessions=2) as s:
        report = await run_load(f"ws://127.0.0.1:{s.port}", [q], sessions=3, seconds=5.0, stagger_s=0.2,
                                reply_timeout=15.0)
    assert (report["admitted"], report["refused"], report["dropped"], report["failed"]) == (2, 1, 0, 0), report
    refused = [o for o in report["outcomes"] if o["result"] == "refused"]
    reason = refused[0]["reason"]  # the server's 503 body
    assert refused[0]["index"] == 2 and reason.startswith("HTTP 503: ") and "full: 2 of 2" in reason
    for o in report["outcomes"][:2]:
        assert o["result"] == "served" and o["heard"] == "what time is it" and o["reply"] == "It is noon."
        assert 0 < o["client_v2v_ms"] < 5000 and 0 < o["server_v2v_ms"] < 5000
    assert report["client_v2v_ms"]["n"] == report["server_v2v_ms"]["n"] == 2
    assert report["sessions_counted"] == {"served": 2, "refused": 1, "failed": 0}
    assert report["lag"]["samples"] > 0 and report["lag"]["mean_ms"] is not None
    assert report["rss_mib"]["before"] > 0 and report["rss_mib"]["after"] > 0
    after = report["after"]
    assert after["result"] == "served" and after["server_v2v_ms"] is not None

    out = io.StringIO()
    print_load(report, out)
    text = out.getvalue()
    assert "admitted 2  refused 1  dropped 0  failed to connect 0" in text
    c, sv = report["client_v2v_ms"], report["server_v2v_ms"]
    assert f"p50 {c['p50']:.0f} ms  p90 {c['p90']:.0f} ms  max {c['max']:.0f} ms" in text
    assert f"p50 {sv['p50']:.0f} ms  p90 {sv['p90']:.0f} ms  max {sv['max']:.0f} ms" in text
    assert f"1 x refused: {reason}" in text
    assert f"event-loop lag (server /metrics, {report['lag']['samples']} samples during the run): mean" in text
    assert f"RSS (server): before {report['rss_mib']['before']:.1f} MiB" in text
    assert "server's count during the run: served 2  refused 1  failed 0" in text
    assert "after the run, one conversation alone: served" in text


async def test_soak_reports_rss_at_its_marks():
    async with serving() as s:
        report = await run_soak(f"ws://127.0.0.1:{s.port}/ws", [question()], conversations=3, seconds=5.0,
                                reply_timeout=15.0, marks=(1, 2))
    assert report["failures"] == 0 and report["served"] == 3
    assert sorted(report["rss_mib"]) == [1, 2, 3] and all(v > 0 for v in report["rss_mib"].values())
    out = io.StringIO()
    print_soak(report, out)
    text = out.getvalue()
    assert "failures 0 (refused 0  dropped 0  failed to connect 0); served 3" in text
    assert f"after 3: {report['rss_mib'][3]:.1f}" in text
    assert "RSS growth after the first 10: n/a" in text  # fewer than 10


async def test_a_reply_still_playing_at_the_bound_is_served_not_dropped():
    from test_serving import doubles

    long_reply = " ".join(["word"] * 40) + "."  # about 5 s of tone
    async with serving(models=doubles(long_reply)) as s:
        o = await one_conversation(ws_url(f"ws://127.0.0.1:{s.port}"), question(), 0, seconds=3.0,
                                   reply_timeout=15.0, finish_timeout=1.0)
    assert o.result == "served" and "still playing" in o.reason and o.client_v2v_ms is not None
    assert o.server_v2v_ms is None  # its latency event comes when the reply ends
