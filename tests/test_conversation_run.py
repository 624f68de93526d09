"""Stream-and-compute behaviour end to end, with the real default models, through `duplex run`:
a barge-in that cancels the LLM within one token and flushes the audio, a context that keeps only
the words the user heard, and a speculative reply that is committed."""
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from helpers import say, silence

pytestmark = pytest.mark.models


def _converse(d, *extra: str, inputs: dict | None = None, at: tuple[str, float] = ("stop", 1.5),
              max_tokens: int = 400):
    inputs = inputs or {
        "story": "Please tell me a long story about a brave little dragon.",
        "stop": "Stop. Wait a moment please.",
        "spider": "How many legs does a spider have?",
    }
    for name, text in inputs.items():
        x = say(text, d / f"{name}.raw.wav")
        sf.write(d / f"{name}.wav", np.concatenate([silence(0.4), x, silence(0.2)]), 16000, subtype="PCM_16")
    out = d / "bot.wav"
    cmd = [sys.executable, "-m", "agent.serving.cli", "run",
           *[a for name in inputs for a in ("--input", f"{d / name}.wav@reply+{at[1]:g}" if name == at[0]
                                             else str(d / f"{name}.wav"))],
           "--output", str(out), "--log", str(d / "log.jsonl"), "--trace", str(d / "run.trace.json"),
           "--far-end-log", str(d / "far.jsonl"), "--max-tokens", str(max_tokens),
           # a long answer, so the LLM is still generating when the user talks over it
           "--system-prompt", "You are a storyteller. Answer every request with a long, detailed story "
                              "of at least ten sentences. Answer questions in one sentence.", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()]
    far = [json.loads(line) for line in (d / "far.jsonl").read_text().splitlines()]
    print("\n".join(json.dumps(r)[:400] for r in rows))
    return d, [r for r in rows if "turn" in r], rows[-1], far


@pytest.fixture(scope="module")
def conversation(tmp_path_factory):
    """With the default end-of-turn policy ("combined"). The LLM writes several times faster than
    the voice speaks and the 0.5B model's stories end anywhere from ~50 to 400 tokens, so the
    request asks for a very long one and the user talks over it early, 1 s after the story began
    playing (its speech 0.4 s into the input): the LLM must still be writing when the barge-in comes."""
    return _converse(tmp_path_factory.mktemp("conv"), at=("stop", 1.0), inputs={
        "story": "Please tell me a very long story about a brave little dragon and his friends.",
        "stop": "Stop. Wait a moment please.",
        "spider": "How many legs does a spider have?"})


@pytest.fixture(scope="module")
def backchannel_conversation(tmp_path_factory):
    """A story, a "Mm-hmm." said over it 1.5 s after it began playing, then a question once it is over."""
    return _converse(tmp_path_factory.mktemp("conv-mmhmm"), max_tokens=60, at=("mmhmm", 1.5), inputs={
        "story": "Please tell me a long story about a brave little dragon.",
        "mmhmm": "Mm-hmm.",
        "spider": "How many legs does a spider have?"})


@pytest.fixture(scope="module")
def rules_conversation(tmp_path_factory):
    """With the rules, which speculate at every pause whatever the cores (the combined policy,
    on one core's hyperthreads, often ends the turn at its verdict, with nothing to speculate
    on) and ask smart-turn first. 1.5 s of silence end a sentence and 3 s any other turn here: the
    turn must still be open when the pause's transcript comes, and a busy machine's decode at the
    pause has taken 1.5-1.9 s (after smart-turn; at the default 1.5 s the turn then ended first,
    with nothing to speculate on)."""
    return _converse(tmp_path_factory.mktemp("conv-rules"), "--endpointing", "rules", "--endpoint-silence", "1.5",
                     "--endpoint-max-silence", "3")


def test_barge_in_cancels_llm_within_one_token_and_flushes_audio(conversation):
    from agent.tracing.export import load_events

    d, turns, summary, far = conversation
    assert turns[0]["interrupted"], "speaking over the story did not interrupt it"
    events = load_events(str(d / "run.trace.json"))
    barge = min(e.ts_ns for e in events if e.stage == "turn" and e.name == "barge_in" and e.turn == 0)
    late_tokens = [e for e in events if e.stage == "llm" and e.name == "token" and e.turn == 0 and e.ts_ns > barge]
    assert len(late_tokens) <= 1, f"{len(late_tokens)} LLM tokens after the barge-in"
    assert any(e.stage == "llm" and e.name == "cancel" and e.turn == 0 for e in events), \
        "the LLM was not cancelled (it had finished: the test needs a longer answer)"
    assert any(e.stage == "tts" and e.name == "cancel" and e.turn == 0 for e in events)

    clear_t = next(e["t"] for e in far if e["type"] == "clear")
    audio, rate = sf.read(d / "bot.wav", dtype="float32")
    first_played = min(e["t"] for e in far if e["type"] == "played" and e["t"] < clear_t)
    before = audio[int(first_played * rate):int((clear_t - 0.05) * rate)]  # the story up to the barge-in
    after = audio[int((clear_t + 0.05) * rate):int((clear_t + 0.8) * rate)]
    assert np.sqrt(np.mean(before ** 2)) > 0.01, "the bot was not speaking before the barge-in"
    assert np.abs(after).max() < 1e-3, "the bot's audio went on after the flush"


def test_context_keeps_exactly_the_heard_words(conversation):
    d, turns, summary, far = conversation
    clear_t = next(e["t"] for e in far if e["type"] == "clear")
    played = {e["id"] for e in far if e["type"] == "played" and e["t"] <= clear_t}
    sent = [e for e in far if e["type"] == "audio" and e["t"] <= clear_t]
    heard = " ".join(e["text"] for e in sent if e["id"] in played and e["text"]).strip()
    assert heard, "nothing of the story was heard"
    history = summary["history"]
    assert history[0] == {"role": "user", "content": turns[0]["user"]}
    assert history[1] == {"role": "assistant", "content": heard}
    reply_words, heard_words = turns[0]["reply"].split(), heard.split()
    assert len(heard_words) < len(reply_words) and reply_words[:len(heard_words)] == heard_words


def test_a_speculative_reply_is_committed(rules_conversation):
    d, turns, summary, far = rules_conversation
    assert summary["speculation"]["committed"] >= 1, summary["speculation"]
    committed = [t for t in turns if t["speculative"]]
    assert committed and all(t["reply"] and t["voice_to_voice_ms"] > 0 for t in committed)
    assert "spider" in turns[-1]["user"].lower() and turns[-1]["reply"]


def test_the_turn_model_runs_before_the_early_decode_not_beside_it(rules_conversation):
    """At the first silent frame the session asks smart-turn and only then decodes: beside the
    decode or the LLM's prompt it would take the cores they need (see agent/conversation/session.py)."""
    from agent.tracing.export import load_events

    d, turns, summary, far = rules_conversation
    events = load_events(str(d / "run.trace.json"))
    checks = [e for e in events if e.stage == "turn" and e.name == "eou_check"]
    decodes = [e for e in events if e.stage == "asr" and e.name == "pause_decode"]
    assert checks and decodes
    led = 0
    for dec in decodes:
        before = [c for c in checks if c.ts_ns <= dec.ts_ns]
        if before and before[-1].turn == dec.turn and dec.ts_ns - before[-1].end_ns < 300_000_000:
            assert before[-1].end_ns <= dec.ts_ns, "the decode started while the turn model ran"
            led += 1
    assert led >= 1, "no early decode followed a turn-model check"


def test_the_default_policy_asks_the_text_model_after_the_early_decode(conversation):
    """"combined": the decode first, then the text model on its transcript, alone (beside the
    decode it would be slower, and the turn's end waits for it); smart-turn after that, only
    when its verdict could still move the wait. Every turn is answered."""
    from agent.tracing.trace import Ev, Stage
    from agent.tracing.export import load_events

    d, turns, summary, far = conversation
    events = load_events(str(d / "run.trace.json"))
    checks = [e for e in events if e.stage == Stage.TURN and e.name == Ev.TEXT_TURN_CHECK]
    decodes = [e for e in events if e.stage == Stage.ASR and e.name == Ev.PAUSE_DECODE]
    assert checks and decodes, "the text model was never asked"
    for c in checks:
        before = [x for x in decodes if x.ts_ns <= c.ts_ns and x.turn == c.turn]
        assert before and before[-1].end_ns <= c.ts_ns, "a text check ran beside the decode it scores"
    assert len(turns) == 3 and all(t["reply"] for t in turns), [(t["user"], t["reply"]) for t in turns]


def test_a_backchannel_over_the_story_pauses_it_and_it_plays_on_whole(backchannel_conversation):
    """Real audio and models: flite's "Mm-hmm." over the story pauses it at its first frames;
    the recognizer's words for it are no interruption, so the story resumes from the sample it
    paused at, is heard whole, and the backchannel is no turn: the next question is answered."""
    from agent.tracing.trace import Ev, Stage
    from agent.tracing.export import load_events

    d, turns, summary, far = backchannel_conversation
    events = load_events(str(d / "run.trace.json"))
    names = [e.name for e in events if e.stage == Stage.TURN]
    assert Ev.REPLY_PAUSED in names, "the backchannel did not pause the story (it must, at its onset)"
    assert Ev.RESUME in names, f"the story did not resume: {[(t['user'], t['interrupted']) for t in turns]}"
    story = turns[0]
    assert not story["interrupted"] and story["heard"] == story["reply"], (story["heard"], story["reply"])
    answered = [t for t in turns if t["reply"]]
    assert len(answered) == 2 and "spider" in answered[-1]["user"].lower(), [(t["user"], t["reply"][:40]) for t in turns]
    history = summary["history"]
    assert history[1] == {"role": "assistant", "content": story["reply"]}
