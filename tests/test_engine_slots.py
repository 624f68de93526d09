"""Slot isolation, reset hygiene and fixed memory of the batched engine (tiny random models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.engine.engine import StreamingEngine
from asr.engine.kyutai import engine_from_hf
from asr.engine.mimi import _StreamConv
from helpers import ENGINE_FRAME, engine_audio

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW = 8
FRAME = ENGINE_FRAME


def _run_schedule(engine: StreamingEngine, schedule: dict[int, tuple[int, np.ndarray]], ticks: int,
                  idle: dict[int, set[int]], garbage_seed: int):
    """Run several streams; schedule[row] = (start tick, audio). Rows tick only when not idle.

    Returns, per row, the list of (tokens, logits) of its own frames. Idle and unused rows get
    random garbage pcm (seeded by `garbage_seed`).
    """
    B = engine.batch_size
    rng = np.random.default_rng(garbage_seed)
    cursor = {row: 0 for row in schedule}
    out = {row: ([], []) for row in schedule}
    for tick in range(ticks):
        pcm = (rng.standard_normal((B, FRAME)) * 10).astype(np.float32)
        active = np.zeros(B, bool)
        reset = []
        for row, (start, audio) in schedule.items():
            if tick == start:
                reset.append(row)
            if tick >= start and tick not in idle.get(row, ()) and cursor[row] < audio.size // FRAME:
                f = cursor[row]
                pcm[row] = audio[f * FRAME:(f + 1) * FRAME]
                active[row] = True
                cursor[row] += 1
        tokens = engine.step(pcm, active, reset=reset)
        for row in schedule:
            if active[row]:
                out[row][0].append(int(tokens[row]))
                out[row][1].append(engine.logits[row].clone())
    for row, (start, audio) in schedule.items():
        assert cursor[row] == audio.size // FRAME, "schedule too short"
    return {row: (toks, torch.stack(lg)) for row, (toks, lg) in out.items()}


@pytest.fixture(params=["onednn", "c-rows", "c-dots"])
def conv_path(request) -> str:
    """The Mimi conv path of every engine in a test: torch's oneDNN, or the C kernel."""
    return request.param


def _engine(hf, batch_size: int, path: str) -> StreamingEngine:
    engine = engine_from_hf(hf, batch_size=batch_size)
    engine.mimi.use_conv_path(path)
    return engine


def _alone(hf, audio: np.ndarray, path: str = "onednn"):
    engine = _engine(hf, 1, path)
    res = _run_schedule(engine, {0: (0, audio)}, audio.size // FRAME, {}, garbage_seed=99)
    return res[0]


def test_slots_are_isolated(hf, conv_path):
    frames = 3 * WINDOW
    audios = {row: engine_audio(10 + row, frames) for row in range(5)}
    starts = {0: 0, 1: 3, 2: 7, 3: 11, 4: 2}
    idle = {1: {5, 6, 20}, 2: {9, 10, 11, 12}, 3: {14}, 4: set(range(4, 12))}
    ticks = max(starts.values()) + frames + 12
    engine = _engine(hf, 6, conv_path)  # row 5 is never used: garbage only
    got = _run_schedule(engine, {r: (starts[r], audios[r]) for r in audios}, ticks, idle, garbage_seed=1)
    for row, audio in audios.items():
        tokens, logits = _alone(hf, audio, conv_path)
        assert got[row][0] == tokens, f"row {row} tokens differ from running alone"
        torch.testing.assert_close(got[row][1], logits, atol=1e-4, rtol=1e-4)


def test_slot_output_independent_of_other_slots_inputs(hf, conv_path):
    frames = 3 * WINDOW
    mine = engine_audio(1, frames)
    runs = []
    for other_seed in (2, 3):
        engine = _engine(hf, 4, conv_path)
        schedule = {0: (2, mine), 1: (0, engine_audio(other_seed, frames)), 3: (5, engine_audio(other_seed + 7, frames))}
        runs.append(_run_schedule(engine, schedule, frames + 10, {1: {4, 5}}, garbage_seed=other_seed))
    assert runs[0][1][0] != runs[1][1][0], "the other slot's inputs should differ"
    assert runs[0][0][0] == runs[1][0][0]
    assert torch.equal(runs[0][0][1], runs[1][0][1])


def _poison_row(engine: StreamingEngine, row: int) -> None:
    with torch.no_grad():
        engine.k_cache[:, row] = float("nan")
        engine.v_cache[:, row] = float("nan")
        engine.k_cache[:, row, :, :, :1] = float("inf")
        engine.kpos[row] = torch.randint(-5, 10**9, engine.kpos[row].shape)
        engine.pos[row] = 123456789
        engine.text[row] = 7
        engine.logits[row] = float("nan")
        m = engine.mimi
        m.k_cache[:, row] = float("nan")
        m.v_cache[:, row] = float("inf")
        m.kpos[row] = 5
        m.pos[row] = 10**7
        m.fresh[row] = False
        for conv in m.modules():
            if isinstance(conv, _StreamConv):
                conv.cache[row] = float("nan")


def test_reset_slot_is_bit_identical_to_fresh_pool(hf, conv_path):
    frames = 3 * WINDOW
    audio = engine_audio(5, frames)
    dirty = _engine(hf, 3, conv_path)
    _run_schedule(dirty, {1: (0, engine_audio(6, frames)), 2: (0, engine_audio(7, frames))}, frames, {}, garbage_seed=3)
    _poison_row(dirty, 1)
    _poison_row(dirty, 0)
    fresh = _engine(hf, 3, conv_path)
    a = _run_schedule(dirty, {1: (0, audio)}, frames, {}, garbage_seed=4)[1]
    b = _run_schedule(fresh, {1: (0, audio)}, frames, {}, garbage_seed=4)[1]
    assert a[0] == b[0]
    assert torch.equal(a[1], b[1])
    assert torch.isfinite(a[1]).all()


def test_poisoned_neighbour_does_not_leak(hf, conv_path):
    """NaN in an idle row's state never reaches an active row."""
    frames = 2 * WINDOW
    audio = engine_audio(8, frames)
    engine = _engine(hf, 3, conv_path)
    _poison_row(engine, 0)
    _poison_row(engine, 2)
    got = _run_schedule(engine, {1: (0, audio)}, frames, {}, garbage_seed=5)[1]
    alone = _alone(hf, audio, conv_path)
    assert got[0] == alone[0]
    torch.testing.assert_close(got[1], alone[1], atol=1e-4, rtol=1e-4)
