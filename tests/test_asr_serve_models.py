"""`duplex asr-serve --model`: which recognizer each choice builds (no real model is loaded here).

No `--model` must give a newcomer a speech model (the embedded Whisper), never the random engine;
`tiny-random` and Kyutai checkpoints (hub id or directory) are explicit choices."""
from __future__ import annotations

import pytest

import asr.engine.kyutai
import asr.whisper
from asr.engine.scheduler import EngineScheduler
from asr.serving.server import build_recognizer, parse_args
from asr.serving.whisper_service import WhisperService

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeWhisper:
    """Stands in for the loaded faster-whisper model: these tests check wiring, not decoding."""

    def __init__(self, name: str):
        self.name = name


@pytest.fixture
def whisper_loads(monkeypatch) -> list[str]:
    loaded: list[str] = []

    def load(name="whisper-tiny.en", **_):
        loaded.append(name)
        return FakeWhisper(name)

    monkeypatch.setattr(asr.whisper.WhisperRecognizer, "load", staticmethod(load))
    return loaded


def test_no_model_serves_the_embedded_whisper(whisper_loads):
    args = parse_args(["--slots", "3", "--admission-wait", "1.5"])
    assert args.model == "whisper-tiny.en"
    recognizer = build_recognizer(args)
    assert isinstance(recognizer, WhisperService)
    assert whisper_loads == ["whisper-tiny.en"]
    assert recognizer.config.max_sessions == 3 and recognizer.config.admission_wait_s == 1.5
    assert "random" not in recognizer.name.lower()


def test_tiny_random_is_an_explicit_choice(whisper_loads):
    recognizer = build_recognizer(parse_args(["--model", "tiny-random", "--slots", "2", "--no-tune-convs"]))
    assert isinstance(recognizer, EngineScheduler) and recognizer.batch_size == 2
    assert recognizer.model.is_random and "NOT A SPEECH MODEL" in recognizer.name
    assert whisper_loads == []


def test_hub_id_goes_to_from_pretrained_with_the_cli_settings(monkeypatch, whisper_loads):
    """A hub id needs internet, so the loader is replaced: this checks what asr-serve asks of it."""
    import torch

    calls = []

    class Stop(Exception):
        pass

    def fake_from_pretrained(name, batch_size, **kw):
        calls.append((name, batch_size, kw))
        raise Stop

    monkeypatch.setattr(asr.engine.kyutai, "from_pretrained", fake_from_pretrained)
    with pytest.raises(Stop):
        build_recognizer(parse_args(["--model", "kyutai/stt-1b-en_fr", "--slots", "4", "--device", "cpu"]))
    (name, batch_size, kw), = calls
    assert (name, batch_size, kw["device"], kw["dtype"]) == ("kyutai/stt-1b-en_fr", 4, "cpu", torch.bfloat16)
    assert whisper_loads == []
