"""Whether a server takes one more conversation, and why not: one object per process, shared by
every route and port that starts conversations, read by `/readyz`. The hard cap is the first
reason to refuse; a drain on shutdown or a measured load will be more reasons here."""
from __future__ import annotations

from collections.abc import Callable


class Admission:
    def __init__(self, max_sessions: int = 16, on_refused: Callable[[str], None] | None = None):
        self.max_sessions = max_sessions
        self.live = 0
        self._on_refused = on_refused  # a refusal is counted where metrics are kept (agent)

    @property
    def full(self) -> bool:
        return self.live >= self.max_sessions

    @property
    def reason(self) -> str | None:
        """Why a new conversation would be refused now; None while admitting."""
        if self.full:
            return f"full: {self.live} of {self.max_sessions} conversations are live"
        return None

    @property
    def admitting(self) -> bool:
        return self.reason is None

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
        return reason

    def leave(self) -> None:
        self.live -= 1
