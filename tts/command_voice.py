"""Fallback voices from Debian packages, run as subprocesses: espeak-ng and flite."""
from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import soundfile as sf

from tts.base import SentenceSynthesizer


class CommandSynthesizer(SentenceSynthesizer):
    COMMANDS = {
        "espeak-ng": lambda text: ["espeak-ng", "--stdout", text],
        "flite": lambda text: ["flite", "-voice", "slt", "-t", text, "-o", "/dev/stdout"],
    }

    def __init__(self, program: str = "espeak-ng"):
        if program not in self.COMMANDS:
            raise ValueError(f"unknown voice program {program!r}: one of {sorted(self.COMMANDS)}")
        if shutil.which(program) is None:
            raise FileNotFoundError(f"{program} is not installed (apt-get install {program})")
        self.name = program
        self._argv = self.COMMANDS[program]
        self.sample_rate = int(sf.info(io.BytesIO(self._run("ready"))).samplerate)

    def _run(self, text: str) -> bytes:
        return subprocess.run(self._argv(text), capture_output=True, check=True, timeout=60).stdout

    def synthesize(self, text: str) -> np.ndarray:
        data, rate = sf.read(io.BytesIO(self._run(text)), dtype="int16")
        if rate != self.sample_rate:
            raise RuntimeError(f"{self.name} changed its rate from {self.sample_rate} to {rate}")
        return np.asarray(data, dtype=np.int16).reshape(-1)
