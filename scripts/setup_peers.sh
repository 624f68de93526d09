#!/usr/bin/env bash
# Idempotent set-up of .venv-peers: third-party clients of our servers, installed as their own
# users install them, for the tests to run against duplex. A virtualenv of its own, because
# they bring their frameworks (LiveKit Agents) whose pins need not agree with ours.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(pwd)/.venv-peers"
PY=${PYTHON:-python3}
PEERS=("livekit-plugins-kyutai-lasuite==0.0.6")  # LiveKit Agents' Kyutai STT plugin (moshi-server protocol)

STAMP="$VENV/.peers-installed"
WANT=$(printf '%s\n' "${PEERS[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  printf '\n\033[1m==> [%s] peers: installing %s into %s\033[0m\n' "$(date +%H:%M:%S)" "${PEERS[*]}" "$VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "${PEERS[@]}"
  echo "$WANT" > "$STAMP"
fi
