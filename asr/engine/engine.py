"""Batched streaming recognizer engine: a fixed pool of B slots, one 80 ms frame per slot per step.

Everything is allocated once for B slots on one device (gpt-fast style static state):
- LM ring-buffer KV, (layers, B, kv_heads, C, head_dim), with C = the attention window;
- `kpos` (B, C): absolute position of each cached key, -1 = empty;
- `pos` (B,): absolute position of each slot's next token, `text` (B,): its last text token;
- the streaming Mimi state (conv left contexts, codec KV, positions), see `asr.engine.mimi`.

`step` (one batched step): reset flagged rows; encode one frame per slot (Mimi); embed the
previous text token plus the frame's audio codes; per layer apply RoPE at each slot's own
absolute position, write K/V at `pos % C` for active rows only and attend with the mask
`kpos >= 0 & 0 <= pos - kpos < window`; greedy-sample on the device; copy the (B,) tokens to
the host. The core has no `.item()`, no Python branch on device data and updates state in
place, so it can be wrapped by `torch.compile` (or CUDA graphs on a GPU).

Stream start: LM position 0 of every stream holds the constant text-BOS + audio-BOS input. A
lone token attends only to itself, so its hidden states do not depend on its position; we
precompute its pre-RoPE keys, values and greedy token once, and a reset writes them at the
slot's start position. The stream's first audio frame then goes in at position 1, exactly as
in transformers' `KyutaiSpeechToTextForConditionalGeneration.generate`, without spending a
step on the BOS token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from asr.engine.mimi import MimiStreamingEncoder, rope


@dataclass(frozen=True)
class LMConfig:
    """Shape of the Kyutai STT decoder (the delayed-streams LM)."""

    vocab_size: int  # text vocabulary (logits)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int  # fc1 output; the gated MLP's hidden width is ffn_dim // 2
    num_codebooks: int
    codebook_vocab_size: int
    audio_bos_token_id: int
    text_bos_token_id: int
    rope_theta: float
    rms_norm_eps: float
    window: int  # attention window in positions = ring-buffer length C

    @classmethod
    def from_hf(cls, cfg, window: int | None = None) -> "LMConfig":
        rope_params = getattr(cfg, "rope_parameters", None) or {}
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            ffn_dim=cfg.ffn_dim,
            num_codebooks=cfg.num_codebooks,
            codebook_vocab_size=cfg.codebook_vocab_size,
            audio_bos_token_id=cfg.audio_bos_token_id,
            text_bos_token_id=cfg.bos_token_id,
            rope_theta=float(rope_params.get("rope_theta", 10000.0)),
            rms_norm_eps=cfg.rms_norm_eps,
            window=window or cfg.max_position_embeddings,
        )

    @property
    def embed_rows(self) -> int:
        return self.vocab_size + self.num_codebooks * self.codebook_vocab_size + 1


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, c: LMConfig):
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.q = nn.Linear(d, c.num_heads * hd, bias=False)
        self.k = nn.Linear(d, c.num_kv_heads * hd, bias=False)
        self.v = nn.Linear(d, c.num_kv_heads * hd, bias=False)
        self.o = nn.Linear(c.num_heads * hd, d, bias=False)
        self.fc1 = nn.Linear(d, c.ffn_dim, bias=False)
        self.fc2 = nn.Linear(c.ffn_dim // 2, d, bias=False)
        self.norm1 = nn.Parameter(torch.ones(d))
        self.norm2 = nn.Parameter(torch.ones(d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        gate, up = h.chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)


class KyutaiLM(nn.Module):
    """Weights of the delayed-streams text decoder (no state: the engine owns the slots)."""

    def __init__(self, c: LMConfig):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.embed_rows, c.hidden_size)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.num_layers))
        self.norm = nn.Parameter(torch.ones(c.hidden_size))
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        offsets = c.vocab_size + torch.arange(c.num_codebooks) * c.codebook_vocab_size
        self.register_buffer("audio_offsets", offsets, persistent=False)
        hd = c.head_dim
        self.register_buffer("inv_freq", 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)),
                             persistent=False)
        self.requires_grad_(False)  # inference only (and faster: see MimiStreamingEncoder)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load from `KyutaiSpeechToTextForConditionalGeneration.state_dict()` (LM part)."""
        self.embed.weight.data.copy_(sd["model.embed_tokens.embed_tokens.weight"])
        self.norm.data.copy_(sd["model.norm.weight"])
        self.lm_head.weight.data.copy_(sd["lm_head.weight"])
        for i, b in enumerate(self.blocks):
            p = f"model.layers.{i}."
            for mine, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
                getattr(b, mine).weight.data.copy_(sd[f"{p}self_attn.{theirs}.linear.weight"])
            b.fc1.weight.data.copy_(sd[p + "mlp.fc1.weight"])
            b.fc2.weight.data.copy_(sd[p + "mlp.fc2.weight"])
            b.norm1.data.copy_(sd[p + "input_layernorm.weight"])
            b.norm2.data.copy_(sd[p + "post_attention_layernorm.weight"])

    def embed_inputs(self, text: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """text: (B,), codes: (B, K) -> (B, hidden): sum of the text and per-codebook embeddings."""
        ids = torch.cat([text[:, None], codes + self.audio_offsets], dim=1)
        return self.embed(ids).sum(dim=1)

    @torch.no_grad()
    def bos_prefix(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-RoPE keys, values (layers, kv_heads, head_dim) and greedy token of position 0."""
        c = self.config
        text = torch.tensor([c.text_bos_token_id], device=self.norm.device)
        codes = torch.full((1, c.num_codebooks), c.audio_bos_token_id, device=self.norm.device)
        x = self.embed_inputs(text, codes)
        ks, vs = [], []
        for b in self.blocks:
            h = rms_norm(x, b.norm1, c.rms_norm_eps)
            k = b.k(h).view(c.num_kv_heads, c.head_dim)
            v = b.v(h).view(c.num_kv_heads, c.head_dim)
            ks.append(k)
            vs.append(v)
            att = v.repeat_interleave(c.num_heads // c.num_kv_heads, dim=0)  # softmax over one key = 1
            x = x + b.o(att.reshape(1, -1))
            x = x + b.mlp(rms_norm(x, b.norm2, c.rms_norm_eps))
        logits = self.lm_head(rms_norm(x, self.norm, c.rms_norm_eps))
        return torch.stack(ks), torch.stack(vs), logits.argmax(-1)[0]


class StreamingEngine(nn.Module):
    """A pool of B recognition slots; `step` advances every active slot by one frame."""

    def __init__(self, lm: KyutaiLM, mimi: MimiStreamingEncoder, batch_size: int,
                 dtype: torch.dtype = torch.float32, compile: bool = False, tune_convs: bool = False):
        super().__init__()
        if mimi.batch != batch_size:
            raise ValueError("Mimi encoder was built for a different batch size")
        c = lm.config
        self.lm, self.mimi, self.config, self.batch_size = lm.to(dtype), mimi, c, batch_size
        self.frame_size = mimi.spec.frame_size
        dev = self.lm.norm.device
        B, C, L = batch_size, c.window, c.num_layers
        kv_shape = (L, B, c.num_kv_heads, C, c.head_dim)
        self.register_buffer("k_cache", torch.zeros(kv_shape, dtype=dtype, device=dev), persistent=False)
        self.register_buffer("v_cache", torch.zeros(kv_shape, dtype=dtype, device=dev), persistent=False)
        self.register_buffer("kpos", torch.full((B, C), -1, dtype=torch.long, device=dev), persistent=False)
        self.register_buffer("pos", torch.zeros(B, dtype=torch.long, device=dev), persistent=False)
        self.register_buffer("text", torch.zeros(B, dtype=torch.long, device=dev), persistent=False)
        self.register_buffer("pcm", torch.zeros(B, self.frame_size, device=dev), persistent=False)
        self.register_buffer("active", torch.zeros(B, dtype=torch.bool, device=dev), persistent=False)
        self.register_buffer("logits", torch.zeros(B, c.vocab_size, device=dev), persistent=False)
        self.register_buffer("codes", torch.zeros(B, c.num_codebooks, dtype=torch.long, device=dev),
                             persistent=False)  # audio codes of the last step (for inspection)
        k0, v0, tok0 = self.lm.bos_prefix()
        self.register_buffer("k0", k0, persistent=False)
        self.register_buffer("v0", v0, persistent=False)
        self.register_buffer("tok0", tok0, persistent=False)
        self._ar = torch.arange(B, device=dev)
        # CPU, eager: time each Mimi conv's paths (`_StreamConv.paths()`) at this B (off by
        # default: the choice depends on timing, so two pools may compute in different ways)
        self.conv_paths = mimi.tune_convs() if tune_convs and not compile else []
        self._core = torch.compile(self._step_core, dynamic=False) if compile else self._step_core
        self._host_pcm = torch.zeros(B, self.frame_size, pin_memory=dev.type == "cuda")
        self._host_active = torch.zeros(B, dtype=torch.bool, pin_memory=dev.type == "cuda")

    @property
    def device(self) -> torch.device:
        return self.k_cache.device

    @property
    def bos_token(self) -> int:
        """Greedy token of position 0 (the constant BOS step); every stream starts with it."""
        return int(self.tok0)

    # ---- reset ---------------------------------------------------------------------------
    @torch.no_grad()
    def reset_rows(self, rows: torch.Tensor, start_pos: torch.Tensor | None = None) -> None:
        """Clear slots `rows` (1-D long tensor on device), then write the BOS step at `start_pos`.

        Cost is proportional to the number of reset rows, not to B. Values are zeroed, not only
        masked: a masked NaN value would still poison attention (0 * NaN = NaN).
        """
        if start_pos is None:
            start_pos = torch.zeros_like(rows)
        self.k_cache.index_fill_(1, rows, 0.0)
        self.v_cache.index_fill_(1, rows, 0.0)
        self.kpos.index_fill_(0, rows, -1)
        self.logits.index_fill_(0, rows, 0.0)
        self.mimi.reset_rows(rows)
        slot = start_pos % self.config.window
        k = rope(self.k0[None], start_pos[:, None, None], self.lm.inv_freq)  # (R, L, H, D)
        # Advanced indices split by a slice put the index dims first: the target is (R, L, H, D).
        self.k_cache[:, rows, :, slot] = k.to(self.k_cache.dtype)
        self.v_cache[:, rows, :, slot] = self.v0[None].expand(rows.numel(), -1, -1, -1).to(self.v_cache.dtype)
        self.kpos[rows, slot] = start_pos
        self.pos[rows] = start_pos + 1
        self.text[rows] = self.tok0

    # ---- step ----------------------------------------------------------------------------
    def _step_core(self) -> torch.Tensor:
        """One step for all slots, reading `self.pcm` / `self.active`; returns tokens (B,) on device."""
        c, active, ar = self.config, self.active, self._ar
        codes = self.mimi.step(self.pcm, active)
        self.codes.copy_(codes)
        x = self.lm.embed_inputs(self.text, codes).to(self.k_cache.dtype)
        B = x.shape[0]
        pos = self.pos
        slot = pos % c.window
        self.kpos[ar, slot] = torch.where(active, pos, self.kpos[ar, slot])
        rel = pos[:, None] - self.kpos
        mask = ((self.kpos >= 0) & (rel >= 0) & (rel < c.window))[:, None, None, :]  # (B,1,1,C)
        qpos = pos[:, None, None]
        keep = active[:, None, None]
        for li, b in enumerate(self.lm.blocks):
            h = rms_norm(x, b.norm1, c.rms_norm_eps)
            q = rope(b.q(h).view(B, c.num_heads, 1, c.head_dim), qpos, self.lm.inv_freq)
            k = rope(b.k(h).view(B, c.num_kv_heads, 1, c.head_dim), qpos, self.lm.inv_freq)
            v = b.v(h).view(B, c.num_kv_heads, c.head_dim)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[ar, :, slot] = torch.where(keep, k[:, :, 0], kc[ar, :, slot])
            vc[ar, :, slot] = torch.where(keep, v, vc[ar, :, slot])
            att = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask,
                                                 enable_gqa=c.num_heads != c.num_kv_heads)
            x = x + b.o(att.reshape(B, -1))
            x = x + b.mlp(rms_norm(x, b.norm2, c.rms_norm_eps))
        logits = self.lm.lm_head(rms_norm(x, self.lm.norm, c.rms_norm_eps)).float()
        tokens = logits.argmax(dim=-1)
        self.logits.copy_(torch.where(active[:, None], logits, self.logits))
        self.text.copy_(torch.where(active, tokens, self.text))
        self.pos.add_(active.long())
        return tokens

    @torch.no_grad()
    def step(self, pcm: np.ndarray | torch.Tensor, active: np.ndarray | torch.Tensor,
             reset: np.ndarray | list[int] | None = None, start_pos: list[int] | None = None) -> np.ndarray:
        """Advance active slots by one frame. pcm: (B, frame_size) float32; active: (B,) bool;
        reset: slot indices to reset before the step. Returns the (B,) greedy tokens (host);
        rows of inactive slots hold garbage."""
        if reset is not None and len(reset):
            rows = torch.as_tensor(np.asarray(reset, dtype=np.int64)).to(self.device)
            sp = None if start_pos is None else torch.as_tensor(np.asarray(start_pos, dtype=np.int64)).to(self.device)
            self.reset_rows(rows, sp)
        self._host_pcm.copy_(torch.as_tensor(pcm))
        self._host_active.copy_(torch.as_tensor(active))
        self.pcm.copy_(self._host_pcm, non_blocking=True)
        self.active.copy_(self._host_active, non_blocking=True)
        tokens = self._core()
        return tokens.cpu().numpy()

    def state_pointers(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """data_ptr and shape of every per-slot state tensor (for fixed-memory checks)."""
        out = {n: (t.data_ptr(), tuple(t.shape)) for n, t in self.named_buffers()}
        return out
