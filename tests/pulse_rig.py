"""A PulseAudio daemon of a test's own: its modules from a config, its socket on the filesystem
(reachable from a network namespace too: PULSE_SERVER=unix:PATH), gone when the test ends."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest


def require_pulseaudio() -> None:
    """Skip (fail in CI, where scripts/setup.sh installs them) without pulseaudio and its tools."""
    if not (shutil.which("pulseaudio") and shutil.which("parec") and shutil.which("pactl")):
        if os.environ.get("CI"):
            pytest.fail("pulseaudio, pactl and parec are missing: scripts/setup.sh installs them")
        pytest.skip("pulseaudio is not installed (scripts/setup.sh installs it)")


@contextlib.contextmanager
def private_pulseaudio(d: Path, config: str, wait_for: tuple[Path, ...] = ()):
    """Run `pulseaudio` with `config` (pa.conf lines; the native socket is added) under `d`;
    yields the environment its clients need, once the socket and `wait_for` paths exist."""
    sock = d / "native"
    (d / "pa.conf").write_text(config + f"load-module module-native-protocol-unix auth-anonymous=1 socket={sock}\n")
    env = dict(os.environ, PULSE_RUNTIME_PATH=str(d / "runtime"), PULSE_SERVER=f"unix:{sock}")
    with open(d / "pulse.log", "w") as log:
        daemon = subprocess.Popen(["pulseaudio", "-n", "-F", str(d / "pa.conf"), "--daemonize=no",
                                   "--exit-idle-time=-1", "--disallow-exit"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 15
        while not all(p.exists() for p in (sock, *wait_for)) and time.time() < deadline:
            assert daemon.poll() is None, (d / "pulse.log").read_text()[-2000:]
            time.sleep(0.1)
        assert all(p.exists() for p in (sock, *wait_for)), (d / "pulse.log").read_text()[-2000:]
        yield env
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)


def pactl_json(env: dict, *what: str) -> list[dict]:
    """`pactl -f json list WHAT`: the daemon's objects as dicts."""
    out = subprocess.run(["pactl", "-f", "json", "list", *what], env=env, capture_output=True, text=True,
                         check=True, timeout=20).stdout
    return json.loads(out)
