"""A one-hour session (45,000 steps of 80 ms) keeps the engine's memory fixed and its output right."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from asr.engine.kyutai import engine_from_hf, tiny_hf_model

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

FRAME = 1920
WINDOW = 8
HOUR_STEPS = 45_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _windowed_reference(hf, texts, codes, first_pos: int):
    """transformers logits for positions first_pos.. given their inputs (text in, codes in)."""
    n = len(texts)
    ids = torch.cat([torch.tensor(texts)[:, None], torch.stack(codes)], dim=1)[None]
    i = torch.arange(n)
    rel = i[:, None] - i[None, :]
    mask = torch.zeros(n, n).masked_fill(~((rel >= 0) & (rel < WINDOW)), float("-inf"))[None, None]
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, position_ids=(first_pos + i)[None], use_cache=False)
    return out.logits[0]


@pytest.mark.parametrize("conv_path", ["onednn", "c-rows"])  # torch's convs (GPU too), the CPU C kernel
def test_one_hour_session_fixed_memory_and_still_correct(conv_path):
    hf = tiny_hf_model(seed=3, window=WINDOW, layers=1, codebooks=2, hidden=16)
    engine = engine_from_hf(hf, batch_size=1)
    engine.mimi.use_conv_path(conv_path)
    before = engine.state_pointers()
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal((64, 1, FRAME)) * 0.3).astype(np.float32)  # reused: no per-step allocation
    active = np.ones(1, bool)
    tail = 4 * WINDOW
    texts, codes, logits, tokens = [], [], [], []
    first_pos = None
    engine.step(noise[0], active, reset=[0])
    baseline = None
    for i in range(1, HOUR_STEPS):
        if i == 2000:
            baseline = rss_bytes()
        if i >= HOUR_STEPS - tail:
            if first_pos is None:
                first_pos = int(engine.pos[0])
            texts.append(int(engine.text[0]))
            tokens.append(int(engine.step(noise[i % 64], active)[0]))
            codes.append(engine.codes[0].clone())
            logits.append(engine.logits[0].clone())
        else:
            engine.step(noise[i % 64], active)
    growth = rss_bytes() - baseline
    assert engine.state_pointers() == before, "state tensors were reallocated or resized"
    assert int(engine.pos[0]) == HOUR_STEPS + 1
    assert int(engine.mimi.pos[0]) == 2 * HOUR_STEPS
    assert growth < 5 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over one hour of steps"
    # The LM at position p sees positions p-7..p only: from the 8th recorded step on, a forward of
    # the recorded inputs at their absolute positions (~45,000) must reproduce the engine exactly.
    ref = _windowed_reference(hf, texts, codes, first_pos)
    assert tokens[WINDOW:] == ref[WINDOW:].argmax(-1).tolist()
    torch.testing.assert_close(torch.stack(logits)[WINDOW:], ref[WINDOW:], atol=1e-4, rtol=1e-4)
    assert texts[1:] == tokens[:-1]
