"""The turn state machine, driven by synthetic VAD frames (no models)."""
from agent.turns import BargeIn, EndOfTurn, StartUtterance, State, TurnConfig, TurnMachine

F = 0.032


def drive(m, pattern, t0=0.0):
    """pattern: string of '#' (speech) and '.' (silence), one 32 ms frame each."""
    out, t = [], t0
    for ch in pattern:
        t += F
        out += [(round(t, 3), c) for c in m.on_vad(t, 0.9 if ch == "#" else 0.05, F)]
    return out, t


def test_normal_turn():
    m = TurnMachine()
    cmds, t = drive(m, "...." + "#" * 30 + "." * 20)
    kinds = [type(c) for _, c in cmds]
    assert kinds == [StartUtterance, EndOfTurn]
    start, end = cmds[0][1], cmds[1][1]
    assert abs(start.t_start - 4 * F) < 1e-9
    assert abs(end.t_speech_end - 34 * F) < 1e-9  # first silent frame starts here
    # endpoint decided once endpoint_silence_s of silence has passed
    assert abs(cmds[1][0] - (34 * F + 16 * F)) < F
    assert m.state == State.THINKING
    m.on_reply_started(t)
    assert m.state == State.BOT_SPEAKING
    m.on_reply_finished(t + 1)
    assert [s for _, _, s in m.transitions] == [State.USER_SPEAKING, State.THINKING, State.BOT_SPEAKING, State.LISTENING]


def test_short_blip_is_not_speech():
    m = TurnMachine()
    cmds, _ = drive(m, "..#..#..")
    assert cmds == [] and m.state == State.LISTENING


def test_pause_shorter_than_endpoint_keeps_the_turn():
    m = TurnMachine()
    cmds, _ = drive(m, "#" * 20 + "." * 10 + "#" * 20 + "." * 20)
    assert [type(c) for _, c in cmds] == [StartUtterance, EndOfTurn]


def test_barge_in_needs_min_speech():
    m = TurnMachine(TurnConfig(barge_in_min_speech_s=0.3))
    _, t = drive(m, "#" * 20 + "." * 20)
    m.on_reply_started(t)
    cmds, t = drive(m, "#" * 5 + "." * 5, t)  # 160 ms: a cough
    assert cmds == [] and m.state == State.BOT_SPEAKING
    cmds, t = drive(m, "#" * 12, t)
    assert [type(c) for _, c in cmds] == [BargeIn, StartUtterance]
    assert m.state == State.USER_SPEAKING


def test_max_utterance_forces_endpoint():
    m = TurnMachine(TurnConfig(max_utterance_s=1.0))
    cmds, _ = drive(m, "#" * 35)  # 1.12 s
    assert [type(c) for _, c in cmds] == [StartUtterance, EndOfTurn]
    assert m.state == State.THINKING
    # a user who keeps talking interrupts that forced turn once, and starts a new utterance
    cmds, _ = drive(m, "#" * 20, 35 * F)
    assert [type(c) for _, c in cmds] == [BargeIn, StartUtterance]


def test_empty_transcript_returns_to_listening():
    m = TurnMachine()
    _, t = drive(m, "#" * 20 + "." * 20)
    m.on_reply_finished(t)
    assert m.state == State.LISTENING
    cmds, _ = drive(m, "#" * 10, t)
    assert [type(c) for _, c in cmds] == [StartUtterance]
