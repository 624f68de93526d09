"""Fuzzing over real sockets (issues 17 and 40): scripts/fuzz_sockets.py against a server wired
as `duplex serve` wires it (agent.serving.server.Server: every phone route and the AudioSocket port),
with its guards on (the token, each carrier's signature, a short idle timeout) and the test
doubles for models. A few hundred random and mutated messages per route, the WebRTC offer and
config and the data channel included; idle pages, slow upgrades and more pages than the cap;
normal conversations alongside and after; nothing may escape as an unexpected exception, no
conversation may be left behind, /readyz is 200 afterwards. `python scripts/fuzz_sockets.py
--self-serve` is the long run."""
from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import pytest
from helpers import await_until, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import fuzz_sockets

UNEXPECTED = ("session failed", "Task exception was never retrieved", "Exception in callback",
              "connection handler failed", "Traceback")


def unexpected(records: list[logging.LogRecord]) -> list[str]:
    return [f"{r.name} {r.levelname} {r.getMessage()[:300]}" for r in records
            if r.levelno >= logging.ERROR or r.exc_info or any(p in r.getMessage() for p in UNEXPECTED)
            or "ended abnormally" in r.getMessage() and "Error" in r.getMessage()]


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("virtual_clock")
async def test_fuzzed_sockets_leave_the_server_serving(caplog):
    caplog.set_level(logging.WARNING)
    port, as_port = free_port(), free_port()
    secrets = fuzz_sockets.GUARDED
    async with fuzz_sockets.doubles_server(port, as_port, max_sessions=8, secrets=secrets, idle_s=3.0) as server:
        target = fuzz_sockets.Target("127.0.0.1", port, as_port, secrets=secrets, max_sessions=8)
        report = await fuzz_sockets.run_fuzz(target, messages=500, seed=17, speech="noise", hang_s=30,
                                             conversation_timeout=30, max_seconds=200, holders=(3, 3),
                                             idle_wait_s=30)
        print(report.table())
        assert await await_until(lambda: server.admission.live == 0, timeout=30), "conversations left behind"
    gc.collect()  # a task that failed unseen is reported when it is collected
    assert report.failures == []
    for stats in report.routes.values():
        assert stats.sent == 500 and stats.connections >= 2, stats.summary()
        assert not stats.hung
        assert not stats.refused.get(401) and not stats.refused.get(403), stats.summary()  # the guards let it in
    h = report.holders
    assert h.idle_ended_by_server == h.idle_sent == 3 and h.idle_codes["idle_timeout"] == 3, h.summary()
    assert h.slow_closed_by_server == h.slow_sent == 3, h.summary()
    assert 0 < h.over_cap_opened <= 8 and h.over_cap_refused[503] >= 4, h.summary()
    assert report.readyz_after == 200 and report.sessions_after == 0
    assert report.routes["datachannel"].liveness_ok >= 2
    offers = report.routes["/webrtc/offer"].answers
    assert not [k for k in offers if k.startswith("HTTP 5") and k != "HTTP 503"], offers  # no server errors
    assert report.routes["/ws"].errors, "bad messages on /ws are answered with error events"
    assert [c.ok for c in report.conversations if c.when == "after"] == [True]
    assert all(c.ok and c.final == "what time is it" and c.audio_frames for c in report.conversations)
    assert unexpected(caplog.records) == []
