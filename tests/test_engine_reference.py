"""The batched engine equals the transformers Kyutai STT reference (tiny random seeded models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.engine.kyutai import engine_from_hf
from asr.engine.mimi import MimiSpec, MimiStreamingEncoder, _StreamConv
from helpers import ENGINE_FRAME, engine_audio

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW = 8
FRAME = ENGINE_FRAME


def _hf_codes(hf, audio: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return hf.codec_model.encode(torch.from_numpy(audio)[None, None]).audio_codes[0].T  # (T, K)


def _hf_reference(hf, codes: torch.Tensor, tokens: list[int], window: int, offset: int = 0):
    """Logits of the transformers LM for positions 0..T with an explicit sliding-window mask.

    Position 0 is (text BOS, audio BOS); position p >= 1 is (token of p-1, codes of frame p-1),
    the input layout of transformers' `generate` for this model. Teacher-forced on `tokens`.
    """
    cfg = hf.config
    T, K = codes.shape
    text = torch.tensor([cfg.bos_token_id] + tokens[:T])[:, None]
    audio = torch.cat([torch.full((1, K), cfg.audio_bos_token_id), codes])
    ids = torch.cat([text, audio], dim=1)[None]  # (1, T+1, 1+K)
    i = torch.arange(T + 1)
    rel = i[:, None] - i[None, :]
    allowed = (rel >= 0) & (rel < window)
    mask = torch.zeros(T + 1, T + 1).masked_fill(~allowed, float("-inf"))[None, None]
    pos = (offset + i)[None]
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.logits[0]  # (T+1, V)


def _run_engine_single(engine, audio: np.ndarray, row: int = 0, start_pos: int = 0):
    B = engine.batch_size
    frames = audio.size // FRAME
    tokens, logits = [], []
    active = np.zeros(B, bool)
    active[row] = True
    pcm = np.zeros((B, FRAME), np.float32)
    for f in range(frames):
        pcm[row] = audio[f * FRAME:(f + 1) * FRAME]
        reset = [row] if f == 0 else None
        out = engine.step(pcm, active, reset=reset, start_pos=[start_pos] if reset else None)
        tokens.append(int(out[row]))
        logits.append(engine.logits[row].clone())
    return tokens, torch.stack(logits)


@pytest.mark.parametrize("offset", [0, 10**6])
def test_engine_matches_transformers_over_many_windows(hf, offset):
    frames = 4 * WINDOW  # >= 3x the window: the ring buffer wraps several times
    audio = engine_audio(1, frames)
    engine = engine_from_hf(hf, batch_size=2)
    tokens, logits = _run_engine_single(engine, audio, row=1, start_pos=offset)
    codes = _hf_codes(hf, audio)
    ref = _hf_reference(hf, codes, [engine.bos_token] + tokens, WINDOW, offset=offset)
    assert int(ref[0].argmax()) == engine.bos_token
    ref_tokens = ref[1:].argmax(-1).tolist()
    assert tokens == ref_tokens
    assert len(set(tokens)) > 3, "degenerate test model: tokens should vary"
    torch.testing.assert_close(logits, ref[1:], atol=1e-4, rtol=1e-4)


def test_reference_window_actually_matters(hf):
    """Guard: with a full causal mask the reference differs, so the window test can fail."""
    frames = 3 * WINDOW
    audio = engine_audio(2, frames)
    engine = engine_from_hf(hf, batch_size=1)
    tokens, logits = _run_engine_single(engine, audio)
    codes = _hf_codes(hf, audio)
    full = _hf_reference(hf, codes, [engine.bos_token] + tokens, window=10**9)
    assert not torch.allclose(logits, full[1:], atol=1e-3)


@pytest.mark.parametrize("path", ["onednn", *_StreamConv.C_PATHS])
def test_mimi_streaming_equals_full_encode(hf, path):
    spec = MimiSpec.from_hf(hf.codec_model.config)
    enc = MimiStreamingEncoder(spec, batch=3, num_codebooks=hf.config.num_codebooks)
    sd = {k[len("codec_model."):]: v for k, v in hf.state_dict().items() if k.startswith("codec_model.")}
    enc.load_hf_state_dict(sd)
    enc.use_conv_path(path)
    frames = 5 * spec.sliding_window
    audio = engine_audio(3, frames)
    ref = _hf_codes(hf, audio)
    rng = np.random.default_rng(0)
    active = torch.tensor([False, True, False])
    got, latents = [], []
    with torch.no_grad():
        for f in range(frames):
            pcm = torch.from_numpy(rng.standard_normal((3, FRAME)).astype(np.float32) * 100)  # garbage rows
            pcm[1] = torch.from_numpy(audio[f * FRAME:(f + 1) * FRAME])
            got.append(enc.step(pcm, active)[1])
            latents.append(enc.latent[1].clone())
    got = torch.stack(got)
    with torch.no_grad():
        ref_latents = hf.codec_model.encoder(torch.from_numpy(audio)[None, None]).latents[0].T
    torch.testing.assert_close(torch.stack(latents), ref_latents, atol=1e-4, rtol=1e-4)
    assert torch.equal(got, ref)
    assert len(torch.unique(ref)) > 4, "degenerate codebooks"


# ---- every conv path computes the same convolution ---------------------------------------
@pytest.mark.parametrize("cin,cout,k,stride,dilation,bias", [
    (1, 4, 7, 1, 1, True), (4, 2, 3, 1, 2, True), (8, 16, 10, 5, 1, True), (16, 16, 4, 2, 1, False)])
@pytest.mark.parametrize("path", [p for p in _StreamConv.TORCH_PATHS if p != "onednn"])
def test_each_conv_path_equals_onednn(cin, cout, k, stride, dilation, bias, path):
    from asr.engine.mimi import _StreamConv

    torch.manual_seed(0)
    conv = _StreamConv(3, cin, cout, k, stride=stride, dilation=dilation, bias=bias)
    x = torch.randn(3, cin, conv.pad + 40 * stride)
    with torch.no_grad():
        ref = conv.convolve(x)
        conv.path = path
        got = conv.convolve(x)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", [p for p in _StreamConv.PATHS if p != "onednn"])
def test_engine_with_every_conv_on_one_path_matches_transformers(hf, path):
    frames = 3 * WINDOW
    audio = engine_audio(4, frames)
    engine = engine_from_hf(hf, batch_size=2)
    engine.mimi.use_conv_path(path)
    assert {c.path for c in engine.mimi.stream_convs() if not c.replicate} == {path}
    tokens, logits = _run_engine_single(engine, audio, row=0)
    ref = _hf_reference(hf, _hf_codes(hf, audio), [engine.bos_token] + tokens, WINDOW)
    assert tokens == ref[1:].argmax(-1).tolist()
    torch.testing.assert_close(logits, ref[1:], atol=1e-4, rtol=1e-4)


def test_an_unavailable_conv_path_is_refused(hf):
    engine = engine_from_hf(hf, batch_size=2)
    with pytest.raises(ValueError, match="'cuDNN' unavailable"):
        engine.mimi.use_conv_path("cuDNN")


def test_tuning_the_convs_leaves_the_streaming_state_as_it_was(hf):
    engine = engine_from_hf(hf, batch_size=4)
    audio = engine_audio(5, 3)
    _run_engine_single(engine, audio, row=2)  # some state in the pool
    before = {name: b.clone() for name, b in engine.named_buffers()}
    choices = engine.mimi.tune_convs(repeats=2)
    convs = engine.mimi.stream_convs()
    assert len(choices) == len(convs) and set(choices) <= {*_StreamConv.PATHS, "pointwise"}
    assert [c.path for c, p in zip(convs, choices) if p != "pointwise"] == [p for p in choices if p != "pointwise"]
    for name, b in engine.named_buffers():
        assert torch.equal(b, before[name]), name
