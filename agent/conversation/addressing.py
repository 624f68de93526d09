"""Whom words over the bot are said to: the bot, or someone else in the room ("Honey, can you
grab my keys?"), which must not cut the reply. Only the words' opening tells, so the rule is
narrow: an opening a recognizer makes up when it mishears the start of "Stop, stop." ("Chuck,
wait a moment", "Tots, top way to ...") must never pass for calling someone else, or the bot
would talk on over a user who asked it to stop.

- The opening before the first comma is one word (a greeting may go before it): a role
  (`VOCATIVES`), or a first name (`FIRST_NAMES`) that is not one of the bot's own names.
  Whisper capitalises the first word of any sentence, so a capital letter alone is no name.
- Words that ask the bot to stop or wait (`HOLD_WORDS`) anywhere in the utterance make it
  the bot's, whoever it opens by calling.
- A partial's words come without the comma ("Babe did you lock"): words that open with a role
  or a name (`may_call_someone`) wait for the decode that punctuates them before they cut.
"""
from __future__ import annotations

import re

# words that call someone by a role rather than a name; "hey" and the like may go before them
VOCATIVES = frozenset("""honey hon sweetie sweetheart babe baby darling dear love mom mum mommy mama dad daddy papa
    grandma grandpa granny kids guys buddy son sis bro auntie uncle""".split())

# common English first names and their short forms: an opening word that calls someone
FIRST_NAMES = frozenset("""
    aaron abby abigail adam adrian aiden alan alex alexa alexander alice alicia allison amanda amber amelia amy
    andrea andrew andy angela anna anne annie anthony ashley audrey austin ava barbara ben benjamin beth betty
    bill billy blake bob bobby brad brandon brenda brian brittany brooke bruce caleb cameron carl carla carlos
    carol caroline carter catherine charles charlie charlotte chloe chris christian christina christine
    christopher claire cody colin connor craig crystal cynthia dan daniel danielle danny david dean debbie
    deborah dennis derek diana diane donald donna dorothy doug dylan ed eddie edward elena eli elijah elizabeth
    ella ellie emily emma eric erica erin ethan eva evan evelyn frank gabriel gary george grace greg gregory
    hannah harry heather helen henry holly ian isaac isabella jack jackson jacob jake james jamie jane janet
    jason jeff jeffrey jen jenna jennifer jenny jeremy jerry jess jessica jim jimmy joan joe joel john johnny
    jon jonathan jordan jose joseph josh joshua joyce juan judy julia julie justin karen kate katie kayla keith
    kelly ken kenneth kevin kim kyle larry laura lauren leah lee leo liam lily linda lisa liz logan louis lucas
    lucy luke madison maggie marcus margaret maria marie mark martha martin mary mason matt matthew max megan
    melissa mia michael michelle mike molly nancy natalie nathan nick nicole noah nora olivia oliver owen pam
    pat patricia patrick paul peter phil philip rachel ralph randy rebecca richard rick rob robert robin ron
    ronald rose ruby russell ruth ryan sam samantha samuel sandra sara sarah scott sean sharon sophia sophie
    stephanie stephen steve steven sue susan tara ted teresa terry theo thomas tim timothy tina todd tom tommy
    tony tracy tyler valerie vanessa victoria vincent walter wayne will william zach zoe""".split())

# words that ask the one speaking to stop or wait: said over the bot, they are for the bot
HOLD_WORDS = re.compile(r"\b(?:stop|wait|hold on|hang on|pause|quiet|enough|shut up)\b", re.IGNORECASE)

_GREETINGS = ("hey", "hi", "oh", "hello", "okay", "ok")


def _calls(word: str, own_names: tuple[str, ...]) -> bool:
    return word not in own_names and (word in VOCATIVES or word in FIRST_NAMES)


def _words(text: str) -> list[str]:
    return [re.sub(r"[^\w']", "", w).lower() for w in text.split()]


def may_call_someone(text: str, own_names: tuple[str, ...] = ()) -> bool:
    """Unpunctuated words (a partial's) that open with a role or a name other than the bot's,
    after a greeting or not, and ask nothing to stop: side talk, perhaps, once punctuated. Every
    utterance `addressed_elsewhere` is one of these."""
    if HOLD_WORDS.search(text):
        return False
    words = _words(text)
    if words and words[0] in _GREETINGS:
        words = words[1:]
    return bool(words) and _calls(words[0], own_names)


def addressed_elsewhere(text: str, own_names: tuple[str, ...] = ()) -> bool:
    """The utterance opens by calling someone other than the bot ("Honey, can you ...", "Tom,
    please ...", "Hey Jenny, ...") and does not ask it to stop or wait (module docstring);
    `own_names` (lowercase) are the bot's."""
    if HOLD_WORDS.search(text):
        return False
    head, comma, _ = text.strip().partition(",")
    words = _words(head)
    if not comma or not words:
        return False
    if len(words) == 2 and words[0] in _GREETINGS:
        words = words[1:]
    return len(words) == 1 and _calls(words[0], own_names)
