"""Text-to-speech: the Synthesizer protocol, Piper (default) and espeak-ng/flite fallbacks."""
from tts.base import AudioChunk, Synthesizer

__all__ = ["AudioChunk", "Synthesizer", "load_synthesizer"]


def load_synthesizer(name: str = "piper") -> Synthesizer:
    """`piper` (bundled joe voice), a path to a Piper .onnx voice, `espeak-ng` or `flite`.
    If Piper cannot load, `piper` falls back to espeak-ng and then flite."""
    from tts.command_voice import CommandSynthesizer
    from tts.piper_voice import PiperSynthesizer

    if name in CommandSynthesizer.COMMANDS:
        return CommandSynthesizer(name)
    if name.endswith(".onnx"):
        return PiperSynthesizer(name)
    if name != "piper":
        raise ValueError(f"unknown voice {name!r}")
    try:
        return PiperSynthesizer()
    except Exception as exc:  # a broken install should still speak
        import logging

        logging.getLogger("duplex.tts").warning("Piper failed to load (%s); falling back", exc)
        for program in ("espeak-ng", "flite"):
            try:
                return CommandSynthesizer(program)
            except Exception:
                continue
        raise
