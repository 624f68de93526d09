"""Fuzzing over real sockets (issue 17): scripts/fuzz_sockets.py against a server wired as
`duplex serve` wires it (agent.serving.Server: every phone route and the AudioSocket port),
with the test doubles for models. A few hundred random and mutated messages per route, normal
conversations alongside and after; nothing may escape as an unexpected exception, no
conversation may be left behind. `python scripts/fuzz_sockets.py --self-serve` is the long run."""
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


@pytest.mark.timeout(180)
async def test_fuzzed_sockets_leave_the_server_serving(caplog):
    caplog.set_level(logging.WARNING)
    port, as_port = free_port(), free_port()
    async with fuzz_sockets.doubles_server(port, as_port) as server:
        target = fuzz_sockets.Target("127.0.0.1", port, as_port)
        report = await fuzz_sockets.run_fuzz(target, messages=500, seed=17, speech="noise", hang_s=30,
                                             conversation_timeout=30, max_seconds=150)
        print(report.table())
        assert await await_until(lambda: server.admission.live == 0, timeout=30), "conversations left behind"
    gc.collect()  # a task that failed unseen is reported when it is collected
    assert report.failures == []
    for stats in report.routes.values():
        assert stats.sent == 500 and stats.connections >= 2, stats.summary()
        assert not stats.hung
    assert report.routes["/ws"].errors, "bad messages on /ws are answered with error events"
    assert [c.ok for c in report.conversations if c.when == "after"] == [True]
    assert all(c.ok and c.final == "what time is it" and c.audio_frames for c in report.conversations)
    assert unexpected(caplog.records) == []
