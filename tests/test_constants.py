"""Each sample rate is named once, where it belongs, and imported wherever else it is meant.

The 16 kHz that the speech models hear is `asr.base.SPEECH_RATE`; Kyutai's 24 kHz is
`asr.moshi_protocol.SAMPLE_RATE`; a transport takes a caller's audio at `transport.audio.INPUT_RATE`
where the wire does not say (the same number as SPEECH_RATE: transports may not import asr). A
16000 or 24000 written as a number anywhere else in the product, the examples or the scripts is a
rate that has lost its name. Tests and docs are not read.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("agent", "asr", "llm", "tts", "transport", "examples", "scripts")
RATES = {16000, 24000}
# the modules that write a rate as a number, each only in module-level constants (NAME = ...)
DEFINED = {
    "asr/base.py": "SPEECH_RATE: what Silero VAD, Whisper and the end-of-turn model hear",
    "asr/moshi_protocol.py": "SAMPLE_RATE: what Kyutai's models hear, and their protocol carries",
    "transport/audio.py": "INPUT_RATE: a caller's audio where the wire does not say",
    "transport/telephony/audiosocket.py": "AUDIO_KINDS: the AudioSocket kind bytes and their rates (the spec's)",
    "transport/telephony/media_streams.py": "the Dialects: the rates each carrier documents",
    "transport/telephony/vonage.py": "RATES: the rates Vonage documents for its audio/l16 streams",
    "examples/pipecat_bot.py": "REPLY_RATE: what pipecat sends its client (pipecat's default)",
}
# read as they are: the numbers there are inputs, not rates the code works at
EXEMPT = {
    "scripts/fuzz_sockets.py": "the fuzzer's wire inputs, right and wrong, written from the specs",
}


def _constant_assignment(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    else:
        return False
    names = [n for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return all(isinstance(n, ast.Name) and n.id.isupper() for n in names)


def _bare_rates(path: Path, constants_allowed: bool) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for stmt in tree.body:
        if constants_allowed and _constant_assignment(stmt):
            continue
        for node in ast.walk(stmt):
            if (isinstance(node, ast.Constant) and type(node.value) in (int, float)
                    and node.value in RATES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_no_rate_is_written_as_a_bare_number():
    bare = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in EXEMPT:
                continue
            bare += _bare_rates(path, constants_allowed=rel in DEFINED)
    assert not bare, ("sample rates written as numbers; import asr.base.SPEECH_RATE, "
                      "asr.moshi_protocol.SAMPLE_RATE or transport.audio.INPUT_RATE instead:\n" + "\n".join(bare))


def test_the_listed_modules_exist():
    for rel in [*DEFINED, *EXEMPT]:
        assert (ROOT / rel).is_file(), f"{rel} is gone: take it out of tests/test_constants.py"


def test_transports_hand_the_speech_models_their_rate():
    from asr.base import SPEECH_RATE
    from transport.audio import INPUT_RATE

    assert INPUT_RATE == SPEECH_RATE, "audio a transport takes at INPUT_RATE would be resampled for every model"


def test_the_check_sees_a_bare_rate(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    f = tmp_path / "m.py"
    f.write_text("RATE = 16000\n\ndef g(rate=24000):\n    return rate * 2\n")
    assert [s.split(": ")[1] for s in _bare_rates(f, constants_allowed=True)] == ["24000"]
    assert len(_bare_rates(f, constants_allowed=False)) == 2
