"""Speech over the bot told apart by its sound: real Silero, Whisper, LLM and voice. A voice
across the room, 20 dB below the user's own turn, says a sentence over the story: the bot neither
pauses nor answers it (`TurnConfig.echo_level_db`); the same sentence at the user's level pauses it
at once (`duplex bench overlap` measures both over many voices). A long "Mm-hmm." at the user's
level pauses it, and it goes on while the hum is still said (`TurnConfig.look_over_s`). A request
the user says turned away from the microphone (6 dB quieter, in a room's reverberation) lets it go
on while said and is not answered; the same words as quiet, said into the microphone, cut it
(`TurnConfig.turned_away`)."""
import asyncio
import math

import numpy as np
import pytest

from helpers import say, silence

pytestmark = pytest.mark.models

STORY = "Please tell me a long story about a brave little dragon."
ACROSS_THE_ROOM = "The weather tomorrow will be sunny, with a high of seventy degrees."
SIDE_TALK = "Can you close the window? It's getting cold in here."  # by its words, a request to the bot


def other_voice(text: str, path, gain_db: float) -> np.ndarray:
    """`text` in flite's kal voice (the user speaks in slt), scaled by `gain_db`, at 16 kHz."""
    return (say(text, path, voice="kal16") * 10 ** (gain_db / 20)).astype(np.float32)


def run(tmp_path, over: np.ndarray):
    from agent.conversation.models import load_models
    from agent.conversation.session import Session, SessionConfig
    from agent.tracing.trace import Tracer
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    story = np.concatenate([silence(0.4), say(STORY, tmp_path / "s.wav"), silence(0.2)])
    turns = [ScriptedTurn(story, 16000, "story"), ScriptedTurn(over, 16000, "over", start_after_s=3.0)]
    models = load_models()
    config = SessionConfig(max_tokens=60, system_prompt=(
        "You are a storyteller. Answer every request with a long, detailed story of at least ten sentences."))
    transport = WavConversationTransport(turns, models.tts.sample_rate, str(tmp_path / "bot.wav"),
                                         reply_timeout_s=120)
    tracer = Tracer("t")
    session = Session(models, transport, config, tracer=tracer)
    asyncio.run(session.run())
    transport.close()
    return session, tracer


def test_a_voice_across_the_room_neither_pauses_nor_is_answered(tmp_path):
    from agent.tracing.trace import Ev

    user_peak = float(np.max(np.abs(say(STORY, tmp_path / "p.wav"))))
    over = other_voice(ACROSS_THE_ROOM, tmp_path / "o.wav", 0.0)
    over *= user_peak / float(np.max(np.abs(over))) * 10 ** (-20 / 20)  # 20 dB below the user
    session, tracer = run(tmp_path, over)
    names = [e.name for e in tracer.events()]
    assert Ev.BARGE_IN not in names, "the voice across the room paused the bot"
    first = session.records[0]
    assert first.reply_text and not first.interrupted and first.heard_text == first.reply_text
    assert [m["role"] for m in session.history] == ["user", "assistant"], "it was answered"


def test_the_same_words_at_the_users_level_pause_the_bot_at_once(tmp_path):
    from agent.bench.overlap import set_level, speech_level_db
    from agent.tracing.trace import Ev

    # the user's level by speech frames, as the turn machine compares them: kal's voice at slt's
    # loudest sample is 7 dB below her loudest frame, and judged said away (TurnConfig.turned_away)
    level = speech_level_db(say(STORY, tmp_path / "p.wav"))
    over = set_level(other_voice(ACROSS_THE_ROOM, tmp_path / "o.wav", 0.0), level)
    session, tracer = run(tmp_path, over)
    (paused,) = [e for e in tracer.events() if e.name == Ev.REPLY_PAUSED][:1]
    assert paused.args["speech_to_clear_ms"] < 400  # (the target is 250 ms; a CI machine may be loaded)
    assert session.records[0].interrupted


def assert_the_story_went_on_while_it_was_said(session, tracer, what: str) -> None:
    """The story paused for the speech over it, went on before that speech ended, played to its
    end, and the speech was no turn."""
    from agent.tracing.trace import Ev

    events = tracer.events()
    paused = next(e for e in events if e.name == Ev.REPLY_PAUSED)
    resumed = next(e for e in events if e.name == Ev.RESUME and e.ts_ns > paused.ts_ns)
    said_end = next(e for e in events if e.name == Ev.USER_SPEECH_END and e.ts_ns > paused.ts_ns)
    assert resumed.ts_ns < said_end.ts_ns, f"the story waited for the end of the {what}"
    first = session.records[0]
    assert first.reply_text and not first.interrupted and first.heard_text == first.reply_text
    assert [m["role"] for m in session.history] == ["user", "assistant"], f"the {what} was answered"


def test_a_long_hum_lets_the_story_go_on_before_it_ends_and_is_no_turn(tmp_path):
    hum = say("Mm-hmm.", tmp_path / "h.wav")  # the user's own voice: 1.1 s of flite's slt
    session, tracer = run(tmp_path, hum)
    assert_the_story_went_on_while_it_was_said(session, tracer, "hum")


def turned_away(tmp_path, room: bool) -> np.ndarray:
    """SIDE_TALK in the user's own voice, 6 dB below their turn, through a room (RT60 0.3-0.5 s,
    `duplex bench overlap`'s) or not."""
    from agent.bench.overlap import room as through_a_room
    from agent.bench.overlap import set_level, speech_level_db

    level = speech_level_db(say(STORY, tmp_path / "p.wav")) - 6.0
    said = say(SIDE_TALK, tmp_path / "t.wav")
    return set_level(through_a_room(said, np.random.default_rng(0)) if room else said, level)


def test_a_request_said_to_someone_across_the_room_lets_the_story_go_on_and_is_no_turn(tmp_path):
    session, tracer = run(tmp_path, turned_away(tmp_path, room=True))
    assert_the_story_went_on_while_it_was_said(session, tracer, "side talk")


def test_the_same_request_as_quiet_said_into_the_microphone_cuts_the_story(tmp_path):
    session, tracer = run(tmp_path, turned_away(tmp_path, room=False))
    assert session.records[0].interrupted
    assert [m["role"] for m in session.history][:3] == ["user", "assistant", "user"], "it was not taken as a turn"


def scored(x: np.ndarray, vad=None) -> tuple[list[float], list[float], list[float]]:
    """Silero's probability for each 32 ms frame of `x` (16 kHz), each frame's level and the
    levels of its `turned_away.STEP_S` steps, read from an audio ring as the listener reads them."""
    from agent.conversation.listener import STEPS_PER_FRAME, VAD_FRAME
    from asr.ring import AudioRing, merged_levels
    from asr.vad import SileroVAD

    probs = (vad or SileroVAD()).new_stream()(x)
    ring = AudioRing(x.size)
    ring.push(x)
    steps = ring.window_levels(len(probs) * STEPS_PER_FRAME, VAD_FRAME // STEPS_PER_FRAME, VAD_FRAME)
    return probs, merged_levels(steps, STEPS_PER_FRAME), steps


def silence_over(user: np.ndarray, over: np.ndarray, noise_db: float) -> float | None:
    """`user` (a turn of theirs, answered), then `over` said over the bot, with a noise floor of
    `noise_db`, through Silero and the turn machine, each 32 ms frame with its level and its two
    16 ms steps' as the listener feeds them: seconds from the bot pausing for `over` to its
    reply going on by the sound (inf: it did not go on while `over` was said; None: it never paused)."""
    from agent.conversation.listener import STEPS_PER_FRAME, VAD_FRAME_S
    from agent.conversation.overlap import BALANCED
    from agent.conversation.turns import PauseReply, ResumeReply, State, TurnConfig, TurnMachine

    x = np.concatenate([silence(0.3), user, silence(2.5), over, silence(0.3)])
    x = (x + np.random.default_rng(0).standard_normal(x.size) * 10 ** (noise_db / 20)).astype(np.float32)
    start = 0.3 + user.size / 16000 + 2.5
    probs, levels, steps = scored(x)
    m = TurnMachine(BALANCED.apply(TurnConfig()))
    paused = None
    for k, p in enumerate(probs):
        t = (k + 1) * VAD_FRAME_S
        commands = m.on_vad(t, p, VAD_FRAME_S, levels[k], tuple(steps[k * STEPS_PER_FRAME:(k + 1) * STEPS_PER_FRAME]))
        if t < start and m.state == State.ENDPOINT_PENDING:
            commands += m.on_eou(t, 0.95)
        if t < start and m.state == State.THINKING:
            m.on_final(t, "the user's turn")
            m.on_reply_started(t)
        if t >= start and paused is None and any(isinstance(c, PauseReply) for c in commands):
            paused = t
        if paused is not None and any(isinstance(c, ResumeReply) for c in commands):
            return t - paused
    return None if paused is None else math.inf


def test_side_talk_a_room_draws_out_with_no_syllable_end_costs_half_a_second_of_silence(tmp_path):
    # `duplex bench overlap`'s side talk in kal's voice: "Could you hand me that pen?" runs on
    # voiced, and said away the room left no syllable's end in its first second: the bot was
    # silent a second and more (`TurnedAway.unbroken_s`)
    from agent.bench.overlap import Voices, make_item

    voices = Voices(tmp_path)
    for seed in range(3):
        item = make_item("side_talk", 6, seed, voices)
        assert item.voice == "kal" and "pen" in item.overlap_text
        silent = silence_over(item.first, item.overlap, item.noise_db)
        assert silent is not None and silent < 0.55, (seed, silent)
    # the same words as quiet said into the microphone: the bot waits for them
    said = voices(item.overlap_text, item.voice)
    assert silence_over(item.first, said * (np.abs(item.overlap).max() / np.abs(said).max()), item.noise_db) == math.inf


def test_real_speech_into_a_microphone_ends_a_syllable_within_the_unbroken_wait():
    # the dev recordings (people reading, into a microphone): each has ended a syllable (a fall
    # within 128 ms at least `end_ratio` of the median sharpest fall of them all) within
    # `TurnedAway.unbroken_s` of its first speech frame, so that a quiet turn of the user's is not
    # taken for side talk for running on voiced ("had he married a more amiable woman" ends its
    # first between 0.57 and 0.6 s)
    import statistics

    import soundfile as sf

    from agent.conversation.listener import STEPS_PER_FRAME
    from agent.conversation.turned_away import STEP_S, SharpestFall, TurnedAway
    from agent.conversation.turns import TurnConfig
    from asr.vad import SileroVAD
    from helpers import DEV
    from transport.audio import resample

    c, speech = TurnedAway(), TurnConfig().speech_threshold
    vad = SileroVAD()
    sharpest, ended_by = [], []
    for path in sorted(DEV.glob("*.wav")):
        x, rate = sf.read(path, dtype="float32")
        x = resample(x if x.ndim == 1 else x.mean(axis=1), rate, 16000)
        probs, _, steps = scored(x, vad)
        first = next(k for k, p in enumerate(probs) if p >= speech) * STEPS_PER_FRAME
        fall = SharpestFall()
        for rms in steps[:first]:
            fall.feed(rms)
        fall.restart()
        ends = []
        for rms in steps[first:]:
            fall.feed(rms)
            ends.append(fall.end_db)
        sharpest.append(fall.db)
        ended_by.append((path.name, ends[round(c.unbroken_s / STEP_S) - 1]))
    reference = statistics.median(sharpest)
    assert len(ended_by) >= 10
    for name, end_db in ended_by:
        assert end_db >= c.end_ratio * reference, (name, round(end_db / reference, 2))
