"""Whether a server takes one more conversation, and why not: one object per process, shared by
every route and port that starts conversations, read by `/readyz`. Reasons to refuse, in order:
a drain (the server is shutting down), the hard cap, and a measured load (a `LoadGate`, kept by
the caller: this module measures nothing)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class LoadGate(Protocol):
    def reason(self, live: int) -> str | None:
        """Why the load refuses one more conversation beside `live` ones, or None."""

    def admitted(self) -> None:
        """A conversation was let in (its load is not measurable yet)."""


class Admission:
    def __init__(self, max_sessions: int = 16, on_refused: Callable[[str], None] | None = None,
                 load: LoadGate | None = None):
        self.max_sessions = max_sessions
        self.live = 0
        self.draining = False
        self._load = load
        self._on_refused = on_refused  # a refusal is counted where metrics are kept (agent)

    @property
    def full(self) -> bool:
        return self.live >= self.max_sessions

    @property
    def reason(self) -> str | None:
        """Why a new conversation would be refused now; None while admitting."""
        if self.draining:
            return "draining: the server is shutting down"
        if self.full:
            return f"full: {self.live} of {self.max_sessions} conversations are live"
        if self._load is not None:
            return self._load.reason(self.live)
        return None

    @property
    def admitting(self) -> bool:
        return self.reason is None

    def drain(self) -> None:
        """Admit nothing more, for good (`/readyz` turns 503 at once)."""
        self.draining = True

    def refuse(self) -> str | None:
        """Check one conversation that asks to start: the reason it is refused (and counted as
        refused), or None to let it start."""
        reason = self.reason
        if reason is not None and self._on_refused is not None:
            self._on_refused(reason)
        return reason

    def enter(self) -> str | None:
        """A conversation starts: counted live unless refused (then the reason, as `refuse`).
        Checked again here because handshakes in flight at once all passed the earlier check."""
        reason = self.refuse()
        if reason is None:
            self.live += 1
            if self._load is not None:
                self._load.admitted()
        return reason

    def leave(self) -> None:
        self.live -= 1
