"""agent.conversation.weak: a part's callback into its owner does not keep the owner alive."""
import asyncio
import gc

from agent.conversation.weak import weak_async, weak_call


class Owner:
    def __init__(self):
        self.seen = []

    def note(self, x):
        self.seen.append(x)
        return x

    async def heard(self, x):
        await asyncio.sleep(0)
        self.seen.append(x)
        return x


def test_a_weak_call_reaches_its_owner_while_it_lives_and_nothing_after():
    owner = Owner()
    note, seen = weak_call(owner.note), owner.seen
    assert note(1) == 1 and seen == [1]
    del owner  # reference counting frees it: the callback held it weakly
    assert note(2) is None and seen == [1]


def test_a_weak_async_call_is_awaited_as_the_method_and_does_nothing_once_the_owner_is_gone():
    owner = Owner()
    heard, seen = weak_async(owner.heard), owner.seen
    gc.disable()
    try:
        assert asyncio.run(heard("a")) == "a" and seen == ["a"]
        del owner
        assert asyncio.run(heard("b")) is None and seen == ["a"]
    finally:
        gc.enable()
