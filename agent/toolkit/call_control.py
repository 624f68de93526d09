"""Call control as ordinary tools an agent may include.

`end_call`: the model calls it when the caller is done; the reply says its goodbye, and the call
ends once the far end has played the goodbye to its end (agent/conversation/session.py `_end_call_after`),
on every transport: the page is told `call_ended`, a phone stream is closed by its route,
AudioSocket hangs up. A barge-in over the goodbye cancels the ending: the call goes on.

Transfers: no media stream we speak can transfer a call by itself (Twilio's, Telnyx's, Plivo's,
Vonage's and Exotel's streams carry audio only; AudioSocket too). The carrier's call-control API
does it: with Twilio, update the live call with TwiML `<Dial>` through its REST API, which ends
the media stream. `transfer_tool(fn)` makes such a function a tool the model can call.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from agent.toolkit.tools import FunctionTool, RunContext, build_tool, function_tool


@function_tool
async def end_call(ctx: RunContext) -> str:
    """End the phone call. Call it when the user says goodbye or asks to hang up."""
    ctx.end_call()
    return "The call ends after this reply. Say a short goodbye."


def transfer_tool(transfer: Callable[[str], Awaitable[str]], description: str | None = None) -> FunctionTool:
    """A `transfer(destination)` tool over the integrator's own `transfer` (a carrier API call);
    not interruptible: a transfer half made is worse than one the caller talked over."""
    async def transfer_call(destination: str, ctx: RunContext) -> str:
        result = await transfer(destination)
        ctx.end_call()  # the carrier takes the call away from this stream
        return result or "transferring"

    return build_tool(transfer_call, description=description or "Transfer the call to a person or department.",
                      interruptible=False)
