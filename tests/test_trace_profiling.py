"""Memory sampler counters and the torch.profiler hook."""
import asyncio
import json

import pytest

from agent.tracing.profiling import MemorySampler, profile_path_for, profile_region, rss_mb, torch_profiler
from agent.tracing.trace import Tracer
from agent.tracing.export import to_perfetto


def test_rss_is_plausible():
    assert 5.0 < rss_mb() < 1 << 20


def test_memory_sampler_writes_counter_track():
    tr = Tracer("s")

    async def run():
        async with MemorySampler(tr, period_s=0.005, gpu=False) as m:
            assert m.running
            await asyncio.sleep(0.05)
        assert not m.running
        return m.samples

    n = asyncio.run(run())
    evs = [e for e in tr.events() if e.ph == "C"]
    assert n >= 3 and len(evs) == n
    assert all(e.stage == "memory" and e.name == "rss_mb" and e.args["value"] > 0 for e in evs)
    ts = [e.ts_ns for e in evs]
    assert ts == sorted(ts)
    doc = to_perfetto(tr)
    counters = [te for te in doc["traceEvents"] if te["ph"] == "C"]
    assert len(counters) == n and all("rss_mb" in te["args"] for te in counters)


def test_memory_sampler_rejects_bad_period():
    with pytest.raises(ValueError):
        MemorySampler(Tracer("s"), period_s=0)


def test_profile_path_next_to_trace():
    assert profile_path_for("out/a.trace.json") == "out/a.torch.json"
    assert profile_path_for("out/a.jsonl") == "out/a.torch.json"


def test_torch_profiler_writes_chrome_trace(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "x.torch.json"
    with profile_region("outside"):  # no profiler: a no-op
        pass
    with torch_profiler(str(p)):
        with profile_region("asr.step"):
            torch.ones(8, 8) @ torch.ones(8, 8)
    doc = json.loads(p.read_text())
    assert any(te.get("name") == "asr.step" for te in doc["traceEvents"])
