"""The C kernel of Mimi's streaming SEANet convolutions on CPU (`seanet_kernel.c`): build, load, call.

On a CPU the tiny-channel, long-signal convolutions at the front of Mimi's encoder (1 to 8
channels x 1920 samples a frame) spend their time in per-op overheads and memory passes:
ELU, concatenation with the left context, im2col, GEMM, bias, residual add, one pass each.
The kernel does one pass per slot with all of that fused, vectorised over output time.

The library is compiled on first use with the system C compiler (`$CC`, else `cc`) for this
CPU (`-march=native`) and cached under `$DUPLEX_CACHE_DIR`, else `$XDG_CACHE_HOME/duplex`,
else `~/.cache/duplex`, keyed by the source, the flags, the compiler and the CPU. No compiler,
no kernel: `library()` returns None, `unavailable_reason()` says why, and Mimi keeps its torch
paths. It links OpenMP (`-fopenmp`): torch's own libgomp, already loaded, serves it, so the
kernel's threads are torch's threads.

Floating point: no `-ffast-math` (its start-up code would switch the whole process to
flush-denormals-to-zero); only the parts of it that let loops vectorise (reassociation, no errno,
no traps, finite math). NaN or infinite inputs give unspecified values in their own slot only.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("seanet_kernel.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-Wno-psabi",
         "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only", "-fno-signed-zeros",
         "-fassociative-math", "-ffp-contract=fast")
_reason = ""


def cache_dir() -> Path:
    if os.environ.get("DUPLEX_CACHE_DIR"):
        return Path(os.environ["DUPLEX_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "duplex"


def _cpu_identity() -> str:
    """What `-march=native` compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))


def _build(cc: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-800:]}")
        os.replace(tmp, out)  # atomic: a concurrent builder's copy is the same library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel (built on first call, then cached on disk), or None if it cannot be."""
    global _reason
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        _reason = f"no C compiler ({os.environ.get('CC', 'cc')!r} not on PATH)"
        log.warning("SEANet C kernel unavailable: %s; Mimi uses its torch paths", _reason)
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS, version, _cpu_identity()]).encode())
        path = cache_dir() / f"seanet_kernel-{key.hexdigest()[:16]}.so"
        if not path.exists():
            log.info("building the SEANet C kernel: %s", path)
            _build(cc, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _reason = f"build or load failed: {e}"
        log.warning("SEANet C kernel unavailable: %s; Mimi uses its torch paths", _reason)
        return None
    f = lib.duplex_stream_conv
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int] * 8 + [ctypes.c_void_p] * 7 + [ctypes.c_int] * 3
    return lib


def unavailable_reason() -> str:
    """Why `library()` returned None ("" if it did not, or was not called yet)."""
    return _reason


def stream_conv(x: torch.Tensor, state: torch.Tensor | None, active: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, residual: torch.Tensor | None, *, stride: int, dilation: int,
                elu: bool, dots: bool) -> torch.Tensor:
    """One streaming step of a causal conv, `seanet_kernel.c`'s contract. x: (B, cin, L);
    state: (B, cin, pad = (k - 1) * dilation + 1 - stride) updated in place for active rows (None
    when pad is 0); active: (B,) bool; weight: (cout, cin, k); residual: (B, cout, L // stride) or
    None. CPU float32 only."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"SEANet C kernel unavailable: {unavailable_reason()}")
    B, cin, L = x.shape
    cout, wcin, k = weight.shape
    pad = (k - 1) * dilation + 1 - stride  # the causal left context
    lout = L // stride  # (pad + L - span) // stride + 1 with this pad
    tensors = [x, weight, active] + [t for t in (state, bias, residual) if t is not None]
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        raise ValueError("the SEANet C kernel takes contiguous CPU tensors")
    if active.dtype != torch.bool or any(t.dtype != torch.float32 for t in tensors if t is not active):
        raise ValueError("the SEANet C kernel takes float32 signals and weights and a bool mask")
    if wcin != cin or active.shape != (B,) or lout < 1 or pad < 0 or (
            (B, cin, pad) != (tuple(state.shape) if state is not None else (B, cin, 0))):
        raise ValueError("inconsistent shapes for the SEANet C kernel")
    if residual is not None and residual.shape != (B, cout, lout):
        raise ValueError(f"residual must be {(B, cout, lout)}, got {tuple(residual.shape)}")
    y = torch.empty(B, cout, lout)

    def ptr(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    rc = lib.duplex_stream_conv(B, cin, cout, k, stride, dilation, L, pad, x.data_ptr(), ptr(state),
                                active.data_ptr(), weight.data_ptr(), ptr(bias), ptr(residual), y.data_ptr(),
                                int(elu), int(dots), max(1, min(B, torch.get_num_threads())))
    if rc:
        raise MemoryError("SEANet C kernel: out of memory for its scratch buffers")
    return y
