"""`python -m asr.engine.kyutai --save-tiny DIR`: the tiny random model as a transformers checkpoint, loaded
through the same `from_pretrained` path a hub id takes (offline), and served by `asr-serve --model DIR`."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from asr.engine.kyutai import from_pretrained, main, tiny_random
from asr.moshi_protocol import Step
from asr.engine.scheduler import EngineScheduler, SchedulerConfig
from asr.serving.server import build_recognizer, parse_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAME = 1920
B = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-kyutai")
    assert main(["--save-tiny", str(directory), "--seed", "0"]) == 0
    return directory


def noise(frames: int, seed: int, amplitude: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((B, frames, FRAME)) * amplitude).astype(np.float32)


def test_saved_dir_is_a_save_pretrained_checkpoint(checkpoint):
    names = {p.name for p in checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json"} <= names
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "kyutai_speech_to_text"


def test_from_pretrained_dir_gives_the_in_memory_tiny_models_output(checkpoint):
    loaded = from_pretrained(str(checkpoint), batch_size=B, device="cpu", dtype=torch.float32)
    ref = tiny_random(B, seed=0)
    # labelled random however it was loaded, with the tiny model's delay and "text"
    assert loaded.is_random and "NOT A SPEECH MODEL" in loaded.name
    assert loaded.asr_delay_frames == ref.asr_delay_frames
    ids = [5, 7, 11, 47]
    assert loaded.decode(ids) == ref.decode(ids) == "<5><7><11><47>"
    pcm = noise(24, seed=1)
    active = np.ones(B, bool)
    got, want = [], []
    for t in range(pcm.shape[1]):
        reset = list(range(B)) if t == 0 else None
        got.append(loaded.engine.step(pcm[:, t], active, reset=reset).copy())
        want.append(ref.engine.step(pcm[:, t], active, reset=reset).copy())
    got, want = np.stack(got), np.stack(want)
    assert np.array_equal(got, want)
    assert len(np.unique(want)) > 3  # varied tokens: the comparison is not of two constant streams


async def first_steps(sched: EngineScheduler, pcm: np.ndarray) -> list:
    """Feed `pcm` to one session, flush, and return every message up to the last Step."""
    async with sched:
        s = await sched.open_session()
        await s.feed(pcm)
        await s.flush()
        last = pcm.size // FRAME + sched.model.asr_delay_frames + sched.config.flush_extra_frames
        got: list = []
        async with asyncio.timeout(30):
            while not any(isinstance(m, Step) and m.step_idx == last for m in got):
                got += await s.messages()
        await s.close()
        return got


async def test_asr_serve_model_dir_serves_the_checkpoint(checkpoint):
    """`duplex asr-serve --model DIR` builds the engine from the saved checkpoint; its session sends
    the same Words, EndWords and Steps as the in-memory tiny model's."""
    served = build_recognizer(parse_args(["--model", str(checkpoint), "--slots", str(B), "--dtype", "fp32",
                                          "--no-tune-convs"]))
    assert isinstance(served, EngineScheduler) and served.batch_size == B
    assert served.model.is_random and "NOT A SPEECH MODEL" in served.name
    pcm = noise(60, seed=2, amplitude=0.05)[0].reshape(-1)  # quiet noise: this model emits pads, so words
    got = await first_steps(served, pcm)
    want = await first_steps(EngineScheduler(tiny_random(B, seed=0), SchedulerConfig()), pcm)
    assert got == want
    assert any(type(m).__name__ == "Word" for m in want)  # words (noise ones) were compared too
