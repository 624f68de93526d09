"""Streaming Mimi encoder (audio -> codes) with per-slot state for a batch of B slots.

Our own torch code for the encoder half of Kyutai's Mimi codec: SEANet causal convolutions,
the encoder transformer (sliding window), the stride-2 downsampling conv and the split residual
vector quantiser. Weights come from transformers' `MimiModel` state dict.

Every slot carries its own streaming state, allocated once: a left-context buffer per causal
conv, a ring-buffer KV cache and absolute key positions for the transformer, and its own
position counter. `step` encodes exactly one frame (1920 samples at 24 kHz) per slot and
updates state only for active rows, so idle rows may hold any garbage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from asr.engine import seanet_kernel


@dataclass(frozen=True)
class MimiSpec:
    """Shape of the Mimi encoder, read from a transformers `MimiConfig`."""

    num_filters: int
    ratios: tuple[int, ...]  # encoder order (reversed upsampling ratios)
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    num_residual_layers: int
    compress: int
    hidden_size: int
    pad_mode: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    sliding_window: int
    rope_theta: float
    norm_eps: float
    codebook_size: int
    codebook_dim: int
    vq_dim: int  # vector_quantization_hidden_dimension (input projection width)
    num_quantizers: int
    num_semantic_quantizers: int
    latent_stride: int
    frame_size: int

    @classmethod
    def from_hf(cls, cfg) -> "MimiSpec":
        rope = getattr(cfg, "rope_parameters", None) or {}
        if getattr(cfg, "use_conv_shortcut", False) or not getattr(cfg, "use_causal_conv", True):
            raise ValueError("only causal Mimi without conv shortcut is supported")
        return cls(
            num_filters=cfg.num_filters,
            ratios=tuple(reversed(cfg.upsampling_ratios)),
            kernel_size=cfg.kernel_size,
            last_kernel_size=cfg.last_kernel_size,
            residual_kernel_size=cfg.residual_kernel_size,
            dilation_growth_rate=cfg.dilation_growth_rate,
            num_residual_layers=cfg.num_residual_layers,
            compress=cfg.compress,
            hidden_size=cfg.hidden_size,
            pad_mode=cfg.pad_mode,
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            intermediate_size=cfg.intermediate_size,
            sliding_window=cfg.sliding_window,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            norm_eps=cfg.norm_eps,
            codebook_size=cfg.codebook_size,
            codebook_dim=cfg.codebook_dim,
            vq_dim=cfg.vector_quantization_hidden_dimension,
            num_quantizers=cfg.num_quantizers,
            num_semantic_quantizers=cfg.num_semantic_quantizers,
            latent_stride=cfg.latent_stride,
            frame_size=cfg.frame_size,
        )

    @property
    def steps_per_frame(self) -> int:
        """Transformer positions per 80 ms frame (2 for Mimi: 25 Hz inside, 12.5 Hz out)."""
        return self.latent_stride


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: (..., T, D), pos: broadcastable to (..., T) absolute positions."""
    freqs = pos.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _StreamConv(nn.Module):
    """Causal Conv1d with a per-slot left-context buffer of `kernel_eff - stride` samples,
    optionally with the ELU before it (`elu_input`) and a residual added after it.

    Six ways to compute it, with the same math (`path`): oneDNN's convolution (`F.conv1d`, the
    default), torch's native im2col-and-GEMM kernel ("native", the one it picks itself for a batch
    of one), our own im2col plus one batched matmul ("im2col"), the same columns as one flat
    GEMM over all slots' output samples ("flat": one call instead of B small ones, which wins on
    short, wide layers such as the last ones at B=16), and our C kernel (`seanet_kernel.c`), which
    fuses the ELU, the left context, the convolution, bias and residual into one pass per slot,
    vectorised over output time ("c-rows") or as dot products per output sample ("c-dots"). On
    CPU none wins everywhere: oneDNN pays ~40 us a call on any batch above one for narrow layers
    (4 channels x 1920 samples at B=4: 46 us against 14 us native), the native kernel loses on
    wide layers (64 -> 32 channels: 641 against 286 us), and the C kernel wins on the narrow,
    long front layers. `MimiStreamingEncoder.tune_convs` times them per layer.
    """

    TORCH_PATHS = ("onednn", "native", "im2col", "flat")
    C_PATHS = ("c-rows", "c-dots")
    PATHS = TORCH_PATHS + C_PATHS

    def __init__(self, batch: int, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, replicate: bool = False, elu_input: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, stride, dilation=dilation, bias=bias)
        self.pad = (k - 1) * dilation + 1 - stride
        self.replicate, self.elu_input = replicate, elu_input
        self.path = "onednn"
        self.register_buffer("cache", torch.zeros(batch, cin, self.pad), persistent=False)

    @property
    def pointwise(self) -> bool:
        """Kernel 1, no state: a matmul on the torch paths."""
        return self.pad == 0 and self.conv.kernel_size[0] == 1

    def paths(self) -> tuple[str, ...]:
        """The paths this conv can take here: the C kernel's only on CPU float32, when it builds,
        and not for the replicate-padded downsampling conv."""
        w = self.conv.weight
        if self.replicate or w.device.type != "cpu" or w.dtype != torch.float32 or seanet_kernel.library() is None:
            return self.TORCH_PATHS
        return self.PATHS

    def convolve(self, inp: torch.Tensor) -> torch.Tensor:
        """The convolution of an already left-padded input (B, cin, pad + L), torch paths."""
        c = self.conv
        if self.path == "onednn":
            return c(inp)
        k, s, d = c.kernel_size[0], c.stride[0], c.dilation[0]
        if self.path == "native":
            x, w = inp.unsqueeze(2), c.weight.unsqueeze(2)
            if d == 1:
                y = torch._C._nn.thnn_conv2d(x, w, [1, k], c.bias, [1, s], [0, 0])
            else:
                y = torch._C._nn.slow_conv_dilated2d(x, w, [1, k], c.bias, [1, s], [0, 0], [1, d])
            return y.squeeze(2)
        cols = inp.unfold(-1, (k - 1) * d + 1, s)  # (B, cin, L_out, span)
        if d > 1:
            cols = cols[..., ::d]
        b, cin, n_out, _ = cols.shape
        w = c.weight.reshape(c.out_channels, cin * k)  # weight order: (cin, k)
        if self.path == "flat":  # one GEMM for the whole batch: rows = (slot, output sample)
            rows = cols.permute(0, 2, 1, 3).reshape(b * n_out, cin * k)
            y = rows @ w.t() if c.bias is None else torch.addmm(c.bias, rows, w.t())
            return y.view(b, n_out, c.out_channels).transpose(1, 2)
        y = torch.matmul(w, cols.permute(0, 1, 3, 2).reshape(b, cin * k, n_out))
        return y if c.bias is None else y + c.bias[:, None]

    def forward(self, x: torch.Tensor, active: torch.Tensor, fresh: torch.Tensor,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.path in self.C_PATHS:
            if self.replicate:
                raise ValueError("the C kernel does not do replicate padding")
            c = self.conv
            return seanet_kernel.stream_conv(x.contiguous(), self.cache if self.pad else None, active, c.weight,
                                             c.bias, residual, stride=c.stride[0], dilation=c.dilation[0],
                                             elu=self.elu_input, dots=self.path == "c-dots")
        if self.elu_input:
            x = F.elu(x)
        if self.pointwise:
            # A matmul: oneDNN's conv1d for kernel 1 with few channels is pathologically slow on
            # batches (CPU, B=16, 2->4 channels x 1920 samples: 1.6 ms as conv, 0.03 ms as matmul).
            y = torch.matmul(self.conv.weight[:, :, 0], x)
            y = y if self.conv.bias is None else y + self.conv.bias[:, None]
        else:
            prev = self.cache
            if self.replicate:  # static config: first frame of a stream pads with its first sample
                prev = torch.where(fresh[:, None, None], x[..., :1].expand_as(prev), prev)
            inp = torch.cat([prev, x], dim=-1)
            if self.pad > 0:
                self.cache.copy_(torch.where(active[:, None, None], inp[..., inp.shape[-1] - self.pad:], self.cache))
            y = self.convolve(inp)
        return y if residual is None else residual + y


class _ResBlock(nn.Module):
    def __init__(self, batch: int, dim: int, spec: MimiSpec, dilation: int):
        super().__init__()
        hidden = dim // spec.compress
        self.conv1 = _StreamConv(batch, dim, hidden, spec.residual_kernel_size, dilation=dilation, elu_input=True)
        self.conv2 = _StreamConv(batch, hidden, dim, 1, elu_input=True)

    def forward(self, x, active, fresh):
        return self.conv2(self.conv1(x, active, fresh), active, fresh, residual=x)


class _Layer(nn.Module):
    def __init__(self, spec: MimiSpec):
        super().__init__()
        d, hd = spec.hidden_size, spec.head_dim
        self.q = nn.Linear(d, spec.num_heads * hd, bias=False)
        self.k = nn.Linear(d, spec.num_kv_heads * hd, bias=False)
        self.v = nn.Linear(d, spec.num_kv_heads * hd, bias=False)
        self.o = nn.Linear(spec.num_heads * hd, d, bias=False)
        self.fc1 = nn.Linear(d, spec.intermediate_size, bias=False)
        self.fc2 = nn.Linear(spec.intermediate_size, d, bias=False)
        self.ln1 = nn.LayerNorm(d, eps=spec.norm_eps)
        self.ln2 = nn.LayerNorm(d, eps=spec.norm_eps)
        self.scale1 = nn.Parameter(torch.ones(d))
        self.scale2 = nn.Parameter(torch.ones(d))


class MimiStreamingEncoder(nn.Module):
    """Batched streaming Mimi encoder: one 80 ms frame per slot per `step`."""

    def __init__(self, spec: MimiSpec, batch: int, num_codebooks: int | None = None):
        super().__init__()
        self.spec, self.batch = spec, batch
        self.num_codebooks = num_codebooks or spec.num_quantizers
        if not spec.num_semantic_quantizers <= self.num_codebooks <= spec.num_quantizers:
            raise ValueError("num_codebooks out of range for this Mimi")
        f = spec.num_filters
        seanet: list[nn.Module] = [_StreamConv(batch, 1, f, spec.kernel_size)]
        scale = 1
        for ratio in spec.ratios:
            dim = scale * f
            for j in range(spec.num_residual_layers):
                seanet.append(_ResBlock(batch, dim, spec, spec.dilation_growth_rate ** j))
            seanet.append(_StreamConv(batch, dim, dim * 2, ratio * 2, stride=ratio, elu_input=True))
            scale *= 2
        seanet.append(_StreamConv(batch, scale * f, spec.hidden_size, spec.last_kernel_size, elu_input=True))
        self.seanet = nn.ModuleList(seanet)
        self.layers = nn.ModuleList(_Layer(spec) for _ in range(spec.num_layers))
        self.downsample = _StreamConv(batch, spec.hidden_size, spec.hidden_size, 2 * spec.latent_stride,
                                      stride=spec.latent_stride, bias=False, replicate=True)
        nq, nsem = self.num_codebooks, spec.num_semantic_quantizers
        self.register_buffer("codebooks", torch.zeros(spec.num_quantizers, spec.codebook_size, spec.codebook_dim),
                             persistent=False)
        self.sem_proj = nn.Parameter(torch.eye(spec.vq_dim, spec.hidden_size))  # identity when widths match
        self.ac_proj = nn.Parameter(torch.eye(spec.vq_dim, spec.hidden_size))
        self._nq, self._nsem = nq, nsem
        # Transformer ring buffer: window + (positions per step - 1) so that the oldest key a query
        # of this step still needs is never overwritten by a newer key of the same step.
        self.ctx = spec.sliding_window + spec.steps_per_frame - 1
        hd, L = spec.head_dim, spec.num_layers
        self.register_buffer("k_cache", torch.zeros(L, batch, spec.num_kv_heads, self.ctx, hd), persistent=False)
        self.register_buffer("v_cache", torch.zeros(L, batch, spec.num_kv_heads, self.ctx, hd), persistent=False)
        self.register_buffer("kpos", torch.full((batch, self.ctx), -1, dtype=torch.long), persistent=False)
        self.register_buffer("pos", torch.zeros(batch, dtype=torch.long), persistent=False)
        self.register_buffer("fresh", torch.ones(batch, dtype=torch.bool), persistent=False)
        self.register_buffer("latent", torch.zeros(batch, spec.hidden_size), persistent=False)  # last step
        inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        # Inference only. This matters for speed, not just memory: a view of a parameter that
        # requires grad still requires grad under no_grad, and torch.matmul then takes its
        # autograd-safe broadcast path (on a CPU at B=16 a small pointwise conv runs several times
        # slower; `duplex asr-bench --engine-throughput` re-measures the step time).
        self.requires_grad_(False)

    # ---- weights -------------------------------------------------------------------------
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load from a transformers `MimiModel` state dict (keys without the `codec_model.` prefix)."""
        convs = [m for m in self.seanet.modules() if isinstance(m, _StreamConv)]
        hf_names = _hf_seanet_conv_names(self.spec)
        if len(convs) != len(hf_names):
            raise AssertionError("SEANet layout mismatch")
        for conv, name in zip(convs, hf_names):
            conv.conv.weight.data.copy_(sd[f"encoder.encoder_seanet.{name}.conv.weight"])
            conv.conv.bias.data.copy_(sd[f"encoder.encoder_seanet.{name}.conv.bias"])
        self.downsample.conv.weight.data.copy_(sd["encoder.downsample.conv.weight"])
        for i, layer in enumerate(self.layers):
            p = f"encoder.encoder_transformer.layers.{i}."
            for mine, theirs in (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
                                 ("o", "self_attn.o_proj"), ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2")):
                getattr(layer, mine).weight.data.copy_(sd[p + theirs + ".weight"])
            for mine, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
                getattr(layer, mine).weight.data.copy_(sd[p + theirs + ".weight"])
                getattr(layer, mine).bias.data.copy_(sd[p + theirs + ".bias"])
            layer.scale1.data.copy_(sd[p + "self_attn_layer_scale.scale"])
            layer.scale2.data.copy_(sd[p + "mlp_layer_scale.scale"])
        q = "quantizer.semantic_residual_vector_quantizer."
        a = "quantizer.acoustic_residual_vector_quantizer."
        if q + "input_proj.weight" in sd:
            self.sem_proj.data.copy_(sd[q + "input_proj.weight"][:, :, 0])
            self.ac_proj.data.copy_(sd[a + "input_proj.weight"][:, :, 0])
        books = []
        for i in range(self.spec.num_quantizers):
            pre = (q, i) if i < self.spec.num_semantic_quantizers else (a, i - self.spec.num_semantic_quantizers)
            cb = f"{pre[0]}layers.{pre[1]}.codebook."
            books.append(sd[cb + "embed_sum"] / sd[cb + "cluster_usage"].clamp(min=1e-5)[:, None])
        self.codebooks.copy_(torch.stack(books))

    # ---- conv paths ----------------------------------------------------------------------
    def stream_convs(self) -> list[_StreamConv]:
        """Every convolution of the encoder, in order (SEANet, then the downsampling conv)."""
        return [m for m in self.modules() if isinstance(m, _StreamConv)]

    def use_conv_path(self, path: str) -> None:
        """Put every convolution on `path` (one of `_StreamConv.PATHS`), as a test or a benchmark
        may want instead of `tune_convs`. The C kernel's paths leave the replicate-padded
        downsampling conv as it is; any other conv that cannot take `path` is an error."""
        for c in self.stream_convs():
            if path in c.paths():
                c.path = path
            elif not (c.replicate and path in c.C_PATHS):
                raise ValueError(f"conv path {path!r} unavailable here"
                                 + (f": {seanet_kernel.unavailable_reason()}" if path in c.C_PATHS else ""))

    @torch.no_grad()
    def tune_convs(self, repeats: int = 40, margin: float = 0.9) -> list[str]:
        """Pick a path (`_StreamConv.paths()`) for each convolution by timing them at this pool's
        batch size, as `torch.backends.cudnn.benchmark` does for cuDNN; CPU only. Each path is
        timed on the whole streaming step of the conv (ELU, left context, conv, residual), on the
        inputs of a real step. Another path replaces oneDNN only when it takes under `margin` of
        oneDNN's time. Streaming state is left as it was. Returns the path per convolution
        ("pointwise": the torch matmul of a kernel-1 conv)."""
        convs = self.stream_convs()
        if self.codebooks.device.type != "cpu":
            return []
        inputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        hooks = [c.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: (inputs.setdefault(i, (args[0].clone(), kwargs.get("residual"))), None)[1],
            with_kwargs=True) for i, c in enumerate(convs)]
        saved = {name: b.clone() for name, b in self.named_buffers()}
        for c in convs:
            c.path = "onednn"
        ones = torch.ones(self.batch, dtype=torch.bool, device=self.codebooks.device)
        try:
            self.step(torch.randn(self.batch, self.spec.frame_size, device=self.codebooks.device) * 0.1, ones)
        finally:
            for h in hooks:
                h.remove()
        choices = []
        try:
            for i, c in enumerate(convs):
                x, residual = inputs[i]
                candidates = ("onednn",) + c.C_PATHS if c.pointwise else c.TORCH_PATHS + c.C_PATHS
                candidates = tuple(p for p in candidates if p in c.paths())
                best: dict[str, float] = {}
                for _ in range(repeats):  # interleaved, the minimum of each: robust to a noisy machine
                    for path in candidates:
                        c.path = path
                        t0 = time.perf_counter()
                        c(x, ones, self.fresh, residual=residual)
                        dt = time.perf_counter() - t0
                        best[path] = min(best.get(path, dt), dt)
                fastest = min(best, key=best.__getitem__)
                c.path = fastest if best[fastest] < margin * best["onednn"] else "onednn"
                choices.append("pointwise" if c.pointwise and c.path == "onednn" else c.path)
        finally:
            for name, b in self.named_buffers():
                b.copy_(saved[name])
        return choices

    # ---- state ---------------------------------------------------------------------------
    @torch.no_grad()
    def reset_rows(self, rows: torch.Tensor) -> None:
        """Clear every piece of streaming state of the given slot indices (1-D long tensor)."""
        for m in self.modules():
            if isinstance(m, _StreamConv) and m.pad > 0:
                m.cache.index_fill_(0, rows, 0.0)
        self.k_cache.index_fill_(1, rows, 0.0)
        self.v_cache.index_fill_(1, rows, 0.0)
        self.kpos.index_fill_(0, rows, -1)
        self.pos.index_fill_(0, rows, 0)
        self.fresh.index_fill_(0, rows, True)

    # ---- step ----------------------------------------------------------------------------
    def _transformer(self, x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        B, T, _ = x.shape
        ar = torch.arange(B, device=x.device)
        qpos = self.pos[:, None] + torch.arange(T, device=x.device)  # (B, T)
        slots = qpos % self.ctx
        keep = active[:, None].expand(B, T)
        new_kpos = torch.where(keep, qpos, self.kpos[ar[:, None], slots])
        self.kpos[ar[:, None], slots] = new_kpos
        rel = qpos[:, :, None] - self.kpos[:, None, :]  # (B, T, ctx)
        mask = (self.kpos[:, None, :] >= 0) & (rel >= 0) & (rel < spec.sliding_window)
        mask = mask[:, None]  # (B, 1, T, ctx)
        for li, layer in enumerate(self.layers):
            h = layer.ln1(x)
            q = layer.q(h).view(B, T, spec.num_heads, spec.head_dim).transpose(1, 2)
            k = layer.k(h).view(B, T, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
            v = layer.v(h).view(B, T, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
            q = rope(q, qpos[:, None, :], self.inv_freq)
            k = rope(k, qpos[:, None, :], self.inv_freq)
            kc, vc = self.k_cache[li], self.v_cache[li]
            for t in range(T):  # static T (2 for Mimi)
                idx = slots[:, t]
                kc[ar, :, idx] = torch.where(active[:, None, None], k[:, :, t], kc[ar, :, idx])
                vc[ar, :, idx] = torch.where(active[:, None, None], v[:, :, t], vc[ar, :, idx])
            att = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask,
                                                 enable_gqa=spec.num_heads != spec.num_kv_heads)
            x = x + layer.scale1 * layer.o(att.transpose(1, 2).reshape(B, T, -1))
            x = x + layer.scale2 * layer.fc2(F.gelu(layer.fc1(layer.ln2(x))))
        self.pos.add_(active.long() * T)
        return x

    def _quantize(self, latent: torch.Tensor) -> torch.Tensor:
        """latent: (B, D) -> codes (B, num_codebooks), residual VQ with Euclidean argmin."""
        codes = []
        groups = ((self.sem_proj, 0, self._nsem), (self.ac_proj, self._nsem, self._nq))
        for proj, lo, hi in groups:
            residual = latent @ proj.t()
            for i in range(lo, hi):
                book = self.codebooks[i]
                idx = torch.cdist(residual[None].float(), book[None].float(), p=2)[0].argmin(dim=-1)
                codes.append(idx)
                residual = residual - book[idx]
        return torch.stack(codes, dim=1)

    def step(self, pcm: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """pcm: (B, frame_size) float32, active: (B,) bool -> codes (B, num_codebooks) int64."""
        x = pcm[:, None, :]
        fresh = self.fresh
        for m in self.seanet:  # every conv but the first applies the ELU before it
            x = m(x, active, fresh)
        x = self._transformer(x.transpose(1, 2), active)
        latent = self.downsample(x.transpose(1, 2), active, fresh)  # (B, D, 1)
        self.latent.copy_(latent[:, :, 0])
        self.fresh.copy_(self.fresh & ~active)
        return self._quantize(latent[:, :, 0])


def _hf_seanet_conv_names(spec: MimiSpec) -> list[str]:
    """transformers' names of the SEANet convs, in our module order."""
    names, idx = ["layers.0"], 1
    for _ in spec.ratios:
        for _ in range(spec.num_residual_layers):
            names += [f"layers.{idx}.block.1", f"layers.{idx}.block.3"]
            idx += 1
        idx += 1  # ELU
        names.append(f"layers.{idx}")
        idx += 1
    idx += 1  # ELU
    names.append(f"layers.{idx}")
    return names

