"""GPU benchmark of the batched ASR engine at the real stt-1b-en_fr shape, random weights.

Shape: LM 16 layers, d 2048, 16 heads (head_dim 128), context 750, 32 codebooks, text vocab
8001; real Mimi encoder shape (transformers' MimiConfig defaults). Weights are random: the
figures are speed and memory, not accuracy. No download, no internet.

For each B in --batches: step time p50/p99 eager and CUDA-graphed (the whole step captured
once, replayed), real-time capacity (a step must take < 80 ms for B real-time streams), and
torch.cuda.max_memory_allocated before/after --long-steps steps (fixed memory check).

    python scripts/gpu_engine_bench.py                 # on a CUDA GPU
    python scripts/gpu_engine_bench.py --tiny          # CPU smoke test of this script
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from asr.engine.engine import KyutaiLM, LMConfig, StreamingEngine  # noqa: E402
from asr.engine.mimi import MimiSpec, MimiStreamingEncoder  # noqa: E402

FRAME_S = 0.08


def build(batch: int, tiny: bool, device: str, dtype: torch.dtype) -> StreamingEngine:
    from transformers import MimiConfig

    if tiny:
        mimi_cfg = MimiConfig(hidden_size=16, num_filters=4, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=2, intermediate_size=32, codebook_size=16, codebook_dim=8,
                              vector_quantization_hidden_dimension=8, num_quantizers=4, sliding_window=6,
                              upsample_groups=16)
        lm_cfg = LMConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=8,
                          ffn_dim=64, num_codebooks=4, codebook_vocab_size=17, audio_bos_token_id=16,
                          text_bos_token_id=47, rope_theta=10000.0, rms_norm_eps=1e-8, window=16)
    else:
        mimi_cfg = MimiConfig()  # kyutai/mimi shape: 512 wide, 8 layers, window 250, 32 codebooks
        lm_cfg = LMConfig(vocab_size=8001, hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16,
                          head_dim=128, ffn_dim=11264, num_codebooks=32,
                          codebook_vocab_size=2049, audio_bos_token_id=2048, text_bos_token_id=8000,
                          rope_theta=100000.0, rms_norm_eps=1e-8, window=750)
    torch.manual_seed(0)
    lm = KyutaiLM(lm_cfg)
    with torch.no_grad():
        for p in lm.parameters():
            p.normal_(0, 0.02)
    spec = MimiSpec.from_hf(mimi_cfg)
    mimi = MimiStreamingEncoder(spec, batch, num_codebooks=lm_cfg.num_codebooks)
    with torch.no_grad():
        for p in mimi.parameters():
            p.normal_(0, 0.05)
        mimi.codebooks.normal_()
    return StreamingEngine(lm.to(device), mimi.to(device), batch, dtype=dtype)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_eager(engine, steps: int, device: str) -> list[float]:
    B = engine.batch_size
    pcm = (np.random.default_rng(0).standard_normal((B, engine.frame_size)) * 0.1).astype(np.float32)
    active = np.ones(B, bool)
    engine.step(pcm, active, reset=list(range(B)))
    for _ in range(3):
        engine.step(pcm, active)
    out = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        engine.step(pcm, active)  # includes the (B,) token copy to host, which syncs
        out.append(time.perf_counter() - t0)
    return out


def time_graphed(engine, steps: int) -> tuple[list[float], torch.cuda.CUDAGraph]:
    """Capture the step core once (static buffers), then replay: host writes pcm/active, replays, reads tokens."""
    B = engine.batch_size
    engine.active.fill_(True)
    engine.pcm.normal_(0, 0.1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):  # warm-up on a side stream, as CUDA graph capture requires
            engine._step_core()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        tokens = engine._step_core()
    host = torch.empty(B, dtype=tokens.dtype, pin_memory=True)
    out = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        host.copy_(tokens, non_blocking=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out, graph


def fmt(xs: list[float]) -> str:
    return f"p50 {np.percentile(xs, 50) * 1e3:7.2f} ms  p99 {np.percentile(xs, 99) * 1e3:7.2f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU: smoke-test this script")
    p.add_argument("--batches", type=int, nargs="*", default=None)
    p.add_argument("--steps", type=int, default=100, help="timed steps per measurement")
    p.add_argument("--long-steps", type=int, default=10_000, help="steps for the fixed-memory check")
    p.add_argument("--long-batch", type=int, default=64, help="B for the fixed-memory check")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if (args.dtype == "bf16" and cuda) else torch.float32
    batches = args.batches or ([2, 4] if args.tiny else [64, 128, 256, 400])
    if not cuda and not args.tiny:
        print("no CUDA device: use --tiny for a CPU smoke test")
        return 2
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  LM dtype {dtype}")
    print("shape:", "tiny" if args.tiny else "stt-1b-en_fr (16 layers, d 2048, context 750) + Mimi, random weights")
    results = {}
    for B in batches:
        try:
            engine = build(B, args.tiny, device, dtype)
            kv_gib = (engine.k_cache.numel() + engine.v_cache.numel()) * engine.k_cache.element_size() / 2**30
            eager = time_eager(engine, args.steps, device)
            line = f"B={B:4d}  KV {kv_gib:6.2f} GiB  eager {fmt(eager)}"
            best = np.percentile(eager, 99)
            if cuda:
                graphed, graph = time_graphed(engine, args.steps)
                line += f"  | graphed {fmt(graphed)}"
                best = min(best, np.percentile(graphed, 99))
                del graph
            rt = "yes" if best < FRAME_S else "NO"
            line += f"  | {B} real-time streams (p99 < 80 ms): {rt}"
            print(line, flush=True)
            results[B] = best
            del engine
            if cuda:
                torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            print(f"B={B}: out of memory", flush=True)
            if cuda:
                torch.cuda.empty_cache()
    ok = [B for B, t in results.items() if t < FRAME_S]
    print(f"largest B tested with p99 step < 80 ms: {max(ok) if ok else 'none'}")

    B = 2 if args.tiny else args.long_batch
    engine = build(B, args.tiny, device, dtype)
    pcm = (np.random.default_rng(1).standard_normal((B, engine.frame_size)) * 0.1).astype(np.float32)
    active = np.ones(B, bool)
    engine.step(pcm, active, reset=list(range(B)))
    for _ in range(10):
        engine.step(pcm, active)
    ptrs = engine.state_pointers()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated()
    t0 = time.perf_counter()
    for _ in range(args.long_steps):
        engine.step(pcm, active)
    wall = time.perf_counter() - t0
    same = engine.state_pointers() == ptrs
    if cuda:
        after = torch.cuda.max_memory_allocated()
        print(f"B={B}, {args.long_steps} steps ({args.long_steps * FRAME_S / 60:.0f} min of audio per stream) "
              f"in {wall:.1f}s: max_memory_allocated before {before / 2**30:.3f} GiB, after {after / 2**30:.3f} GiB, "
              f"state pointers unchanged: {same}")
    else:
        print(f"B={B}, {args.long_steps} steps in {wall:.1f}s, state pointers unchanged: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
