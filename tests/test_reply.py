"""One Reply on test doubles: cancelled within a token, held at its gate, waterfall in order, paused and resumed."""
from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest

from agent.conversation.records import UserTurn
from agent.conversation.pipeline import pipeline_named
from agent.conversation.reply import Playout, Reply, ReplyConfig
from agent.tracing.trace import Ev, Stage, Tracer
from tts.base import AudioChunk
from doubles import ScriptedLLM, ToneVoice
from helpers import await_until


pytestmark = pytest.mark.usefixtures("virtual_clock")


class Far:
    """A far end that records what it was sent, and plays instantly (no marks)."""

    reports_playout = False

    def __init__(self):
        self.audio, self.cleared = [], 0

    async def send_audio(self, chunk):
        self.audio.append(chunk)

    async def clear(self):
        self.cleared += 1

    async def send_event(self, event):
        pass


class Hooks:
    def __init__(self):
        self.audible = self.finished = 0
        self.failed: list[BaseException] = []
        self.sent: list = []

    async def send(self, event):
        self.sent.append(event)

    async def reply_audible(self, reply):
        self.audible += 1

    async def reply_finished(self, reply):
        self.finished += 1

    async def reply_failed(self, reply, error):
        self.failed.append(error)


def make(llm, mode="concurrent", speculative=False, tracer=None, **kw):
    far, hooks = Far(), Hooks()
    ids = itertools.count()
    reply = Reply(UserTurn(index=0, user_text="q"), [{"role": "user", "content": "q"}], llm=llm, tts=ToneVoice(),
                  transport=far, config=ReplyConfig(pipeline_named(mode), playout_lead_s=0.05), tracer=tracer if tracer is not None else Tracer("r"),
                  new_chunk_id=lambda: next(ids), hooks=hooks, speculative=speculative, **kw)
    return reply, far, hooks


async def test_a_cancelled_reply_stops_its_llm_within_one_token():
    llm = ScriptedLLM(" ".join(f"w{i}" for i in range(200)), token_s=0.02)
    reply, far, hooks = make(llm)
    reply.start()
    assert await await_until(lambda: len(reply.progress.tokens) >= 5, timeout=5)
    await reply.cancel()
    n = len(reply.progress.tokens)
    await asyncio.sleep(0.1)  # five more token times: none may come
    assert len(reply.progress.tokens) == n and llm.cancelled == 1
    assert not reply.running and hooks.finished == 0


async def test_a_speculative_reply_holds_its_audio_until_committed():
    reply, far, hooks = make(ScriptedLLM("Four legs, as all spiders have eight."), speculative=True)
    reply.start()
    assert await await_until(lambda: reply.progress.tts_first_chunk > 0, timeout=5)
    await asyncio.sleep(0.05)
    assert far.audio == [] and hooks.audible == 0, "nothing is heard before the commit"
    reply.commit(UserTurn(index=3, speech_end=1.0, endpoint=1.2, asr_final=1.3, user_text="q"))
    await asyncio.wait_for(reply.task, 10)
    assert far.audio and hooks.audible == 1 and hooks.finished == 1
    assert reply.spoken == reply.progress.reply_text == "Four legs, as all spiders have eight."
    row = reply.row()  # the turn it was committed to, with what the reply did
    assert (row.index, row.speech_end, row.asr_final, row.user_text, row.speculative) == (3, 1.0, 1.3, "q", True)
    assert row.reply_text == reply.spoken and row.tokens == tuple(reply.progress.tokens) and row.first_audio_out


async def test_waterfall_runs_the_stages_one_after_another():
    tracer = Tracer("w")
    reply, far, hooks = make(ScriptedLLM("One two three. Four five six."), mode="waterfall", tracer=tracer)
    await asyncio.wait_for(reply.start().task, 10)
    evs = [(e.stage, e.name) for e in tracer.events()]
    assert evs.index((Stage.LLM, Ev.DONE)) < evs.index((Stage.TTS, Ev.REQUEST))
    assert evs.index((Stage.TTS, Ev.DONE)) < evs.index((Stage.TRANSPORT, Ev.SEND_AUDIO))
    assert " ".join(c.text for c in far.audio).split() == "One two three. Four five six.".split()


async def test_a_fixed_text_reply_speaks_it_without_the_llm():
    llm = ScriptedLLM("never")
    reply, far, hooks = make(llm, fixed_text="Hello there, welcome.")
    await asyncio.wait_for(reply.start().task, 10)
    assert llm.requests == [] and reply.spoken == "Hello there, welcome."


async def test_a_failing_model_is_reported_not_raised():
    class Broken(ScriptedLLM):
        async def stream(self, messages, max_tokens=None):
            yield "Hi"
            raise ConnectionError("LLM server gone")

    reply, far, hooks = make(Broken())
    await asyncio.wait_for(reply.start().task, 10)
    assert [str(e) for e in hooks.failed] == ["LLM server gone"]


async def test_a_paused_reply_sends_nothing_then_resumes_at_the_sample_it_stopped():
    text = "Once upon a time there was a small fox who lived in a quiet wood by the river."
    reply, far, hooks = make(ScriptedLLM(text))
    reply.start()
    assert await await_until(lambda: len(far.audio) >= 6, timeout=5)
    assert await reply.pause()
    sent, at = len(far.audio), reply.playout.clock()
    heard = reply.playout.heard_text()
    assert heard and text.startswith(heard), "what was heard at the pause is the reply's first words"
    await asyncio.sleep(0.2)  # two pieces' time: none may go out, the LLM is not read
    assert len(far.audio) == sent and reply.playout.clock() == at and hooks.finished == 0
    assert reply.resume() == at  # a far end without marks: where its clock stopped
    await asyncio.wait_for(reply.task, 10)
    before = np.concatenate([c.pcm for c in far.audio[:sent]])
    after = np.concatenate([c.pcm for c in far.audio[sent:]])
    k = round(at * 16000)
    assert k < before.size and k + after.size == round(reply.progress.tts_samples * 16000), "no sample lost or repeated"
    assert np.array_equal(after[:before.size - k], before[k:]), "it went on from the paused sample"
    assert hooks.finished == 1 and reply.spoken == text


async def test_after_the_far_end_ran_dry_the_clock_goes_on_from_the_next_piece():
    """The voice fell behind: the far end played all it had and waits in silence. The next
    piece plays from when it arrives, so the reply is not done until that piece's time has
    come, and its pieces go out paced, not in a burst to catch up with the silence."""
    far, sent_at = Far(), []
    send = far.send_audio

    async def timed(chunk):
        sent_at.append(time.perf_counter())
        await send(chunk)

    far.send_audio = timed
    playout = Playout(far, lead_s=0.05, piece_s=0.1, new_id=itertools.count().__next__)
    tone = np.zeros(3200, np.int16)  # 0.2 s
    await playout.play(AudioChunk(tone, 16000, "one two"))
    await asyncio.sleep(0.5)  # it has played out; 0.3 s of silence follow
    t = time.perf_counter()
    await playout.play(AudioChunk(np.concatenate([tone, tone]), 16000, "three four"))
    await playout.wait_played()
    assert time.perf_counter() - t >= 0.39, "done before the last piece had time to play"
    # four pieces of 0.1 s, at most 0.05 s ahead: the last goes out 0.25 s after the first
    assert len(sent_at) == 6 and sent_at[-1] - sent_at[2] >= 0.24, "its pieces went out in a burst, not paced"
    await playout.close()


async def test_a_resume_in_a_pause_of_the_voice_goes_on_at_the_next_word():
    """Paused between two sentences, the reply goes on with the next one: the rest of the pause
    is not sent again (at most `resume_skip_s` of it), and no word is lost."""
    far = Far()
    playout = Playout(far, lead_s=0.05, piece_s=0.1, new_id=itertools.count().__next__)
    t = np.arange(4800) / 16000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)  # 0.3 s of voice
    gap = np.zeros(4800, np.int16)  # 0.3 s of silence
    await playout.play(AudioChunk(np.concatenate([tone, gap]), 16000, "One two."))
    await playout.play(AudioChunk(np.concatenate([gap[:800], tone]), 16000, "Three."))
    await asyncio.sleep(0.36)  # into the pause after "One two."
    assert await playout.pause()
    sent = len(far.audio)
    at = playout.resume()
    assert 0.3 < at < 0.45
    await playout.wait_played()
    after = np.concatenate([c.pcm for c in far.audio[sent:]])
    first_voice = np.flatnonzero(np.abs(after) > 100)[0]
    assert first_voice <= 16000 * 0.02 + 1, f"{first_voice / 16:.0f} ms of the pause sent again"
    assert np.count_nonzero(np.abs(after) > 100) == np.count_nonzero(np.abs(tone) > 100), "a word was lost"
    assert playout.heard_text() == "One two. Three."
    # a pause longer than `resume_skip_s` is shortened by that much, not skipped whole
    far = Far()
    playout = Playout(far, lead_s=0.05, piece_s=0.1, new_id=itertools.count().__next__, resume_skip_s=0.1)
    await playout.play(AudioChunk(np.concatenate([tone, gap, tone]), 16000, "One. Two."))
    await asyncio.sleep(0.32)
    await playout.pause()
    sent = len(far.audio)
    at = playout.resume()
    await playout.wait_played()
    after = np.concatenate([c.pcm for c in far.audio[sent:]])
    assert abs(np.flatnonzero(np.abs(after) > 100)[0] / 16000 - (0.6 - at - 0.1)) < 0.011
    await playout.close()


async def test_the_voice_makes_the_next_chunk_while_the_last_one_plays():
    """`play` returns while the chunk is still being sent (at most `queue_s` of it waits), so
    the synthesis of the next chunk overlaps its playout instead of following it."""
    far = Far()
    playout = Playout(far, lead_s=0.05, piece_s=0.1, new_id=itertools.count().__next__, queue_s=0.3)
    t = time.perf_counter()
    await playout.play(AudioChunk(np.zeros(16000, np.int16), 16000, "a second of words"))
    back = time.perf_counter() - t
    assert back >= 0.5, f"play returned after {back:.2f} s, before 0.7 s of the chunk was sent"
    assert sum(c.pcm.size for c in far.audio) < 16000, "it returned before the chunk was all sent"
    await playout.wait_played()
    assert sum(c.pcm.size for c in far.audio) == 16000
    await playout.close()


async def test_a_paused_reply_gives_a_one_context_model_to_other_replies_then_goes_on():
    from doubles import OneContextLLM

    story = "Once upon a time there was a fox who lived by a river and watched the fish every day."
    llm = OneContextLLM(lambda user: story if user == "q" else "Other answer.", token_s=0.02)
    first, far, hooks = make(llm)
    first.start()
    assert await await_until(lambda: len(first.progress.tokens) >= 3, 5)
    await first.pause()  # the user speaks over it; words will tell whether to cut or resume
    # another conversation's reply on the same model
    other, _, other_hooks = make(llm)
    other.messages = [{"role": "user", "content": "other"}]
    t = time.perf_counter()
    other.start()
    assert await await_until(lambda: other.progress.tokens, 5), "the paused reply kept the model"
    assert time.perf_counter() - t < 1.0
    await asyncio.wait_for(other.task, 10)
    first.resume()
    await asyncio.wait_for(first.task, 20)
    assert first.progress.reply_text == story, "resumed, it went on from its first words"
    assert len(llm.prefixes) == 3 and llm.prefixes[0] == "" and story.startswith(llm.prefixes[2])
    assert llm.prefixes[2] and hooks.finished == 1 and other_hooks.finished == 1
