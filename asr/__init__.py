"""Speech recognition: the streaming protocol, the embedded Whisper default, and the batched engine."""
from asr.base import Hypothesis, RecognizerStream, StreamingRecognizer, Word

__all__ = ["Hypothesis", "RecognizerStream", "StreamingRecognizer", "Word", "load_recognizer"]


def load_recognizer(name: str = "whisper-tiny.en", **kwargs) -> StreamingRecognizer:
    """Load a recognizer by name. `whisper-tiny.en` is embedded; other Whisper sizes or paths
    are passed to faster-whisper (hub ids need internet)."""
    from asr.whisper import WhisperRecognizer

    return WhisperRecognizer.load(name, **kwargs)
