"""The final decode searches a beam while partials stay greedy: a final is what the reply answers,
and it usually runs in the pause before the turn is confirmed; a partial is re-decoded every hop
and only shown. `--asr-beam 1` gives the cheaper greedy final back."""
import numpy as np

from asr.whisper import WhisperOptions, WhisperRecognizer


class RecordingRecognizer(WhisperRecognizer):
    """A recognizer double: no model, records the beam each decode asks for."""

    def __init__(self, options: WhisperOptions):
        super().__init__(model=None, options=options)
        self.beams: list[tuple[str, int]] = []
        self.pads: list[float | None] = []

    def transcribe(self, audio, word_timestamps=False, keep_going=None, beam_size=None, final=False, pad_s=None):
        kind = "final" if final else "partial"
        self.beams.append((kind, self.options.beam_size if beam_size is None else beam_size))
        self.pads.append(pad_s)
        return "hello there", ()


def decode_one(options: WhisperOptions) -> RecordingRecognizer:
    """A partial, then the final, of one utterance: the recognizer says what each asked for."""
    rec = RecordingRecognizer(options)
    dec = rec.open_decoder()
    dec.push(np.zeros(32000, np.float32))
    dec.partial(force=True)
    dec.finalize()
    return rec


def test_by_default_the_final_searches_a_beam_of_five_and_partials_are_greedy():
    assert decode_one(WhisperOptions()).beams == [("partial", 1), ("final", 5)]


def test_a_final_beam_of_one_is_the_greedy_final():
    assert decode_one(WhisperOptions(final_beam_size=1)).beams == [("partial", 1), ("final", 1)]


def test_without_a_final_beam_the_final_takes_the_partials_beam():
    assert decode_one(WhisperOptions(beam_size=3, final_beam_size=None)).beams == [("partial", 3), ("final", 3)]


def test_a_quick_decode_of_brief_speech_over_the_bot_is_greedy_and_a_longer_one_searches_the_beam():
    """Its words decide now whether the paused bot goes on: for a backchannel the beam hears no
    better, and the silence before the bot goes on is shorter by the beam's time."""
    default, never = WhisperOptions(), WhisperOptions(quick_greedy_s=None)
    brief = int(default.quick_greedy_s * 16000)
    asked = []
    for opts, n, quick in ((default, brief, True), (default, brief + 1600, True), (default, brief, False),
                           (never, brief, True)):
        rec = RecordingRecognizer(opts)
        dec = rec.open_decoder()
        dec.push(np.zeros(n, np.float32))
        dec.decode(quick=quick)
        asked.append(rec.beams[-1][1])
    assert asked == [1, 5, 5, 5]


def test_the_asr_beam_flag_sets_the_final_beam_only():
    import argparse

    from agent.serving.cli import _model_args
    from agent.conversation.models import ModelChoice, recognizer_options

    parser = argparse.ArgumentParser()
    _model_args(parser)
    args = parser.parse_args(["--asr-beam", "1"])
    opts = recognizer_options(ModelChoice(asr_beam=args.asr_beam))["options"]
    assert (opts.final_beam_size, opts.beam_size) == (1, 1)
    assert recognizer_options(ModelChoice()) == {}  # the default options: beam 5 finals
    assert recognizer_options(ModelChoice(asr_beam=4))["options"].final_beam_size == 4


def test_the_unsure_final_recheck_is_on_by_default_and_one_flag_turns_it_off():
    import argparse

    from agent.serving.cli import _model_args
    from agent.conversation.models import ModelChoice, recognizer_options

    parser = argparse.ArgumentParser()
    _model_args(parser)
    from asr.whisper import RECHECK_LOGPROB

    default = parser.parse_args([])
    assert default.asr_recheck == "unsure"
    assert recognizer_options(ModelChoice(asr_recheck=default.asr_recheck == "unsure")) == {}
    assert WhisperOptions().unsure_logprob == RECHECK_LOGPROB
    args = parser.parse_args(["--asr-recheck", "never"])
    opts = recognizer_options(ModelChoice(asr_recheck=args.asr_recheck == "unsure"))["options"]
    assert opts.unsure_logprob is None and opts.final_beam_size == WhisperOptions().final_beam_size


def test_a_final_pads_its_window_by_the_finals_padding_and_a_partial_by_its_own():
    assert decode_one(WhisperOptions(final_window_pad_s=20.0)).pads == [None, 20.0]  # None: window_pad_s
    assert decode_one(WhisperOptions()).pads == [None, None]  # by default a final pads as a partial does
