"""`duplex asr-bench --engine-throughput`: the benchmark runs and prints one row per batch size."""
import re

import pytest

from asr.bench.load import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # figures of one window each: keep them steady


def test_engine_throughput_prints_a_row_per_batch_size(capsys):
    assert main(["--engine-throughput", "--steps", "200", "--sizes", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "interleaved rounds" in out and "single stream: step" in out
    rows = {int(m.group(1)): [float(x) for x in m.group(2).split()]
            for m in re.finditer(r"^ *(\d+) +([\d. ]+)$", out, re.M)}
    assert set(rows) == {1, 2}
    step_ms, mimi_ms, batched, sequential, ratio, ratio_per_b, _ = rows[2]
    assert 0 < mimi_ms < step_ms  # the encoder is a part of the step (medians of 10 rounds)
    assert abs(batched - 2000 / step_ms) <= 1  # streams x frames per second
    assert rows[1][4] == 1.0  # the single stream against itself
    assert abs(ratio_per_b - ratio / 2) < 0.01


def test_the_memory_flood_at_full_speed_is_held_at_the_servers_cap():
    """`--memory --flood-speed 0`: the client sends as fast as the server reads; the server's
    buffer fills to its cap and no further (the client's sends wait)."""
    import asyncio

    from asr.bench.load import SAMPLE_RATE as SR, memory_flood

    samples = asyncio.run(memory_flood(60, 0))
    buffered = [b for *_, b in samples]
    assert len(samples) == 20 and max(buffered) <= 10 * SR
    assert max(buffered) >= 5 * SR, buffered  # it was flooded: the cap, not the pace, held it


def scheduler_rows(out: str) -> dict[int, list[float]]:
    return {int(m.group(1)): [float(x) for x in m.group(2).split()]
            for m in re.finditer(r"^ *(\d+) +([\d. ]+)$", out, re.M)}


def test_scheduler_mode_prints_a_row_per_conversation_count(capsys):
    """`--scheduler`: N conversations through the in-process EngineScheduler (no sockets); with
    aligned frames every tick steps them all, and one conversation takes one tick per frame."""
    frames = 10  # 0.8 s of audio, sent at 4x real time
    assert main(["--scheduler", "--sizes", "1", "2", "--seconds", str(frames * 0.08), "--speed", "4",
                 "--phase", "aligned", "--no-tune-convs"]) == 0
    out = capsys.readouterr().out
    assert "in-process EngineScheduler" in out
    rows = scheduler_rows(out)
    assert set(rows) == {1, 2}
    ticks, p50, p99, per_step, all_n, rtf, lat50, lat99 = rows[1]
    assert ticks == frames + 2 + 2  # the frames, then the flush: the tiny model's delay (2) + 2
    assert per_step == 1.0 and all_n == 1.0
    assert 0 < p50 <= p99 and rtf > 0 and 0 < lat50 <= lat99
    ticks, *_, per_step, all_n, rtf, _, _ = rows[2]
    assert ticks >= frames + 4 and 1.5 < per_step <= 2.0 and 0.0 <= all_n <= 1.0 and rtf > 0


def test_price_per_hour_prints_the_cost_per_stream_hour_of_the_streams_held(capsys):
    """`--price-per-hour`: the device's price shared by the streams that held real time, in
    cents per stream-hour; a run that fell behind gets no figure, and says why."""
    from asr.bench.load import MAX_LAG_S, cents_per_stream_hour

    assert cents_per_stream_hour(6.0, 400) == pytest.approx(1.5)  # the seed: Kyutai on an H100
    assert main(["--clients", "2", "--seconds", "1.6", "--price-per-hour", "0.10", "--no-tune-convs"]) == 0
    out = capsys.readouterr().out
    lag = float(re.search(r"lag after the audio's end \(all words in\): max=([\d.]+) s", out).group(1))
    cost = re.search(r"^cost: .*$", out, re.MULTILINE).group(0)
    if lag <= MAX_LAG_S:
        assert cost.startswith("cost: $0.1/h / 2 streams at real time = 5.00 c/stream-hour"), cost
        assert "Kyutai ~400 streams/H100 ~1.5 c" in cost and "~15 c" in cost
    else:  # a CPU too busy to hold even two: no figure, and the reason
        assert "none computed" in cost and "fell behind" in cost, cost
