"""The SEANet C kernel (asr/engine/seanet_kernel.c) computes what the torch paths compute, state included."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from asr.engine import seanet_kernel
from asr.engine.mimi import _StreamConv


@pytest.fixture(autouse=True)
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_kernel_builds_here():
    # CI and set-up install a C compiler (llama-cpp-python needs one too): no silent fallback.
    assert seanet_kernel.library() is not None, seanet_kernel.unavailable_reason()


def _elu_by_kernel(x: torch.Tensor) -> torch.Tensor:
    """ELU through the kernel: a 1 -> 1 pointwise conv with weight 1 and bias 0."""
    return seanet_kernel.stream_conv(x[None, None].contiguous(), None, torch.ones(1, dtype=torch.bool),
                                     torch.ones(1, 1, 1), torch.zeros(1), None, stride=1, dilation=1,
                                     elu=True, dots=False)[0, 0]


def test_elu_is_exact_for_positives_and_within_an_ulp_for_negatives():
    x = torch.cat([torch.linspace(-100, 10, 100_003),
                   torch.tensor([-3e38, -87.5, -87.0, -1e-8, -1e-30, 0.0, 1e-30, 1e-3, 3e38])])
    got = _elu_by_kernel(x)
    ref = F.elu(x.double())
    pos = x > 0
    assert torch.equal(got[pos], x[pos])
    rel = ((got.double() - ref).abs() / ref.abs().clamp(min=1e-30))[~pos & (x != 0)]
    assert rel.max() < 2.5e-7, f"ELU off by {rel.max():.2e} at {x[~pos & (x != 0)][rel.argmax()]:.4g}"
    assert got[x == 0].item() == 0.0


@pytest.mark.parametrize("cin,cout,k,stride,dilation,bias,steps_len", [
    (1, 4, 7, 1, 1, True, 1920),   # Mimi's first conv shape: long and narrow
    (4, 2, 3, 1, 2, True, 200),    # dilated residual conv
    (2, 4, 1, 1, 1, True, 300),    # pointwise (no state)
    (4, 8, 8, 4, 1, True, 480),    # strided downsampling, long
    (8, 16, 10, 5, 1, True, 50),   # strided, output shorter than a vector
    (16, 16, 4, 2, 1, False, 6),   # no bias
    (33, 7, 3, 1, 1, True, 2),     # odd channel counts, 2 samples (Mimi's last conv)
])
@pytest.mark.parametrize("path", _StreamConv.C_PATHS)
@pytest.mark.parametrize("threads", [1, 2])
def test_each_c_path_streams_like_onednn(cin, cout, k, stride, dilation, bias, steps_len, path, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B = 3
    ref = _StreamConv(B, cin, cout, k, stride=stride, dilation=dilation, bias=bias, elu_input=True)
    got = copy.deepcopy(ref)
    got.path = path
    assert path in got.paths(), seanet_kernel.unavailable_reason()
    active = torch.tensor([True, False, True])
    fresh = torch.zeros(B, dtype=torch.bool)
    garbage = torch.full_like(ref.cache[1], float("nan"))
    ref.cache[1] = garbage  # an idle row may hold anything; the others must not see it
    got.cache[1] = garbage
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(B, cin, steps_len * stride) * 2
            lout = (ref.pad + x.shape[-1] - (k - 1) * dilation - 1) // stride + 1
            residual = torch.randn(B, cout, lout) if step % 2 else None
            want = ref(x, active, fresh, residual=residual)
            have = got(x, active, fresh, residual=residual)
            assert have.shape == want.shape == (B, cout, lout)
            torch.testing.assert_close(have[active], want[active], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(got.cache[active], ref.cache[active], atol=1e-6, rtol=1e-6)
            assert got.cache[1].isnan().all()  # the idle row's state is left as it was


def test_bad_arguments_get_clear_errors():
    x = torch.randn(2, 4, 64)
    w = torch.randn(8, 4, 3)
    state = torch.zeros(2, 4, 2)
    on = torch.ones(2, dtype=torch.bool)
    kw = dict(stride=1, dilation=1, elu=True, dots=False)
    with pytest.raises(ValueError, match="contiguous"):
        seanet_kernel.stream_conv(x.transpose(1, 2).contiguous().transpose(1, 2), state, on, w, None, None, **kw)
    with pytest.raises(ValueError, match="float32"):
        seanet_kernel.stream_conv(x.double(), state, on, w, None, None, **kw)
    with pytest.raises(ValueError, match="shapes"):
        seanet_kernel.stream_conv(x, torch.zeros(2, 4, 5), on, w, None, None, **kw)
    with pytest.raises(ValueError, match="residual"):
        seanet_kernel.stream_conv(x, state, on, w, None, torch.zeros(2, 8, 3), **kw)
    replicate = _StreamConv(2, 4, 4, 4, stride=2, replicate=True)
    assert replicate.paths() == _StreamConv.TORCH_PATHS
