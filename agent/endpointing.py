"""End-of-turn policies as pure functions: what is known about the current silence in, the
seconds of silence after which the turn ends out. No models, no I/O, no clock.

`TurnMachine` (agent/turns.py) keeps the features of the current silence and asks
`required_silence` at each VAD frame and at each new verdict; the turn ends once Silero's
silence reaches the answer. `duplex bench turns` (agent/bench_turns.py) measured them.

Features (`Features`), each None until it is known for this silence:
- `audio_p`: smart-turn's probability that the turn is complete (agent/eou.py);
- `text_complete`: the transcript at the pause ends a sentence (Whisper punctuates);
- `text_p`: the probability of the chat model's end-of-message token right after the user's
  transcript (`TextTurnScorer` in agent/eou.py: LiveKit's text turn detector, with the
  embedded GGUF).

Policies (`TurnConfig.endpointing`):
- "rules" (the first baseline, the default before "combined"): smart-turn >= `eou_threshold` ends the turn at the pause;
  else a transcript that ends a sentence after `endpoint_silence_s`; else `max_endpoint_s`.
  `TurnMachine` keeps its own code for it; `rules_silence` is the same rule as a function, for
  the benchmark's description and the tests.
- "smart-turn" (smart-turn alone, the benchmark's second baseline): smart-turn >=
  `eou_threshold` at the pause, else `max_endpoint_s`.
- "combined" (`DEFAULT_POLICY`): one probability from both models, and a wait that shrinks as it
  grows; see `combined_silence`. Without a text model (`--no-eou`, or an end-of-turn object
  with no `text_probability`) the listener uses the rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("rules", "smart-turn", "combined")
DEFAULT_POLICY = "combined"  # the fewest cut-offs, and the quickest turn ends (`duplex bench turns`)


@dataclass(frozen=True)
class Features:
    audio_p: float | None = None
    text_complete: bool | None = None
    text_p: float | None = None


def rules_silence(f: Features, pause_s: float, eou_threshold: float, endpoint_silence_s: float,
                  max_endpoint_s: float) -> float:
    """Today's rule as a function (`TurnMachine`'s "rules" path)."""
    if f.audio_p is not None and f.audio_p >= eou_threshold:
        return pause_s
    if f.text_complete:
        return endpoint_silence_s
    return max_endpoint_s


def smart_turn_silence(f: Features, pause_s: float, eou_threshold: float, max_endpoint_s: float) -> float:
    if f.audio_p is not None and f.audio_p >= eou_threshold:
        return pause_s
    return max_endpoint_s


def _logit(p: float) -> float:
    p = min(max(p, 1e-15), 1 - 1e-15)  # the text model's probabilities go down to 1e-12
    return math.log(p / (1 - p))


def combined_probability(f: Features, text_weight: float, text_bias: float) -> float | None:
    """P(done) from the audio score and the text score: their logits added, the text's scaled by
    `text_weight` and shifted by `text_bias` (the chat model's end-of-message probability is
    calibrated for chat, not for turns: unpunctuated complete requests score 1e-3-1e-6, cut
    fragments 1e-9-1e-10). None when neither is known."""
    if f.audio_p is None and f.text_p is None:
        return None
    z = 0.0
    if f.audio_p is not None:
        z += _logit(f.audio_p)
    if f.text_p is not None:
        z += text_weight * (_logit(f.text_p) + text_bias)
    return 1.0 / (1.0 + math.exp(-z))


def combined_silence(f: Features, threshold: float, min_wait_s: float, max_wait_s: float,
                     text_weight: float, text_bias: float, punctuation_wait_s: float | None = None,
                     needs_text: bool = False) -> float:
    """The new policy. With p = `combined_probability`: p >= `threshold` ends the turn after
    `min_wait_s` of silence; below it the wait grows linearly in (threshold - p) / threshold up
    to `max_wait_s` at p = 0. With no score yet it is `max_wait_s` (a later verdict shortens it).
    `punctuation_wait_s`: a transcript ending a sentence caps the wait at this (None: no cap).
    `needs_text`: no decision before the text score is known (smart-turn alone calls many cut
    fragments complete: "Can you explain how" 0.98 in flite's and Piper's voices)."""
    if needs_text and f.text_p is None:
        return max_wait_s
    p = combined_probability(f, text_weight, text_bias)
    wait = max_wait_s
    if p is not None:
        wait = min_wait_s if p >= threshold else min_wait_s + (max_wait_s - min_wait_s) * (threshold - p) / threshold
    if punctuation_wait_s is not None and f.text_complete:
        wait = min(wait, punctuation_wait_s)
    return wait
