"""How the bot treats speech over its reply: the trade-off between a responsive bot that stops for
anything and a floor-holding one that talks through more than it should. A style sets the turn
machine's overlap settings (agent/conversation/turns.py, `TurnConfig`) and nothing else;
`duplex serve --overlap NAME` picks one, `duplex bench overlap` measures them.

- `responsive`: any speech over the bot pauses it (0.1 s of it), and only a final with no words
  resumes it: every "yeah" and every voice across the room costs seconds of silence, and a "yeah"
  or an "okay" starts a new reply (the behaviour before overlaps were told apart).
- `balanced` (the default): speech far below the user's own level (a TV, a voice across the
  room, the echo) neither pauses nor cuts the bot, nor is it a turn when it goes on after the
  reply has ended; backchannel words do not cut it, nor words
  that open by calling someone else ("Honey, ..."); the words of speech over it are looked at
  while it is said (from 0.3 s on), and a backchannel, a hum or words calling someone else let
  it go on at once, as does speech quieter and more reverberant than the user's own turns (said
  to someone else in the room, agent/conversation/turned_away.py); speech over it that is brief (0.2-0.8 s) lets
  it go on 0.45 s after it ends if its words are not known by then (they still cut the reply if
  they interrupt).
- `floor-holding`: as balanced, but the bot only yields to 0.5 s of speech (LiveKit's
  `min_interruption_duration`), and goes on after up to 1.5 s of it: a long "mm-hmm" does not stop
  it, but nor does the start of a real interruption for half a second.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from agent.conversation.turned_away import TurnedAway
from agent.conversation.turns import BACKCHANNELS, TurnConfig


@dataclass(frozen=True)
class OverlapStyle:
    name: str
    barge_in_min_speech_s: float  # speech over the bot that pauses it
    brief_overlap_s: tuple[float, float] | None  # speech over it this long lets it go on as it ends
    backchannels: tuple[str, ...]  # words that never cut it
    echo_level_db: float | None  # speech this far below the user's level is not theirs
    side_talk: bool  # words that open by calling someone else never cut it
    look_over_s: float | None  # speech over it this long is looked at while said: it may go on before its end
    turned_away: TurnedAway | None  # speech over it quieter and more reverberant than the user's is side talk

    def apply(self, turns: TurnConfig) -> TurnConfig:
        return replace(turns, barge_in_min_speech_s=self.barge_in_min_speech_s,
                       brief_overlap_s=self.brief_overlap_s, backchannels=self.backchannels,
                       echo_level_db=self.echo_level_db, side_talk=self.side_talk, look_over_s=self.look_over_s,
                       turned_away=self.turned_away)


RESPONSIVE = OverlapStyle("responsive", 0.1, None, (), None, False, None, None)
BALANCED = OverlapStyle("balanced", 0.1, (0.2, 0.8), BACKCHANNELS, -12.0, True, 0.3, TurnedAway())
FLOOR_HOLDING = OverlapStyle("floor-holding", 0.5, (0.2, 1.5), BACKCHANNELS, -12.0, True, 0.3, TurnedAway())
STYLES = {s.name: s for s in (RESPONSIVE, BALANCED, FLOOR_HOLDING)}
DEFAULT_STYLE = BALANCED.name
