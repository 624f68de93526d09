"""Turns made up for the trace tools' tests and demos: a tracer filled with the events of
`n_turns` plausible turns (speculative, barged in, with the client's playout and memory
samples), without models or audio."""
from __future__ import annotations

from collections.abc import Sequence


from agent.tracing.trace import Ev, Stage, Tracer

CHUNK = 8000  # samples in a made-up TTS chunk (PCM16: twice as many bytes sent)
VOICE_RATE = 2 * CHUNK  # a chunk is half a second of speech


def simulate_turns(
    tracer: Tracer,
    n_turns: int = 5,
    *,
    seed: int = 0,
    start_ns: int = 1_000_000_000,
    speculative_turns: Sequence[int] = (),
    barge_in_turns: Sequence[int] = (),
    explicit_flow_turns: Sequence[int] = (),
    client: bool = True,
    memory: bool = True,
) -> int:
    """Record a plausible synthetic conversation into ``tracer`` (for tests and
    demos), with explicit timestamps; returns the end time (ns).

    Per turn: sampled audio frames, VAD transitions, ASR step spans and
    partials/final, end-of-turn, LLM request/first token/tokens/done, TTS
    request/chunks, transport sends, client playout.  In ``speculative_turns``
    the LLM starts on a stable partial before the endpoint (a first branch is
    cancelled, the second committed).  ``explicit_flow_turns`` pass ``flow=``.
    """
    import random

    rng = random.Random(seed)
    MS = 1_000_000
    t = start_ns
    tr = tracer
    for turn in range(1, n_turns + 1):
        flow = turn if turn in explicit_flow_turns else None
        speech = rng.randint(800, 2000) * MS
        ts = t
        tr.instant(Stage.VAD, Ev.SPEECH, turn, ts_ns=ts)
        tr.instant(Stage.TURN, Ev.USER_SPEECH_START, turn, ts_ns=ts)
        step = 80 * MS
        k = 0
        last_partial = None
        while ts + (k + 1) * step <= t + speech + 160 * MS:
            s0 = ts + k * step
            tr.complete(Stage.ASR, Ev.STEP, s0 + 2 * MS, rng.randint(8, 20) * MS, turn, audio_s=0.08)
            if k % 2 == 1 and s0 < t + speech:
                last_partial = s0 + 20 * MS
                tr.instant(Stage.ASR, Ev.PARTIAL, turn, ts_ns=last_partial, text=f"w{k}")
            if k % 2 == 0:
                tr.instant(Stage.AUDIO_IN, Ev.FRAME, turn, ts_ns=s0, n=k)
            k += 1
        end = t + speech
        tr.instant(Stage.TURN, Ev.USER_SPEECH_END, turn, ts_ns=end)
        tr.instant(Stage.VAD, Ev.SILENCE, turn, ts_ns=end + 60 * MS)
        endpoint = end + rng.randint(150, 400) * MS
        final = endpoint + rng.randint(10, 120) * MS  # recognizer flushed at the endpoint
        if turn in speculative_turns:
            # branch 1 cancelled, branch 2 (from the last partial) committed
            sp1 = (last_partial or end) - 200 * MS
            tr.instant(Stage.SPECULATION, Ev.START, turn, ts_ns=sp1, branch=1)
            tr.instant(Stage.LLM, Ev.REQUEST, turn, ts_ns=sp1 + MS, branch=1)
            tr.instant(Stage.LLM, Ev.FIRST_TOKEN, turn, ts_ns=sp1 + 150 * MS, branch=1)
            tr.instant(Stage.LLM, Ev.CANCEL, turn, ts_ns=sp1 + 190 * MS, branch=1)
            tr.instant(Stage.SPECULATION, Ev.CANCEL, turn, ts_ns=sp1 + 190 * MS, branch=1)
            req = end + 20 * MS
            tr.instant(Stage.SPECULATION, Ev.START, turn, ts_ns=req - MS, branch=2)
        else:
            req = max(final, endpoint) + 2 * MS
        tr.instant(Stage.ASR, Ev.FINAL, turn, ts_ns=final, flow=flow, text="hello there")
        tr.instant(Stage.TURN, Ev.ENDPOINT, turn, ts_ns=endpoint, prob=0.9)
        if turn in speculative_turns:
            tr.instant(Stage.SPECULATION, Ev.COMMIT, turn, ts_ns=endpoint + MS, branch=2)
        tr.instant(Stage.LLM, Ev.REQUEST, turn, ts_ns=req, flow=flow, model="smollm2")
        ft = req + rng.randint(120, 300) * MS
        tr.instant(Stage.LLM, Ev.FIRST_TOKEN, turn, ts_ns=ft, flow=flow)
        n_tok = rng.randint(15, 30)
        tok_t = ft
        for i in range(n_tok):
            tok_t = ft + i * 20 * MS
            tr.instant(Stage.LLM, Ev.TOKEN, turn, ts_ns=tok_t, text=f"t{i}")
        tr.instant(Stage.LLM, Ev.DONE, turn, ts_ns=tok_t + 5 * MS, tokens=n_tok)
        treq = ft + 5 * 20 * MS
        tr.instant(Stage.TTS, Ev.REQUEST, turn, ts_ns=treq, flow=flow, text="Hello, how can I help?")
        fc = treq + rng.randint(60, 150) * MS
        tr.complete(Stage.TTS, Ev.SYNTH, treq + MS, fc - treq - MS, turn, samples=CHUNK, sample_rate=VOICE_RATE)
        tr.instant(Stage.TTS, Ev.FIRST_CHUNK, turn, ts_ns=fc)
        send = fc + rng.randint(1, 5) * MS
        n_chunks = 4
        for c in range(n_chunks):
            ct = fc + c * 250 * MS
            if c:
                tr.complete(Stage.TTS, Ev.SYNTH, ct - 100 * MS, 90 * MS, turn, samples=CHUNK,
                            sample_rate=VOICE_RATE)
            tr.instant(Stage.TTS, Ev.CHUNK, turn, ts_ns=ct, samples=CHUNK, text=f"c{c}")
            tr.instant(Stage.TRANSPORT, Ev.SEND_AUDIO, turn, ts_ns=send + c * 250 * MS,
                       flow=flow if c == 0 else None, bytes=2 * CHUNK)
        tr.instant(Stage.TTS, Ev.DONE, turn, ts_ns=fc + (n_chunks - 1) * 250 * MS + MS)
        if turn in barge_in_turns:
            b = send + 400 * MS
            tr.instant(Stage.TURN, Ev.BARGE_IN, turn, ts_ns=b)
            tr.instant(Stage.TRANSPORT, Ev.CLEAR, turn, ts_ns=b + MS)
            tr.instant(Stage.TTS, Ev.CANCEL, turn, ts_ns=b + MS)
        play = send + rng.randint(20, 80) * MS
        if client:
            tr.instant(Stage.CLIENT, Ev.PLAYOUT_START, turn, ts_ns=play, flow=flow)
            tr.instant(Stage.CLIENT, Ev.PLAYOUT_END, turn, ts_ns=play + n_chunks * 500 * MS)
        t_end = play + n_chunks * 500 * MS + 10 * MS
        tr.instant(Stage.TURN, Ev.TURN_END, turn, ts_ns=t_end)
        if memory:
            tr.counter(Ev.RSS_MB, 300.0 + turn * 0.5, ts_ns=t_end)
        t = t_end + rng.randint(300, 1500) * MS
    return t


# ----------------------------------------------------------------------- CLI
